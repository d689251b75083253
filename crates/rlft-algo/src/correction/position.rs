//! Position-resolved ratio diagnostics: quantiles of the token log-ratio and of the cumulative
//! log-ratio against μ by response position — Fig. 1 of the stale-samples lecture, where the
//! cumulative ratio stays near 1 early in a response and fans out later.

use crate::diagnostics::quantile_sorted;
use std::collections::BTreeMap;

/// The quantiles reported per bucket (as `p5`, `p25`, `p50`, `p75`, `p95`).
pub const POSITION_QUANTILES: [f64; 5] = [0.05, 0.25, 0.5, 0.75, 0.95];

/// The bucket of a 1-based response position: `1-8` is 0, `9-16` 1, `17-32` 2, `33-64` 3, ...
pub fn position_bucket(position: usize) -> usize {
    if position <= 8 {
        0
    } else {
        (usize::BITS - (position - 1).leading_zeros()) as usize - 3
    }
}

/// The first and last position of bucket `k`.
pub fn bucket_range(k: usize) -> (usize, usize) {
    if k == 0 {
        (1, 8)
    } else {
        ((1 << (k + 2)) + 1, 1 << (k + 3))
    }
}

/// Quantiles of one bucket.
#[derive(Debug, Clone, PartialEq)]
pub struct BucketQuantiles {
    /// First position (1-based, inclusive).
    pub lo: usize,
    /// Last position (inclusive).
    pub hi: usize,
    /// Valid tokens in the bucket.
    pub count: usize,
    /// Quantiles of `log ρ_t`, one per requested `q`.
    pub token: Vec<f64>,
    /// Quantiles of `Σ_{k≤t} log ρ_k·m_k`, one per requested `q`.
    pub cumulative: Vec<f64>,
}

/// Collects log-ratios by response position over any number of batches (a step's micro-batches,
/// epochs), then reports linear-interpolated quantiles per bucket.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PositionQuantiles {
    token: Vec<Vec<f64>>,
    cumulative: Vec<Vec<f64>>,
}

impl PositionQuantiles {
    /// Adds a row-major `[rows, cols]` batch of response-aligned log-ratios `log π − log μ`:
    /// column `j` is response position `j + 1`. Tokens with `mask ≤ 0.5` (observations, padding)
    /// count in the position but not in the statistics or the cumulative sum.
    pub fn add(&mut self, log_ratio: &[f64], mask: &[f64], [rows, cols]: [usize; 2]) {
        for i in 0..rows {
            let mut cum = 0.0;
            for j in 0..cols {
                let k = i * cols + j;
                if mask[k] <= 0.5 {
                    continue;
                }
                cum += log_ratio[k] * mask[k];
                let b = position_bucket(j + 1);
                if self.token.len() <= b {
                    self.token.resize(b + 1, Vec::new());
                    self.cumulative.resize(b + 1, Vec::new());
                }
                self.token[b].push(log_ratio[k]);
                self.cumulative[b].push(cum);
            }
        }
    }

    /// Adds `other`'s log-ratios after this one's (as if its batches had been added here).
    pub fn merge(&mut self, other: PositionQuantiles) {
        if self.token.len() < other.token.len() {
            self.token.resize(other.token.len(), Vec::new());
            self.cumulative.resize(other.token.len(), Vec::new());
        }
        for (b, (t, c)) in other.token.into_iter().zip(other.cumulative).enumerate() {
            self.token[b].extend(t);
            self.cumulative[b].extend(c);
        }
    }

    /// Quantiles `qs` per non-empty bucket, in position order.
    pub fn quantiles(&self, qs: &[f64]) -> Vec<BucketQuantiles> {
        let sorted_quantiles = |v: &[f64]| {
            let mut v = v.to_vec();
            v.sort_by(f64::total_cmp);
            qs.iter().map(|&q| quantile_sorted(&v, q)).collect()
        };
        (0..self.token.len())
            .filter(|&k| !self.token[k].is_empty())
            .map(|k| {
                let (lo, hi) = bucket_range(k);
                BucketQuantiles {
                    lo,
                    hi,
                    count: self.token[k].len(),
                    token: sorted_quantiles(&self.token[k]),
                    cumulative: sorted_quantiles(&self.cumulative[k]),
                }
            })
            .collect()
    }

    /// The [`POSITION_QUANTILES`] as metrics `pos/token/<lo>-<hi>/p<q>` and
    /// `pos/cum/<lo>-<hi>/p<q>`; empty buckets are left out.
    pub fn metrics(&self) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        for b in self.quantiles(&POSITION_QUANTILES) {
            for (k, q) in POSITION_QUANTILES.iter().enumerate() {
                let p = (q * 100.0).round() as u32;
                out.insert(format!("pos/token/{}-{}/p{p}", b.lo, b.hi), b.token[k]);
                out.insert(format!("pos/cum/{}-{}/p{p}", b.lo, b.hi), b.cumulative[k]);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_double_after_sixteen() {
        let b: Vec<usize> = [1, 8, 9, 16, 17, 32, 33, 64, 65, 128, 129, 1024, 1025]
            .iter()
            .map(|&p| position_bucket(p))
            .collect();
        assert_eq!(b, vec![0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 7, 8]);
        for k in 0..9 {
            let (lo, hi) = bucket_range(k);
            assert_eq!((position_bucket(lo), position_bucket(hi)), (k, k));
        }
        assert_eq!(bucket_range(2), (17, 32));
    }

    /// Rows drifting by ±0.1 per token: token quantiles stay at ±0.1 everywhere, the cumulative
    /// spread grows with position; observation tokens keep their position but add nothing.
    #[test]
    fn the_cumulative_spread_fans_out_with_position() {
        let (rows, cols) = (4, 40);
        let lr: Vec<f64> = (0..rows * cols)
            .map(|k| if (k / cols) % 2 == 0 { 0.1 } else { -0.1 })
            .collect();
        let mut mask = vec![1.0; rows * cols];
        mask[3] = 0.0; // an observation token in row 0
        let mut p = PositionQuantiles::default();
        p.add(&lr, &mask, [rows, cols]);
        let q = p.quantiles(&[0.0, 1.0]);
        assert_eq!(
            q.iter().map(|b| (b.lo, b.hi)).collect::<Vec<_>>(),
            vec![(1, 8), (9, 16), (17, 32), (33, 64)]
        );
        assert_eq!(q[0].count, rows * 8 - 1);
        assert!(q.iter().all(|b| b.token == vec![-0.1, 0.1]));
        let width = |b: &BucketQuantiles| b.cumulative[1] - b.cumulative[0];
        assert!(width(&q[3]) > 4.0 * width(&q[0]), "{q:?}");
        // Row 2 sums forty tokens of +0.1; row 0 skips its observation at position 4.
        assert!((q[3].cumulative[1] - 4.0).abs() < 1e-9);
        let mut row0 = PositionQuantiles::default();
        row0.add(&lr[..cols], &mask[..cols], [1, cols]);
        assert!((row0.quantiles(&[1.0])[3].cumulative[0] - 3.9).abs() < 1e-9);
        let m = p.metrics();
        assert!(m.contains_key("pos/cum/33-64/p95") && !m.contains_key("pos/cum/65-128/p5"));
        assert_eq!(m.len(), 4 * 2 * 5);
    }
}
