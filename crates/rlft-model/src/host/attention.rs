//! One row's attention in a host decode step: q/k norms, RoPE, the append to the row's
//! cache, and scaled dot-product attention over it.

use super::{HostKvRow, HostNorm};

/// One row's attention in a decode step: q/k norms, RoPE, the cache append and
/// [`attend`].
pub(super) struct RowStep<'a> {
    pub(super) qk_norm: Option<&'a (HostNorm, HostNorm)>,
    /// RoPE's `cos` and `sin` at the row's position.
    pub(super) table: &'a (Vec<f32>, Vec<f32>),
    pub(super) layer: usize,
    /// `(heads, kv heads, head_dim)`.
    pub(super) dims: (usize, usize, usize),
}

impl RowStep<'_> {
    /// `qkv` (`[q | k | v]`) of the row's new token, attended over `row`'s cache into `out`.
    #[inline(always)]
    pub(super) fn run(&self, row: &mut HostKvRow, qkv: &mut [f32], out: &mut [f32]) {
        let (h, kvh, hd) = self.dims;
        let (q, kv) = qkv.split_at_mut(h * hd);
        let (k, v) = kv.split_at_mut(kvh * hd);
        if let Some((qn, kn)) = self.qk_norm {
            qn.apply(q);
            kn.apply(k);
        }
        let (cos, sin) = self.table;
        rope(q, (cos, sin));
        rope(k, (cos, sin));
        let (keys, values) = &mut row.layers[self.layer];
        keys.extend_from_slice(k);
        values.extend_from_slice(v);
        attend(q, keys, values, row.start, self.dims, out);
    }

    /// [`RowStep::run`] compiled for AVX-512, which the dot products and sums of the
    /// attention use (the crate's baseline is SSE2).
    ///
    /// # Safety
    /// The CPU must have AVX-512F.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn run_avx512(&self, row: &mut HostKvRow, qkv: &mut [f32], out: &mut [f32]) {
        self.run(row, qkv, out)
    }
}

/// HF's `rotate_half` RoPE on every `cos.len() · 2`-wide head of `x`.
#[inline(always)]
fn rope(x: &mut [f32], (cos, sin): (&[f32], &[f32])) {
    let half = cos.len();
    for head in x.chunks_mut(2 * half) {
        let (x1, x2) = head.split_at_mut(half);
        for i in 0..half {
            let (a, b) = (x1[i], x2[i]);
            x1[i] = a * cos[i] - b * sin[i];
            x2[i] = b * cos[i] + a * sin[i];
        }
    }
}

/// Scaled dot-product attention of one row's new token: query heads `q` (`[h · hd]`) against the
/// row's cached keys and values from position `start` on (`[len, kvh · hd]` each), into `out`
/// (`[h · hd]`). Query head `j` reads key/value head `j / (h / kvh)`; the query heads of a group
/// are scored together, so each cached key and value is read once per group, not once per head.
#[inline(always)]
fn attend(
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    start: usize,
    (h, kvh, hd): (usize, usize, usize),
    out: &mut [f32],
) {
    let kvd = kvh * hd;
    let (len, rep) = (keys.len() / kvd, h / kvh);
    let span = len - start;
    let scale = 1.0 / (hd as f32).sqrt();
    let mut scores = vec![0f32; rep * span];
    for g in 0..kvh {
        let qs = &q[g * rep * hd..(g + 1) * rep * hd];
        for (i, t) in (start..len).enumerate() {
            let k = &keys[t * kvd + g * hd..][..hd];
            for (r, qh) in qs.chunks(hd).enumerate() {
                scores[r * span + i] = dot(qh, k) * scale;
            }
        }
        for row in scores.chunks_mut(span) {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut total = 0f32;
            for s in row.iter_mut() {
                *s = (*s - max).exp();
                total += *s;
            }
            row.iter_mut().for_each(|s| *s /= total);
        }
        let os = &mut out[g * rep * hd..(g + 1) * rep * hd];
        os.fill(0.0);
        for (i, t) in (start..len).enumerate() {
            let v = &values[t * kvd + g * hd..][..hd];
            for (r, oh) in os.chunks_mut(hd).enumerate() {
                let w = scores[r * span + i];
                oh.iter_mut().zip(v).for_each(|(o, v)| *o += w * v);
            }
        }
    }
}

/// `a · b` in 16 independent lanes (which the compiler vectorises; a plain f32 sum is serial).
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    const L: usize = 16;
    let mut acc = [0f32; L];
    let (ca, cb) = (a.chunks_exact(L), b.chunks_exact(L));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..L {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}
