//! Few-row matrix products for decoding on the CPU.
//!
//! A decode step multiplies one row per sequence (8 for a group of 8) by every weight matrix of
//! the model, so its speed is how fast the weights stream from memory. A general matrix multiply
//! packs its operands into tiles on every call, which pays off for many rows but not for a
//! handful. Here the weights are packed once, when [`crate::HostWeights`] copies them to host
//! memory (q/k/v and gate/up fused), into column panels that lie contiguously; a decode step then
//! reads each panel once, in order, split across threads by output columns, and accumulates every
//! row from the same load. [`crate::host`] runs whole decode steps on these copies.
//!
//! The kernels use AVX-512 (checked at run time); without it [`crate::HostWeights::suits`] says
//! no and decoding stays on the backend. A plain-Rust version of each kernel is the reference the
//! tests compare against.

use crate::hostmem::{host_vec, read_f32_all};
use crate::{ModelError, Result};
use burn::tensor::Tensor;
use rayon::prelude::*;

/// Re-exported from [`crate::hostmem`], where it lives.
pub use crate::hostmem::host_resident;

/// Lanes per accumulator (one AVX-512 register).
const LANES: usize = 16;
/// Output columns per panel of a `[k, n]` product.
const PANEL: usize = 2 * LANES;
/// Most rows one kernel call accumulates at once.
pub const MAX_ROWS: usize = 8;

/// A weight matrix copied to host memory, multiplied by few rows at a time.
///
/// A `[k, n]` matrix (a burn `Linear` weight, `[in, out]`) is cut into panels of 32
/// columns, each stored as a contiguous `[k, 32]` block (the last one zero-padded), so a
/// panel's weights stream from memory in order. An `[out, in]` table (an embedding used as the
/// output head) is stored the same way, transposed; its rows are read back with
/// [`HostMatrix::column`].
#[derive(Debug, Clone)]
pub struct HostMatrix {
    data: Vec<f32>,
    k: usize,
    n: usize,
}

impl HostMatrix {
    /// Copies `[in, out]` weights (several side by side along `out`, e.g. q, k and v).
    pub fn from_in_out(weights: &[Tensor<2>]) -> Result<Self> {
        let k = weights.first().map_or(0, |w| w.dims()[0]);
        if let Some(w) = weights.iter().find(|w| w.dims()[0] != k) {
            return Err(ModelError::Input(format!(
                "fused weights need the same input width: {:?} vs {k}",
                w.dims()
            )));
        }
        // Read where they lie (flex): the packed copy is the only one made.
        read_f32_all(weights, |values| {
            let parts: Vec<(usize, &[f32])> = weights
                .iter()
                .zip(values)
                .map(|(w, v)| (w.dims()[1], *v))
                .collect();
            Self::panels(&parts, k)
        })
    }

    /// Packs row-major `[k, n_i]` matrices, side by side, into panels.
    fn panels(parts: &[(usize, &[f32])], k: usize) -> Self {
        let n: usize = parts.iter().map(|(n, _)| n).sum();
        let mut data = vec![0f32; n.div_ceil(PANEL) * k * PANEL];
        let mut first = 0;
        for (w, rows) in parts {
            // Runs of columns that stay within one panel.
            let mut j = 0;
            while j < *w {
                let (p, lane) = ((first + j) / PANEL, (first + j) % PANEL);
                let len = (PANEL - lane).min(w - j);
                let block = &mut data[p * k * PANEL..(p + 1) * k * PANEL];
                for (kk, dst) in block.chunks_mut(PANEL).enumerate() {
                    dst[lane..lane + len].copy_from_slice(&rows[kk * w + j..kk * w + j + len]);
                }
                j += len;
            }
            first += w;
        }
        Self { data, k, n }
    }

    /// Copies an `[out, in]` table (an embedding used as the output head), transposed into
    /// panels: the head then streams like every other weight (a dot product per vocabulary row
    /// ran at a third of the speed for 8 rows).
    pub fn from_out_in(table: Tensor<2>) -> Result<Self> {
        let [n, k] = table.dims();
        Ok(Self::panels_of_rows(&host_vec(table)?, n, k))
    }

    /// Packs the row-major `[n, k]` `rows` transposed into panels.
    fn panels_of_rows(rows: &[f32], n: usize, k: usize) -> Self {
        let mut data = vec![0f32; n.div_ceil(PANEL) * k * PANEL];
        data.par_chunks_mut(k * PANEL)
            .enumerate()
            .for_each(|(p, block)| {
                for lane in 0..PANEL.min(n - p * PANEL) {
                    let row = &rows[(p * PANEL + lane) * k..][..k];
                    for (kk, &v) in row.iter().enumerate() {
                        block[kk * PANEL + lane] = v;
                    }
                }
            });
        Self { data, k, n }
    }

    /// Output column `j` (`k` values): for a table stored with [`HostMatrix::from_out_in`],
    /// its row `j`.
    pub fn column(&self, j: usize) -> impl Iterator<Item = f32> + '_ {
        let (p, lane) = (j / PANEL, j % PANEL);
        self.data[p * self.k * PANEL..(p + 1) * self.k * PANEL]
            .iter()
            .skip(lane)
            .step_by(PANEL)
            .copied()
    }

    /// Input width `k`.
    pub fn in_features(&self) -> usize {
        self.k
    }

    /// Output width `n`.
    pub fn out_features(&self) -> usize {
        self.n
    }

    /// `x · W` for `m = x.len() / k` rows, any `m` (rows are taken [`MAX_ROWS`] at a time).
    ///
    /// # Shapes
    /// - `x`: `[m, k]` row-major → `[m, n]` row-major.
    pub fn matmul(&self, x: &[f32]) -> Vec<f32> {
        self.matmul_with(Isa::detect(), x)
    }

    fn matmul_with(&self, isa: Isa, x: &[f32]) -> Vec<f32> {
        let (k, n) = (self.k, self.n);
        let m = x.len().checked_div(k).unwrap_or(0);
        assert_eq!(m * k, x.len(), "input is not a whole number of rows of {k}");
        let mut out = vec![0f32; m * n];
        for (xs, os) in x.chunks(MAX_ROWS * k).zip(out.chunks_mut(MAX_ROWS * n)) {
            self.matmul_block(isa, xs, os);
        }
        out
    }

    /// Up to [`MAX_ROWS`] rows: the columns are split into blocks, one task each.
    fn matmul_block(&self, isa: Isa, x: &[f32], out: &mut [f32]) {
        let (k, n) = (self.k, self.n);
        let m = x.len() / k;
        // Blocks of whole panels, about four per thread, so uneven threads even out.
        let tasks = 4 * rayon::current_num_threads();
        let block = n.div_ceil(tasks).div_ceil(PANEL).max(1) * PANEL;
        // Each block writes its own columns of `out`; the columns of one row are contiguous,
        // so blocks are computed into their own buffers and copied into place.
        let blocks: Vec<(usize, Vec<f32>)> = (0..n)
            .step_by(block)
            .collect::<Vec<_>>()
            .into_par_iter()
            .map(|j0| {
                let width = block.min(n - j0);
                let mut o = vec![0f32; m * width];
                self.columns(isa, x, m, j0, width, &mut o);
                (j0, o)
            })
            .collect();
        for (j0, o) in blocks {
            let width = o.len() / m;
            for r in 0..m {
                out[r * n + j0..r * n + j0 + width].copy_from_slice(&o[r * width..(r + 1) * width]);
            }
        }
    }

    /// Columns `j0..j0 + width` of `x · W` (`m` rows) into `out` (`[m, width]`); `j0` is a
    /// multiple of [`PANEL`].
    fn columns(&self, isa: Isa, x: &[f32], m: usize, j0: usize, width: usize, out: &mut [f32]) {
        let (k, w) = (self.k, &self.data[..]);
        for c in (0..width).step_by(PANEL) {
            let panel = &w[(j0 + c) / PANEL * k * PANEL..][..k * PANEL];
            let cols = PANEL.min(width - c);
            #[cfg(target_arch = "x86_64")]
            if isa == Isa::Avx512 {
                // SAFETY: `detect` saw AVX-512.
                unsafe { x86::panel_avx512(&PanelBlock { x, m, k, panel }, out, [width, c, cols]) };
                continue;
            }
            panel_block(&PanelBlock { x, m, k, panel }, out, [width, c, cols]);
        }
    }
}

/// The instruction set the kernels run with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Isa {
    /// AVX-512 intrinsics (x86-64 CPUs that have them).
    #[cfg(target_arch = "x86_64")]
    Avx512,
    /// Plain Rust, for testing and for CPUs without AVX-512 (where [`crate::HostWeights::suits`] says
    /// no and the backend's product is used instead).
    Base,
}

impl Isa {
    fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f") {
            return Isa::Avx512;
        }
        Isa::Base
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The AVX-512 version of the panel kernel: the accumulators stay in the vector registers.
    use super::{LANES, MAX_ROWS, PANEL, PanelBlock};
    use std::arch::x86_64::*;

    /// Panel rows between a prefetch and the load it serves.
    const PREFETCH: usize = 16;

    /// [`super::panel_block`] with the accumulators in registers.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn panel_avx512(
        &PanelBlock { x, m, k, panel }: &PanelBlock<'_>,
        out: &mut [f32],
        [width, c, cols]: [usize; 3],
    ) {
        assert!(m <= MAX_ROWS && x.len() >= m * k && panel.len() >= k * PANEL);
        assert!(cols <= PANEL && out.len() >= m * width && c + cols <= width);
        let mut lo = [_mm512_setzero_ps(); MAX_ROWS];
        let mut hi = [_mm512_setzero_ps(); MAX_ROWS];
        let (xp, wp) = (x.as_ptr(), panel.as_ptr());
        for kk in 0..k {
            // SAFETY: kk < k keeps the loads inside the `[k, PANEL]` panel; r < m, kk < k
            // inside `x`.
            unsafe {
                // The panel streams from memory: ask for the lines a few rows ahead early.
                _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add((kk + PREFETCH) * PANEL) as *const i8);
                _mm_prefetch::<_MM_HINT_T0>(
                    wp.wrapping_add((kk + PREFETCH) * PANEL + LANES) as *const i8
                );
                let w0 = _mm512_loadu_ps(wp.add(kk * PANEL));
                let w1 = _mm512_loadu_ps(wp.add(kk * PANEL + LANES));
                for r in 0..m {
                    let a = _mm512_set1_ps(*xp.add(r * k + kk));
                    lo[r] = _mm512_fmadd_ps(a, w0, lo[r]);
                    hi[r] = _mm512_fmadd_ps(a, w1, hi[r]);
                }
            }
        }
        let mut row = [0f32; PANEL];
        for r in 0..m {
            // SAFETY: `row` holds PANEL floats.
            unsafe {
                _mm512_storeu_ps(row.as_mut_ptr(), lo[r]);
                _mm512_storeu_ps(row.as_mut_ptr().add(LANES), hi[r]);
            }
            out[r * width + c..r * width + c + cols].copy_from_slice(&row[..cols]);
        }
    }
}

/// The operands of one panel product: `m` rows of `x` (`[m, k]`) and one panel of `W`
/// (`[k, PANEL]`, see [`HostMatrix`]).
struct PanelBlock<'a> {
    x: &'a [f32],
    m: usize,
    k: usize,
    panel: &'a [f32],
}

/// One panel of `x · W` for `m` rows, its first `cols` columns written to columns
/// `c..c + cols` of `out` (`[m, width]`; `[width, c, cols]`): each weight row of the panel is
/// read once for all rows.
fn panel_block(
    &PanelBlock { x, m, k, panel }: &PanelBlock<'_>,
    out: &mut [f32],
    [width, c, cols]: [usize; 3],
) {
    let mut acc = vec![0f32; m * PANEL];
    for (kk, wrow) in panel.chunks(PANEL).take(k).enumerate() {
        for (r, acc) in acc.chunks_mut(PANEL).enumerate() {
            let a = x[r * k + kk];
            for (o, &b) in acc.iter_mut().zip(wrow) {
                *o += a * b;
            }
        }
    }
    for (r, acc) in acc.chunks(PANEL).enumerate() {
        out[r * width + c..r * width + c + cols].copy_from_slice(&acc[..cols]);
    }
}

/// Whether the kernels run with AVX-512 here (otherwise decoding stays on the backend).
pub(crate) fn kernels_available() -> bool {
    Isa::detect() != Isa::Base
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Device;

    /// `x · W` for a row-major `w`, `[k, n]` or with `out_in` `[n, k]`.
    fn naive(x: &[f32], m: usize, k: usize, w: &[f32], n: usize, out_in: bool) -> Vec<f32> {
        let mut out = vec![0f32; m * n];
        for r in 0..m {
            for j in 0..n {
                out[r * n + j] = (0..k)
                    .map(|i| {
                        let wv = if out_in { w[j * k + i] } else { w[i * n + j] };
                        x[r * k + i] as f64 * wv as f64
                    })
                    .sum::<f64>() as f32;
            }
        }
        out
    }

    fn values(len: usize, seed: u32) -> Vec<f32> {
        (0..len)
            .map(|i| ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8) as f32)
            .map(|v| v / (1u32 << 24) as f32 - 0.5)
            .collect()
    }

    #[test]
    fn products_match_a_naive_reference_for_every_row_count_and_ragged_widths() {
        for &(k, n) in &[(1, 1), (7, 5), (33, 70), (64, 96), (40, 129)] {
            for m in [1, 2, 3, 5, 8, 9, 17] {
                let x = values(m * k, 1);
                let w = values(k * n, 2);
                for out_in in [false, true] {
                    let mat = if out_in {
                        HostMatrix::panels_of_rows(&w, n, k)
                    } else {
                        HostMatrix::panels(&[(n, &w[..])], k)
                    };
                    let want = naive(&x, m, k, &w, n, out_in);
                    for isa in [Isa::detect(), Isa::Base] {
                        let got = mat.matmul_with(isa, &x);
                        for (g, e) in got.iter().zip(&want) {
                            assert!(
                                (g - e).abs() < 1e-4,
                                "{isa:?} out_in {out_in} m{m} k{k} n{n}: {g} vs {e}"
                            );
                        }
                    }
                    if out_in {
                        for j in [0, n / 2, n - 1] {
                            let row: Vec<f32> = mat.column(j).collect();
                            assert_eq!(row, w[j * k..(j + 1) * k], "row {j} of k{k} n{n}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn fused_weights_are_side_by_side() {
        let device = Device::default();
        let a = Tensor::<2>::from_floats([[1.0, 2.0], [3.0, 4.0]], &device);
        let b = Tensor::<2>::from_floats([[5.0], [6.0]], &device);
        let m = HostMatrix::from_in_out(&[a, b]).expect("same input width");
        assert_eq!((m.in_features(), m.out_features()), (2, 3));
        assert_eq!(m.matmul(&[1.0, 1.0]), vec![4.0, 6.0, 11.0]);
        let c = Tensor::<2>::from_floats([[1.0, 2.0, 3.0]], &device);
        let d = Tensor::<2>::from_floats([[1.0], [2.0]], &device);
        assert!(HostMatrix::from_in_out(&[c, d]).is_err());
        // Parts whose columns straddle panel boundaries.
        let (k, widths) = (5, [20, 50, 7]);
        let parts: Vec<(usize, Vec<f32>)> = widths
            .iter()
            .zip(1..)
            .map(|(&w, seed)| (w, values(k * w, seed)))
            .collect();
        let n: usize = widths.iter().sum();
        let fused: Vec<f32> = (0..k)
            .flat_map(|row| {
                parts
                    .iter()
                    .flat_map(move |(w, d)| d[row * w..(row + 1) * w].to_vec())
            })
            .collect();
        let x = values(3 * k, 9);
        let borrowed: Vec<(usize, &[f32])> = parts.iter().map(|(w, d)| (*w, &d[..])).collect();
        let got = HostMatrix::panels(&borrowed, k).matmul(&x);
        let want = naive(&x, 3, k, &fused, n, false);
        assert!(got.iter().zip(&want).all(|(g, e)| (g - e).abs() < 1e-5));
    }
}
