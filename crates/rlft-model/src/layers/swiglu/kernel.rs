//! `silu(g) · u` and its gradients on f32 slices, one pass each way.
//!
//! The exponential is a polynomial written in plain arithmetic (no libm call), so each loop
//! compiles to vector code; x86-64 builds carry AVX-512 and AVX2 copies chosen at run time.
//! Large slices are split into fixed chunks over rayon's pool: every element is computed the
//! same way whatever the split, so the results do not depend on the thread count.

use rayon::prelude::*;

/// Elements per parallel chunk; slices up to this size run on the calling thread.
const CHUNK: usize = 1 << 14;

const LOG2_E: f32 = std::f32::consts::LOG2_E;
/// `ln 2` split in two (Cody–Waite), so `x − n·ln 2` keeps its low bits.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// `1.5 · 2²³`: adding it rounds to the nearest integer, which then sits in the low mantissa bits.
const ROUND: f32 = 12_582_912.0;

/// `eˣ` to about one ulp for `x` in `[-87, 88]` (clamped outside).
#[inline(always)]
fn exp(x: f32) -> f32 {
    let x = x.clamp(-87.0, 88.0);
    let t = x * LOG2_E + ROUND;
    let n = t - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_2e-4;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 0.166_666_65;
    p = p * r + 0.5;
    let e = p * r * r + r + 1.0;
    // `t`'s bits are `ROUND`'s plus `n`: rebuild `2ⁿ` from them.
    let n = t.to_bits().wrapping_sub(ROUND.to_bits()) as i32;
    e * f32::from_bits(((n + 127) as u32) << 23)
}

#[inline(always)]
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

#[inline(always)]
fn forward_body(g: &[f32], u: &[f32], out: &mut [f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(g).zip(u) {
        *o = g * sigmoid(g) * u;
    }
}

/// `d/dg [g·σ(g)] = σ + g·σ·(1 − σ)`.
#[inline(always)]
fn backward_body(g: &[f32], u: &[f32], dy: &[f32], dg: &mut [f32], du: &mut [f32]) {
    let outs = dg.iter_mut().zip(du.iter_mut());
    for (((dg, du), &g), (&u, &dy)) in outs.zip(g).zip(u.iter().zip(dy)) {
        let s = sigmoid(g);
        let gs = g * s;
        *du = dy * gs;
        *dg = dy * u * (s + gs * (1.0 - s));
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The bodies above, compiled for wider vector units.

    #[target_feature(enable = "avx512f")]
    pub(super) fn forward_avx512(g: &[f32], u: &[f32], out: &mut [f32]) {
        super::forward_body(g, u, out)
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn forward_avx2(g: &[f32], u: &[f32], out: &mut [f32]) {
        super::forward_body(g, u, out)
    }

    #[target_feature(enable = "avx512f")]
    pub(super) fn backward_avx512(
        g: &[f32],
        u: &[f32],
        dy: &[f32],
        dg: &mut [f32],
        du: &mut [f32],
    ) {
        super::backward_body(g, u, dy, dg, du)
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn backward_avx2(g: &[f32], u: &[f32], dy: &[f32], dg: &mut [f32], du: &mut [f32]) {
        super::backward_body(g, u, dy, dg, du)
    }
}

/// The widest vector unit this CPU has, of those the kernels are compiled for.
#[derive(Clone, Copy)]
enum Isa {
    #[cfg(target_arch = "x86_64")]
    Avx512,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    Base,
}

impl Isa {
    fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return Isa::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return Isa::Avx2;
            }
        }
        Isa::Base
    }

    fn forward(self, g: &[f32], u: &[f32], out: &mut [f32]) {
        match self {
            // SAFETY: `detect` saw the feature on this CPU.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => unsafe { x86::forward_avx512(g, u, out) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { x86::forward_avx2(g, u, out) },
            Isa::Base => forward_body(g, u, out),
        }
    }

    fn backward(self, g: &[f32], u: &[f32], dy: &[f32], dg: &mut [f32], du: &mut [f32]) {
        match self {
            // SAFETY: `detect` saw the feature on this CPU.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => unsafe { x86::backward_avx512(g, u, dy, dg, du) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { x86::backward_avx2(g, u, dy, dg, du) },
            Isa::Base => backward_body(g, u, dy, dg, du),
        }
    }
}

/// `silu(g) · u`, element by element.
///
/// # Panics
/// If the slices differ in length (a caller's bug: the tensor op checks shapes first).
pub fn forward(g: &[f32], u: &[f32]) -> Vec<f32> {
    assert_eq!(g.len(), u.len(), "silu_mul: gate and up differ in length");
    let isa = Isa::detect();
    let mut out = vec![0.0; g.len()];
    if g.len() <= CHUNK {
        isa.forward(g, u, &mut out);
    } else {
        out.par_chunks_mut(CHUNK)
            .zip(g.par_chunks(CHUNK).zip(u.par_chunks(CHUNK)))
            .for_each(|(o, (g, u))| isa.forward(g, u, o));
    }
    out
}

/// The gradients `(∂L/∂g, ∂L/∂u)` of `silu(g) · u` given `dy = ∂L/∂out`.
///
/// # Panics
/// If the slices differ in length.
pub fn backward(g: &[f32], u: &[f32], dy: &[f32]) -> (Vec<f32>, Vec<f32>) {
    assert!(
        g.len() == u.len() && g.len() == dy.len(),
        "silu_mul backward: gate, up and gradient differ in length"
    );
    let isa = Isa::detect();
    let (mut dg, mut du) = (vec![0.0; g.len()], vec![0.0; g.len()]);
    if g.len() <= CHUNK {
        isa.backward(g, u, dy, &mut dg, &mut du);
    } else {
        let outs = dg.par_chunks_mut(CHUNK).zip(du.par_chunks_mut(CHUNK));
        let ins = g
            .par_chunks(CHUNK)
            .zip(u.par_chunks(CHUNK))
            .zip(dy.par_chunks(CHUNK));
        outs.zip(ins)
            .for_each(|((dg, du), ((g, u), dy))| isa.backward(g, u, dy, dg, du));
    }
    (dg, du)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn silu64(g: f64) -> f64 {
        g / (1.0 + (-g).exp())
    }

    /// Inputs over the range an activation reaches, the clamp edges and beyond included.
    fn inputs(n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let t = i as f32 / n as f32;
                (t - 0.5) * 200.0 * t * t
            })
            .collect()
    }

    #[test]
    fn exp_is_within_two_ulp_of_f64() {
        for i in -87_000..=88_000 {
            let x = i as f32 / 1000.0;
            let want = (x as f64).exp();
            let got = exp(x) as f64;
            assert!(
                (got - want).abs() <= 2.5e-7 * want,
                "exp({x}) = {got}, want {want}"
            );
        }
    }

    #[test]
    fn forward_and_backward_match_f64_on_every_path() {
        // Below and above the parallel chunk size, and not a multiple of a vector's width.
        for n in [37, 3 * CHUNK + 5] {
            let g = inputs(n);
            let u: Vec<f32> = g.iter().map(|x| 0.5 - x / 7.0).collect();
            let dy: Vec<f32> = g.iter().map(|x| (x * 0.3).sin()).collect();
            let out = forward(&g, &u);
            let (dg, du) = backward(&g, &u, &dy);
            for i in 0..n {
                let (g, u, dy) = (g[i] as f64, u[i] as f64, dy[i] as f64);
                let s = 1.0 / (1.0 + (-g).exp());
                let want = [
                    silu64(g) * u,
                    dy * u * (s + g * s * (1.0 - s)),
                    dy * silu64(g),
                ];
                for (got, want) in [out[i], dg[i], du[i]].into_iter().zip(want) {
                    let tol = 1e-6 * (1.0 + want.abs());
                    assert!(
                        (got as f64 - want).abs() <= tol,
                        "{got} vs {want} at g = {g}"
                    );
                }
            }
        }
    }

    #[test]
    fn every_vector_unit_gives_the_same_bits() {
        let g = inputs(1000);
        let u: Vec<f32> = g.iter().map(|x| 1.0 + x).collect();
        let mut want = vec![0.0; g.len()];
        Isa::Base.forward(&g, &u, &mut want);
        let mut got = vec![0.0; g.len()];
        Isa::detect().forward(&g, &u, &mut got);
        assert_eq!(got, want);
    }

    #[test]
    fn nan_propagates() {
        let out = forward(&[f32::NAN, 1.0], &[1.0, f32::NAN]);
        assert!(out[0].is_nan() && out[1].is_nan());
    }
}
