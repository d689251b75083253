//! The fused operations' loops on f32 slices: `silu(g) · u` element by element, and softmax and
//! log-softmax over rows, each forward and backward in one pass.

use super::simd::{Isa, exp, multiversion, par_chunks, row_dot, row_max, row_sum};

#[inline(always)]
fn sigmoid(x: f32) -> f32 {
    // e^−|x| ≤ 1: no overflow, and σ → 0 (not a clamped e^−88) as x → −∞.
    let e = exp(-x.abs());
    let r = 1.0 / (1.0 + e);
    if x >= 0.0 { r } else { e * r }
}

#[inline(always)]
fn silu_mul_body(g: &[f32], u: &[f32], out: &mut [f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(g).zip(u) {
        *o = g * sigmoid(g) * u;
    }
}

/// `d/dg [g·σ(g)] = σ + g·σ·(1 − σ)`.
#[inline(always)]
fn silu_mul_grad_body(g: &[f32], u: &[f32], dy: &[f32], dg: &mut [f32], du: &mut [f32]) {
    let outs = dg.iter_mut().zip(du.iter_mut());
    for (((dg, du), &g), (&u, &dy)) in outs.zip(g).zip(u.iter().zip(dy)) {
        let s = sigmoid(g);
        let gs = g * s;
        *du = dy * gs;
        *dg = dy * u * (s + gs * (1.0 - s));
    }
}

#[inline(always)]
fn softmax_body(x: &[f32], y: &mut [f32], width: usize) {
    for (x, y) in x.chunks_exact(width).zip(y.chunks_exact_mut(width)) {
        let m = row_max(x);
        for (y, &x) in y.iter_mut().zip(x) {
            *y = exp(x - m);
        }
        let inv = 1.0 / row_sum(y);
        for y in y.iter_mut() {
            *y *= inv;
        }
    }
}

/// `dx = y ⊙ (dy − ⟨dy, y⟩)` per row.
#[inline(always)]
fn softmax_grad_body(y: &[f32], dy: &[f32], dx: &mut [f32], width: usize) {
    let rows = y.chunks_exact(width).zip(dy.chunks_exact(width));
    for ((y, dy), dx) in rows.zip(dx.chunks_exact_mut(width)) {
        let dot = row_dot(dy, y);
        for ((dx, &y), &dy) in dx.iter_mut().zip(y).zip(dy) {
            *dx = y * (dy - dot);
        }
    }
}

#[inline(always)]
fn log_softmax_body(x: &[f32], y: &mut [f32], width: usize) {
    for (x, y) in x.chunks_exact(width).zip(y.chunks_exact_mut(width)) {
        let m = row_max(x);
        for (y, &x) in y.iter_mut().zip(x) {
            *y = exp(x - m);
        }
        // `(x − m) − ln Σ`, not `x − (m + ln Σ)`: the latter rounds at the size of `m`.
        let ln_sum = row_sum(y).ln();
        for (y, &x) in y.iter_mut().zip(x) {
            *y = (x - m) - ln_sum;
        }
    }
}

/// `dx = dy − exp(y) · Σ dy` per row.
#[inline(always)]
fn log_softmax_grad_body(y: &[f32], dy: &[f32], dx: &mut [f32], width: usize) {
    let rows = y.chunks_exact(width).zip(dy.chunks_exact(width));
    for ((y, dy), dx) in rows.zip(dx.chunks_exact_mut(width)) {
        let total = row_sum(dy);
        for ((dx, &y), &dy) in dx.iter_mut().zip(y).zip(dy) {
            *dx = dy - exp(y) * total;
        }
    }
}

multiversion!(fn silu_mul_chunk(g: &[f32], u: &[f32], out: &mut [f32]) => silu_mul_body;);
multiversion!(fn silu_mul_grad_chunk(g: &[f32], u: &[f32], dy: &[f32], dg: &mut [f32], du: &mut [f32]) => silu_mul_grad_body;);
multiversion!(fn softmax_chunk(x: &[f32], y: &mut [f32], width: usize) => softmax_body;);
multiversion!(fn softmax_grad_chunk(y: &[f32], dy: &[f32], dx: &mut [f32], width: usize) => softmax_grad_body;);
multiversion!(fn log_softmax_chunk(x: &[f32], y: &mut [f32], width: usize) => log_softmax_body;);
multiversion!(fn log_softmax_grad_chunk(y: &[f32], dy: &[f32], dx: &mut [f32], width: usize) => log_softmax_grad_body;);

/// `silu(g) · u`.
pub(crate) fn silu_mul(g: &[f32], u: &[f32]) -> Vec<f32> {
    let isa = Isa::detect();
    let mut out = vec![0.0; g.len()];
    par_chunks([g, u], [&mut out], 1, |[g, u], [o]| {
        silu_mul_chunk(isa, g, u, o)
    });
    out
}

/// `(∂L/∂g, ∂L/∂u)` of `silu(g) · u` from `dy = ∂L/∂out`.
pub(crate) fn silu_mul_grad(g: &[f32], u: &[f32], dy: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let isa = Isa::detect();
    let (mut dg, mut du) = (vec![0.0; g.len()], vec![0.0; g.len()]);
    par_chunks([g, u, dy], [&mut dg, &mut du], 1, |[g, u, dy], [dg, du]| {
        silu_mul_grad_chunk(isa, g, u, dy, dg, du)
    });
    (dg, du)
}

/// A row-wise operation of one input over rows of `width` (no work for empty rows).
fn rows(x: &[f32], width: usize, chunk: fn(Isa, &[f32], &mut [f32], usize)) -> Vec<f32> {
    let isa = Isa::detect();
    let mut y = vec![0.0; x.len()];
    if width > 0 {
        par_chunks([x], [&mut y], width, |[x], [y]| chunk(isa, x, y, width));
    }
    y
}

/// A row-wise operation of two inputs, likewise.
fn rows2(
    a: &[f32],
    b: &[f32],
    width: usize,
    chunk: fn(Isa, &[f32], &[f32], &mut [f32], usize),
) -> Vec<f32> {
    let isa = Isa::detect();
    let mut y = vec![0.0; a.len()];
    if width > 0 {
        par_chunks([a, b], [&mut y], width, |[a, b], [y]| {
            chunk(isa, a, b, y, width)
        });
    }
    y
}

/// Softmax over each row of `width`.
pub(crate) fn softmax(x: &[f32], width: usize) -> Vec<f32> {
    rows(x, width, softmax_chunk)
}

/// The softmax's input gradient from its output `y` and `dy`.
pub(crate) fn softmax_grad(y: &[f32], dy: &[f32], width: usize) -> Vec<f32> {
    rows2(y, dy, width, softmax_grad_chunk)
}

/// Log-softmax over each row of `width`.
pub(crate) fn log_softmax(x: &[f32], width: usize) -> Vec<f32> {
    rows(x, width, log_softmax_chunk)
}

/// The log-softmax's input gradient from its output `y` and `dy`.
pub(crate) fn log_softmax_grad(y: &[f32], dy: &[f32], width: usize) -> Vec<f32> {
    rows2(y, dy, width, log_softmax_grad_chunk)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fused::simd::CHUNK;

    /// Inputs over the range an activation reaches, the clamp edges and beyond included.
    fn inputs(n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let t = i as f32 / n as f32;
                (t - 0.5) * 200.0 * t * t
            })
            .collect()
    }

    fn close(got: f32, want: f64, what: &str) {
        let tol = 1e-6 * (1.0 + want.abs());
        assert!((got as f64 - want).abs() <= tol, "{what}: {got} vs {want}");
    }

    #[test]
    fn silu_mul_forward_and_backward_match_f64() {
        // Below and above the parallel chunk size, and not a multiple of a vector's width.
        for n in [37, 3 * CHUNK + 5] {
            let g = inputs(n);
            let u: Vec<f32> = g.iter().map(|x| 0.5 - x / 7.0).collect();
            let dy: Vec<f32> = g.iter().map(|x| (x * 0.3).sin()).collect();
            let out = silu_mul(&g, &u);
            let (dg, du) = silu_mul_grad(&g, &u, &dy);
            for i in 0..n {
                let (g, u, dy) = (g[i] as f64, u[i] as f64, dy[i] as f64);
                let s = 1.0 / (1.0 + (-g).exp());
                close(out[i], g * s * u, "silu_mul");
                close(dg[i], dy * u * (s + g * s * (1.0 - s)), "∂gate");
                close(du[i], dy * g * s, "∂up");
            }
        }
    }

    /// f64 softmax and log-softmax of one row.
    fn reference(x: &[f32]) -> (Vec<f64>, Vec<f64>) {
        let m = x
            .iter()
            .map(|&v| v as f64)
            .fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = x.iter().map(|&v| (v as f64 - m).exp()).sum();
        let p = x.iter().map(|&v| (v as f64 - m).exp() / s).collect();
        let lp = x.iter().map(|&v| v as f64 - m - s.ln()).collect();
        (p, lp)
    }

    #[test]
    fn softmax_and_log_softmax_match_f64_with_gradients() {
        // Narrow rows on one thread, wide rows split over the pool, masked (−∞) entries.
        for (rows, width) in [(3, 5), (40, 1000), (2, 3 * CHUNK + 7)] {
            let mut x: Vec<f32> = (0..rows * width)
                .map(|i| (i as f32 * 0.731).sin() * 9.0)
                .collect();
            x[1] = f32::NEG_INFINITY;
            let dy: Vec<f32> = (0..rows * width).map(|i| (i as f32 * 0.37).cos()).collect();
            let (p, lp) = (softmax(&x, width), log_softmax(&x, width));
            let (dp, dlp) = (
                softmax_grad(&p, &dy, width),
                log_softmax_grad(&lp, &dy, width),
            );
            for r in 0..rows {
                let span = r * width..(r + 1) * width;
                let (want_p, want_lp) = reference(&x[span.clone()]);
                let dy = &dy[span.clone()];
                let dot: f64 = dy.iter().zip(&want_p).map(|(&d, p)| d as f64 * p).sum();
                let total: f64 = dy.iter().map(|&d| d as f64).sum();
                for (j, i) in span.enumerate() {
                    close(p[i], want_p[j], "softmax");
                    close(dp[i], want_p[j] * (dy[j] as f64 - dot), "softmax grad");
                    if x[i] == f32::NEG_INFINITY {
                        assert_eq!((p[i], lp[i]), (0.0, f32::NEG_INFINITY));
                    } else {
                        close(lp[i], want_lp[j], "log_softmax");
                    }
                    close(dlp[i], dy[j] as f64 - want_p[j] * total, "log_softmax grad");
                }
            }
        }
    }

    #[test]
    fn every_vector_unit_gives_the_same_bits() {
        let x = inputs(1000);
        let u: Vec<f32> = x.iter().map(|x| 1.0 + x).collect();
        let run = |isa: Isa| {
            let mut a = vec![0.0; x.len()];
            silu_mul_chunk(isa, &x, &u, &mut a);
            let mut b = vec![0.0; x.len()];
            log_softmax_chunk(isa, &x, &mut b, 100);
            let mut c = vec![0.0; x.len()];
            softmax_grad_chunk(isa, &u, &x, &mut c, 100);
            (a, b, c)
        };
        assert_eq!(run(Isa::detect()), run(Isa::base()));
    }

    #[test]
    fn nan_propagates_and_empty_rows_are_fine() {
        let out = silu_mul(&[f32::NAN, 1.0], &[1.0, f32::NAN]);
        assert!(out[0].is_nan() && out[1].is_nan());
        // σ goes to 0 far below, instead of stopping at a clamped exponential.
        let far = silu_mul(&[-1e30, -100.0, 100.0], &[1.0; 3]);
        assert_eq!((far[0], far[1]), (0.0, 0.0));
        assert_eq!(far[2], 100.0);
        assert!(softmax(&[1.0, f32::NAN], 2).iter().all(|v| v.is_nan()));
        assert!(softmax(&[], 0).is_empty());
        assert!(log_softmax_grad(&[], &[], 0).is_empty());
    }
}
