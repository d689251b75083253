//! Staleness diagnostics: how the cumulative importance ratio spreads along the trajectory
//! (the lecture's Fig. 1 quantity), as plain numbers a trainer can log or plot.

use crate::masked::to_host;
use crate::{AlgoError, Result};
use burn::tensor::Tensor;
use serde::{Deserialize, Serialize};

/// Quantiles of `log ρ_t^cum` over the tokens of one bucket of positions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PositionBucket {
    /// First position in the bucket (0-based, inclusive).
    pub start: usize,
    /// One past the last position.
    pub end: usize,
    /// Number of masked tokens in the bucket.
    pub count: usize,
    /// `(q, value)` pairs: the q-quantile of the log cumulative ratio.
    pub quantiles: Vec<(f64, f64)>,
}

/// Splits positions `0..T` into `buckets` equal spans and reports the requested quantiles of the
/// log cumulative ratio `Σ_{k≤t}(log πθ − log μ)_k` among the masked tokens of each span (no
/// clamping, so the explosion is visible). Empty buckets report NaN quantiles.
///
/// # Shapes
/// - `log_prob`, `old_log_prob`, `mask`: `[batch, T]`
pub fn cumulative_ratio_spread(
    log_prob: Tensor<2>,
    old_log_prob: Tensor<2>,
    mask: &Tensor<2>,
    buckets: usize,
    quantiles: &[f64],
) -> Result<Vec<PositionBucket>> {
    let [b, t] = log_prob.dims();
    if buckets == 0 || quantiles.iter().any(|q| !(0.0..=1.0).contains(q)) {
        return Err(AlgoError::InvalidSetting {
            name: "buckets / quantiles",
            value: buckets as f64,
            allowed: "need at least one bucket and quantiles in [0, 1]",
        });
    }
    // Unclamped prefix sums: diagnostics should show the raw spread.
    let d = crate::ratio::token_log_ratio(log_prob.clone(), old_log_prob.clone(), mask).detach();
    let cum = to_host(&d.cumsum(1))?;
    let m = to_host(mask)?;
    let buckets = buckets.min(t.max(1));
    Ok((0..buckets)
        .map(|k| {
            let (start, end) = (k * t / buckets, (k + 1) * t / buckets);
            let mut vals: Vec<f64> = (0..b)
                .flat_map(|i| (start..end).map(move |j| i * t + j))
                .filter(|&idx| m[idx] > 0.5)
                .map(|idx| cum[idx])
                .collect();
            vals.sort_by(|x, y| x.total_cmp(y));
            let q = quantiles
                .iter()
                .map(|&q| (q, quantile_sorted(&vals, q)))
                .collect();
            PositionBucket {
                start,
                end,
                count: vals.len(),
                quantiles: q,
            }
        })
        .collect())
}

/// Linear-interpolated quantile of ascending values, `q ∈ [0, 1]` (torch's `quantile`; NaN
/// when empty).
pub fn quantile_sorted(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let pos = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{DType, Device, TensorData};

    #[test]
    fn spread_grows_with_position() {
        // Rows drift by ±0.1 per token: the cumulative log ratio fans out linearly.
        let (b, t) = (4, 40);
        let lp: Vec<f64> = (0..b * t)
            .map(|k| if (k / t) % 2 == 0 { 0.1 } else { -0.1 })
            .collect();
        let dev = Device::flex();
        let lp = Tensor::<2>::from_data(TensorData::new(lp, [b, t]), (&dev, DType::F64));
        let old = lp.zeros_like();
        let mask = lp.ones_like();
        let s = cumulative_ratio_spread(lp, old, &mask, 4, &[0.0, 1.0]).unwrap();
        let width = |p: &PositionBucket| p.quantiles[1].1 - p.quantiles[0].1;
        assert!(width(&s[3]) > width(&s[0]) * 3.0, "{s:?}");
        assert_eq!(s.iter().map(|p| p.count).sum::<usize>(), b * t);
    }
}
