//! Staleness diagnostics: how the cumulative importance ratio spreads along the trajectory (the
//! quantity of the stale-samples lecture's Fig. 1), as plain numbers a trainer can log or plot.

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

/// TRL's clip diagnostics (`clip_ratio/low_mean`, `high_mean`, `region_mean`, `low_min`,
/// `high_max`) from the ratio a loss used: a token (or row) is low-clipped when `ρ < 1 − ε_low`
/// and `A < 0`, high-clipped when `ρ > 1 + ε_high` and `A > 0`.
///
/// Token level (`per_row = false`): means are `Σ x·m / Σ m`; `low_min` / `high_max` are the
/// min / max over non-empty rows of `Σ_t x·m / n_i`. Row level (`per_row = true`, one ratio
/// per row read at its first position): means are `Σ_i x_i / B` over every row and the extremes
/// run over every row.
///
/// # Shapes
/// - `ratio`, `advantages`, `mask`: row-major `[batch, T]` host values with `dims`.
pub fn trl_clip_ratios(
    ratio: &[f64],
    advantages: &[f64],
    mask: &[f64],
    dims: [usize; 2],
    per_row: bool,
    (eps_low, eps_high): (f64, f64),
) -> std::collections::BTreeMap<String, f64> {
    let [b, t] = dims;
    let flags = |k: usize| {
        let low = ratio[k] < 1.0 - eps_low && advantages[k] < 0.0;
        let high = ratio[k] > 1.0 + eps_high && advantages[k] > 0.0;
        [f64::from(low), f64::from(high), f64::from(low || high)]
    };
    let mut sums = [0.0; 3];
    let mut rows: Vec<[f64; 3]> = Vec::new();
    let mut count = 0.0;
    for i in 0..b {
        if per_row {
            let f = flags(i * t);
            (0..3).for_each(|j| sums[j] += f[j]);
            rows.push(f);
            count += 1.0;
            continue;
        }
        let mut row = [0.0; 3];
        let mut n = 0.0;
        for k in (i * t..(i + 1) * t).filter(|&k| mask[k] > 0.5) {
            let f = flags(k);
            (0..3).for_each(|j| row[j] += f[j]);
            n += 1.0;
        }
        (0..3).for_each(|j| sums[j] += row[j]);
        count += n;
        if n > 0.0 {
            rows.push(row.map(|x| x / n));
        }
    }
    let mean = |j: usize| {
        if count > 0.0 {
            sums[j] / count
        } else {
            f64::NAN
        }
    };
    let low_min = rows.iter().map(|r| r[0]).fold(f64::NAN, f64::min);
    let high_max = rows.iter().map(|r| r[1]).fold(f64::NAN, f64::max);
    [
        ("clip_ratio/low_mean", mean(0)),
        ("clip_ratio/high_mean", mean(1)),
        ("clip_ratio/region_mean", mean(2)),
        ("clip_ratio/low_min", low_min),
        ("clip_ratio/high_max", high_max),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
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
