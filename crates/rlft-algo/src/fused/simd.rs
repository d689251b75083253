//! What the fused kernels share: a vectorisable exponential, the choice of vector unit, and the
//! fixed-chunk split over rayon's pool.
//!
//! The kernels are plain Rust loops over slices; [`multiversion!`] compiles each one again for
//! AVX-512 and for AVX2 + FMA, picked at run time. Rust never contracts `a·b + c` into an FMA
//! on its own, so every copy computes the same bits. Sums run in 16 lanes with the lanes added
//! in a fixed order, and a chunk is always whole rows: results do not depend on which copy runs
//! or on the thread count. (The log-softmax takes one `ln` per row from libm, whose own code
//! may differ between CPUs.)

use rayon::prelude::*;

/// Elements per parallel task; inputs up to this size run on the calling thread.
pub(crate) const CHUNK: usize = 1 << 14;

/// Lanes of the lane-wise sums (one AVX-512 register of f32).
pub(crate) const LANES: usize = 16;

const LOG2_E: f32 = std::f32::consts::LOG2_E;
/// `ln 2` split in two (Cody–Waite), so `x − n·ln 2` keeps its low bits.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// `1.5 · 2²³`: adding it rounds to the nearest integer, which then sits in the low mantissa bits.
const ROUND: f32 = 12_582_912.0;
/// Below this `eˣ` is not a normal f32; the kernels return 0 (so `exp(−∞) = 0`).
const EXP_MIN: f32 = -87.33;

/// `eˣ` to about one ulp: 0 below the normal range (−87.33), clamped at 88, NaN kept.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    let c = x.clamp(EXP_MIN, 88.0);
    let t = c * LOG2_E + ROUND;
    let n = t - ROUND;
    let r = c - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_2e-4;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 0.166_666_65;
    p = p * r + 0.5;
    let e = p * r * r + r + 1.0;
    // `t`'s bits are `ROUND`'s plus `n`: rebuild `2ⁿ` from them.
    let n = t.to_bits().wrapping_sub(ROUND.to_bits()) as i32;
    let y = e * f32::from_bits(((n + 127) as u32) << 23);
    if x < EXP_MIN { 0.0 } else { y }
}

/// `max` of a row (−∞ for an empty one), in 16 lanes.
#[inline(always)]
pub(crate) fn row_max(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a = a.max(v);
        }
    }
    let m = acc.iter().fold(f32::NEG_INFINITY, |m, &a| m.max(a));
    tail.iter().fold(m, |m, &v| m.max(v))
}

/// `Σ x`, in 16 lanes added in a fixed order.
#[inline(always)]
pub(crate) fn row_sum(x: &[f32]) -> f32 {
    lanes(
        x.chunks_exact(LANES).map(|c| c.iter().copied()),
        x.chunks_exact(LANES).remainder().iter().copied(),
    )
}

/// `Σ a·b`, likewise.
#[inline(always)]
pub(crate) fn row_dot(a: &[f32], b: &[f32]) -> f32 {
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(a, b)| a * b);
    lanes(
        ca.zip(cb).map(|(a, b)| a.iter().zip(b).map(|(a, b)| a * b)),
        tail,
    )
}

/// Adds `LANES`-wide blocks lane by lane, then the lanes in order, then the tail.
#[inline(always)]
fn lanes<B: Iterator<Item = f32>>(
    blocks: impl Iterator<Item = B>,
    tail: impl Iterator<Item = f32>,
) -> f32 {
    let mut acc = [0.0f32; LANES];
    for block in blocks {
        for (a, v) in acc.iter_mut().zip(block) {
            *a += v;
        }
    }
    let mut s = 0.0;
    for a in acc {
        s += a;
    }
    tail.fold(s, |s, v| s + v)
}

/// A vector unit of this CPU, of those the kernels are compiled for: only [`Isa::detect`] and
/// [`Isa::base`] make one, so a kernel never runs instructions the CPU lacks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Isa(IsaKind);

/// Which copy of a kernel [`Isa`] selects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum IsaKind {
    /// AVX-512F.
    Avx512,
    /// AVX2 with FMA.
    Avx2,
    /// The crate's baseline.
    Base,
}

impl Isa {
    /// The widest vector unit this CPU has.
    pub(crate) fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return Isa(IsaKind::Avx512);
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return Isa(IsaKind::Avx2);
            }
        }
        Isa::base()
    }

    /// The crate's baseline, on every CPU.
    pub(crate) fn base() -> Self {
        Isa(IsaKind::Base)
    }

    pub(crate) fn kind(self) -> IsaKind {
        self.0
    }
}

/// `fn name(isa, args…)` running `body(args…)` compiled for `isa`.
macro_rules! multiversion {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) => $body:path;) => {
        $(#[$meta])*
        $vis fn $name(isa: $crate::fused::simd::Isa, $($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f")]
                fn avx512($($arg: $ty),*) {
                    $body($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                fn avx2($($arg: $ty),*) {
                    $body($($arg),*)
                }
                match isa.kind() {
                    // SAFETY: only `Isa::detect` makes this kind, having seen the feature.
                    $crate::fused::simd::IsaKind::Avx512 => return unsafe { avx512($($arg),*) },
                    // SAFETY: as above.
                    $crate::fused::simd::IsaKind::Avx2 => return unsafe { avx2($($arg),*) },
                    $crate::fused::simd::IsaKind::Base => {}
                }
            }
            #[cfg(not(target_arch = "x86_64"))]
            let _ = isa;
            $body($($arg),*)
        }
    };
}
pub(crate) use multiversion;

/// Runs `f` on matching chunks of `N` inputs and `M` outputs of one length: on the calling
/// thread up to [`CHUNK`] elements, else in tasks of whole `row`s over rayon's pool.
///
/// # Panics
/// If the slices differ in length or are not whole rows (the callers check shapes first).
pub(crate) fn par_chunks<const N: usize, const M: usize>(
    ins: [&[f32]; N],
    outs: [&mut [f32]; M],
    row: usize,
    f: impl Fn([&[f32]; N], [&mut [f32]; M]) + Sync,
) {
    let len = outs.first().map_or(0, |o| o.len());
    let row = row.max(1);
    assert!(
        ins.iter().all(|s| s.len() == len) && outs.iter().all(|s| s.len() == len),
        "fused kernel: inputs and outputs differ in length"
    );
    assert_eq!(len % row, 0, "fused kernel: length is not whole rows");
    if len <= CHUNK {
        return f(ins, outs);
    }
    let chunk = row * (CHUNK / row).max(1);
    let mut out_chunks = outs.map(|o| o.chunks_mut(chunk));
    let tasks: Vec<_> = (0..len.div_ceil(chunk))
        .map(|i| {
            let range = i * chunk..((i + 1) * chunk).min(len);
            let ins = ins.map(|s| &s[range.clone()]);
            let outs = out_chunks.each_mut().map(|c| c.next().unwrap_or_default());
            (ins, outs)
        })
        .collect();
    tasks.into_par_iter().for_each(|(ins, outs)| f(ins, outs));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_within_two_ulp_of_f64_and_zero_below_the_normal_range() {
        for i in -87_330..=88_000 {
            let x = i as f32 / 1000.0;
            let want = (x as f64).exp();
            let got = exp(x) as f64;
            assert!(
                (got - want).abs() <= 2.5e-7 * want,
                "exp({x}) = {got}, want {want}"
            );
        }
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-100.0), 0.0);
        assert!(exp(f32::NAN).is_nan());
    }

    #[test]
    fn row_sums_and_maxima() {
        let x: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin()).collect();
        let want: f64 = x.iter().map(|&v| v as f64).sum();
        assert!((row_sum(&x) as f64 - want).abs() < 1e-5);
        let want: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
        assert!((row_dot(&x, &x) as f64 - want).abs() < 1e-5);
        let max = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        assert_eq!(row_max(&x), max);
        assert_eq!(row_max(&[]), f32::NEG_INFINITY);
    }

    #[test]
    fn chunks_cover_every_element_once() {
        let row = 1000;
        let x: Vec<f32> = (0..(7 * CHUNK / row + 3) * row).map(|i| i as f32).collect();
        let mut y = vec![0.0; x.len()];
        par_chunks([&x], [&mut y], row, |[x], [y]| {
            assert_eq!(x.len() % row, 0);
            for (y, x) in y.iter_mut().zip(x) {
                *y = x + 1.0;
            }
        });
        assert!(y.iter().zip(&x).all(|(y, x)| *y == x + 1.0));
    }
}
