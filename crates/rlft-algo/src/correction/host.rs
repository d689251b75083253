//! The correction's arithmetic on host `f64` slices, reduced in row-major order.

use super::{
    CorrectionConfig, Divergence, FilterBounds, FilterScope, IsConfig, IsLevel, IsThreshold,
    Rejection, SAFETY_BOUND,
};
use crate::masked::COUNT_EPS;
use crate::{AlgoError, Result};
use std::collections::BTreeMap;

/// [`correct_host`]'s result: row-major `[batch, T]` weights and mask, and the metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct HostCorrection {
    /// IS weights (0 at padding), when IS is configured.
    pub weights: Option<Vec<f64>>,
    /// The response mask with rejected tokens set to 0.
    pub mask: Vec<f64>,
    /// verl's metric keys without the `rollout_corr/` prefix.
    pub metrics: BTreeMap<String, f64>,
}

/// [`super::rollout_correction`] on row-major host data of shape `dims = [batch, T]`.
pub fn correct_host(
    train: &[f64],
    behaviour: &[f64],
    mask: &[f64],
    dims: [usize; 2],
    config: &CorrectionConfig,
) -> Result<HostCorrection> {
    let n = dims[0] * dims[1];
    for (name, v) in [
        ("train_log_prob", train),
        ("behaviour_log_prob", behaviour),
        ("response_mask", mask),
    ] {
        if v.len() != n {
            return Err(AlgoError::ShapeMismatch {
                name: "rollout correction input",
                expected: format!("{name} must hold {n} values for {dims:?}"),
                got: vec![v.len()],
            });
        }
    }
    let b = Batch::new(mask, dims);
    if b.tokens == 0.0 {
        return Err(AlgoError::InvalidSpec {
            name: "response_mask".into(),
            value: format!("{dims:?} with no valid token"),
            allowed: "the rollout correction needs at least one valid token".into(),
        });
    }
    let log_ratio: Vec<f64> = train.iter().zip(behaviour).map(|(p, q)| p - q).collect();
    let mut metrics = BTreeMap::new();
    let weights = config
        .is
        .map(|is| is_weights(&b, &log_ratio, &is, &mut metrics));
    let mask = if config.rejection.is_empty() {
        mask.to_vec()
    } else {
        rejection_mask(&b, &log_ratio, &config.rejection, &mut metrics)
    };
    offpolicy_metrics(&b, train, behaviour, &mut metrics);
    Ok(HostCorrection {
        weights,
        mask,
        metrics,
    })
}

/// The mask of a row-major `[batch, T]` batch with its per-row and total counts.
struct Batch<'a> {
    mask: &'a [f64],
    rows: usize,
    cols: usize,
    /// Valid tokens per row.
    n: Vec<f64>,
    /// Valid tokens in all.
    tokens: f64,
}

impl<'a> Batch<'a> {
    fn new(mask: &'a [f64], [rows, cols]: [usize; 2]) -> Self {
        let n: Vec<f64> = (0..rows)
            .map(|i| {
                mask[i * cols..(i + 1) * cols]
                    .iter()
                    .filter(|&&m| m > 0.5)
                    .sum::<f64>()
            })
            .collect();
        let tokens = n.iter().sum();
        Self {
            mask,
            rows,
            cols,
            n,
            tokens,
        }
    }

    fn valid(&self, k: usize) -> bool {
        self.mask[k] > 0.5
    }

    /// `x·m` where valid, 0 elsewhere (garbage at padding never leaks).
    fn masked(&self, x: f64, k: usize) -> f64 {
        if self.valid(k) { x * self.mask[k] } else { 0.0 }
    }

    /// Per-row `Σ_t x·m`.
    fn row_sum(&self, x: &[f64]) -> Vec<f64> {
        (0..self.rows)
            .map(|i| {
                (i * self.cols..(i + 1) * self.cols)
                    .map(|k| self.masked(x[k], k))
                    .sum()
            })
            .collect()
    }

    /// Per-row `Σ_t x·m / (n_i + 1e-8)`.
    fn row_mean(&self, x: &[f64]) -> Vec<f64> {
        self.row_sum(x)
            .iter()
            .zip(&self.n)
            .map(|(s, n)| s / (n + COUNT_EPS))
            .collect()
    }

    /// `Σ x·m / (Σ m + 1e-8)`.
    fn mean(&self, x: impl Fn(usize) -> f64) -> f64 {
        let s: f64 = (0..self.mask.len()).map(|k| self.masked(x(k), k)).sum();
        s / (self.tokens + COUNT_EPS)
    }

    /// Fraction of valid tokens where `cond` holds.
    fn fraction(&self, cond: impl Fn(usize) -> bool) -> f64 {
        self.mean(|k| f64::from(u8::from(cond(k))))
    }

    /// Largest and smallest `x` over valid tokens.
    fn max_min(&self, x: impl Fn(usize) -> f64) -> (f64, f64) {
        (0..self.mask.len())
            .filter(|&k| self.valid(k))
            .map(x)
            .fold((f64::NEG_INFINITY, f64::INFINITY), |(hi, lo), v| {
                (hi.max(v), lo.min(v))
            })
    }

    /// Population standard deviation over valid tokens of `x` clamped to `[lo, hi]`, 0 with
    /// fewer than two tokens.
    fn clamped_std(&self, x: impl Fn(usize) -> f64, lo: f64, hi: f64) -> f64 {
        if self.tokens <= 1.0 {
            return 0.0;
        }
        // max/min rather than clamp: torch's clamp semantics, no panic if lo > hi.
        let c = |k: usize| x(k).max(lo).min(hi);
        let mean = self.mean(c);
        let var = self.mean(|k| c(k).powi(2)) - mean * mean;
        var.max(0.0).sqrt()
    }

    /// The row index of every element.
    fn row(&self, k: usize) -> usize {
        k / self.cols
    }
}

fn mean(x: &[f64]) -> f64 {
    x.iter().sum::<f64>() / x.len().max(1) as f64
}

/// torch's `std()`: the unbiased standard deviation, 0 for fewer than two values.
fn unbiased_std(x: &[f64]) -> f64 {
    if x.len() < 2 {
        return 0.0;
    }
    let m = mean(x);
    (x.iter().map(|v| (v - m).powi(2)).sum::<f64>() / (x.len() - 1) as f64).sqrt()
}

fn max(x: &[f64]) -> f64 {
    x.iter().copied().fold(f64::NEG_INFINITY, f64::max)
}

fn min(x: &[f64]) -> f64 {
    x.iter().copied().fold(f64::INFINITY, f64::min)
}

fn fraction(x: &[f64], cond: impl Fn(f64) -> bool) -> f64 {
    x.iter().filter(|&&v| cond(v)).count() as f64 / x.len().max(1) as f64
}

fn put(metrics: &mut BTreeMap<String, f64>, key: impl Into<String>, v: f64) {
    metrics.insert(key.into(), v);
}

/// IS weights and their metrics (verl's `compute_rollout_correction_weights`).
fn is_weights(
    b: &Batch<'_>,
    log_ratio: &[f64],
    is: &IsConfig,
    metrics: &mut BTreeMap<String, f64>,
) -> Vec<f64> {
    let bound = |x: f64| x.clamp(-SAFETY_BOUND, SAFETY_BOUND);
    // The log-ratio the weights come from: per token, or per row (sum or mean).
    let row_log_ratio: Option<Vec<f64>> = match is.level {
        IsLevel::Token => None,
        IsLevel::Sequence => Some(b.row_sum(log_ratio)),
        IsLevel::Geometric => Some(
            b.row_sum(log_ratio)
                .iter()
                .zip(&b.n)
                .map(|(s, n)| s / n.max(1.0))
                .collect(),
        ),
    };
    let raw: Vec<f64> = (0..log_ratio.len())
        .map(|k| {
            let lr = match &row_log_ratio {
                Some(r) => r[b.row(k)],
                None => log_ratio[k],
            };
            b.masked(bound(lr).exp(), k)
        })
        .collect();
    let mut w: Vec<f64> = match is.threshold {
        IsThreshold::Truncate { upper } => raw.iter().map(|&x| x.min(upper)).collect(),
        IsThreshold::Mask { lower, upper } => raw
            .iter()
            .map(|&x| if (lower..=upper).contains(&x) { x } else { 0.0 })
            .collect(),
    };

    weight_metrics(b, (&raw, &w), row_log_ratio.as_deref(), is, metrics);
    if is.batch_normalize {
        batch_normalize(b, &mut w, is.level, metrics);
    }
    w
}

/// verl's `rollout_is_*` metrics of the IS weights `w` from the unclamped, untruncated `raw`
/// ones (`row_log_ratio`: the per-row log-ratios at sequence or geometric level).
fn weight_metrics(
    b: &Batch<'_>,
    (raw, w): (&[f64], &[f64]),
    row_log_ratio: Option<&[f64]>,
    is: &IsConfig,
    metrics: &mut BTreeMap<String, f64>,
) {
    let upper = is.threshold.upper();
    let lower = is.threshold.lower();
    match row_log_ratio {
        Some(r) => {
            // Row level: extremes and fractions from the unclamped per-row log-ratios, all rows.
            put(metrics, "rollout_is_max", max(r).min(SAFETY_BOUND).exp());
            put(metrics, "rollout_is_min", min(r).exp());
            put(metrics, "rollout_is_mean", b.mean(|k| w[k]));
            let (lu, ll) = (upper.ln(), lower.ln());
            put(
                metrics,
                "rollout_is_ratio_fraction_high",
                fraction(r, |x| x > lu),
            );
            put(
                metrics,
                "rollout_is_ratio_fraction_low",
                fraction(r, |x| x < ll),
            );
        }
        None => {
            put(metrics, "rollout_is_mean", b.mean(|k| w[k]));
            put(
                metrics,
                "rollout_is_ratio_fraction_high",
                b.fraction(|k| raw[k] > upper),
            );
            put(
                metrics,
                "rollout_is_ratio_fraction_low",
                b.fraction(|k| raw[k] < lower),
            );
            let (hi, lo) = b.max_min(|k| w[k]);
            put(metrics, "rollout_is_max", hi);
            put(metrics, "rollout_is_min", lo);
        }
    }
    put(
        metrics,
        "rollout_is_std",
        b.clamped_std(|k| w[k], 0.0, upper),
    );
    let clamped = |k: usize| w[k].max(0.0).min(upper);
    let ess_mean = b.mean(clamped);
    put(
        metrics,
        "rollout_is_eff_sample_size",
        1.0 / b.mean(|k| (clamped(k) / (ess_mean + COUNT_EPS)).powi(2)),
    );
    let seq = b.row_mean(w);
    put(metrics, "rollout_is_seq_mean", mean(&seq));
    put(metrics, "rollout_is_seq_std", unbiased_std(&seq));
    put(metrics, "rollout_is_seq_max", max(&seq));
    put(metrics, "rollout_is_seq_min", min(&seq));
    let deviation: Vec<f64> = seq.iter().map(|x| (x - 1.0).abs()).collect();
    put(metrics, "rollout_is_seq_max_deviation", max(&deviation));
    // Row means of the raw weights: a mean of truncated weights can never exceed the cap.
    let raw_seq = b.row_mean(raw);
    put(
        metrics,
        "rollout_is_seq_fraction_high",
        fraction(&raw_seq, |x| x > upper),
    );
    put(
        metrics,
        "rollout_is_seq_fraction_low",
        fraction(&raw_seq, |x| x < lower),
    );
    if let IsThreshold::Mask { lower, upper } = is.threshold {
        put(
            metrics,
            "rollout_is_oob_ratio",
            b.fraction(|k| raw[k] < lower || raw[k] > upper),
        );
    }
}

/// Divides the weights `w` by their batch mean (per token, or of the row means at sequence or
/// geometric level), recording the factor.
fn batch_normalize(
    b: &Batch<'_>,
    w: &mut [f64],
    level: IsLevel,
    metrics: &mut BTreeMap<String, f64>,
) {
    let mean = match level {
        IsLevel::Token => b.mean(|k| w[k]),
        IsLevel::Sequence | IsLevel::Geometric => {
            let seq = b.row_mean(w);
            let (s, c) = seq
                .iter()
                .zip(&b.n)
                .filter(|(_, n)| **n > 0.0)
                .fold((0.0, 0.0), |(s, c), (x, _)| (s + x, c + 1.0));
            s / f64::max(c, COUNT_EPS)
        }
    };
    if mean > COUNT_EPS {
        w.iter_mut().for_each(|x| *x /= mean);
        put(metrics, "rollout_is_batch_norm_factor", mean);
    } else {
        put(metrics, "rollout_is_batch_norm_factor", 1.0);
    }
}

/// The rejection mask and its metrics (verl's `compute_rollout_rejection_mask`).
fn rejection_mask(
    b: &Batch<'_>,
    log_ratio: &[f64],
    filters: &[Rejection],
    metrics: &mut BTreeMap<String, f64>,
) -> Vec<f64> {
    let safe: Vec<f64> = log_ratio
        .iter()
        .map(|x| x.clamp(-SAFETY_BOUND, SAFETY_BOUND))
        .collect();
    let mut combined = vec![1.0; safe.len()];
    for r in filters {
        let token: Vec<f64> = safe
            .iter()
            .map(|&x| match r.filter.divergence {
                Divergence::K1 => -x,
                Divergence::K2 => 0.5 * x * x,
                Divergence::K3 => x.exp() - 1.0 - x,
            })
            .collect();
        let (upper, lower) = match r.bounds {
            FilterBounds::RatioBand { lower, upper } => (upper.ln(), Some(lower.ln())),
            FilterBounds::Upper(u) => (u, None),
        };
        let keeps = |v: f64| v <= upper && lower.is_none_or(|l| v >= l);
        // Per-row statistic for row filters; the per-token statistic is then the row's value.
        let per_row: Option<Vec<f64>> = match r.filter.scope {
            FilterScope::Token => None,
            FilterScope::SeqSum => Some(b.row_sum(&token)),
            FilterScope::SeqMean => Some(b.row_mean(&token)),
            FilterScope::SeqMax => Some(
                (0..b.rows)
                    .map(|i| {
                        let m = (i * b.cols..(i + 1) * b.cols)
                            .filter(|&k| b.valid(k))
                            .map(|k| token[k])
                            .fold(f64::NEG_INFINITY, f64::max);
                        if m == f64::NEG_INFINITY { 0.0 } else { m }
                    })
                    .collect(),
            ),
        };
        let stat: Vec<f64> = match &per_row {
            Some(rows) => (0..token.len()).map(|k| rows[b.row(k)]).collect(),
            None => token,
        };
        let keep: Vec<bool> = stat.iter().map(|&v| keeps(v)).collect();
        for (c, k) in combined.iter_mut().zip(&keep) {
            *c *= f64::from(u8::from(*k));
        }
        let name = format!("rollout_rs_{}", r.filter);
        rs_metrics(b, &name, &stat, per_row.as_deref(), (upper, lower), metrics);
        put(
            metrics,
            format!("{name}_masked_fraction"),
            b.mean(|k| 1.0 - f64::from(u8::from(keep[k]))),
        );
        let (mut rejected_rows, mut valid_rows) = (0.0, 0.0);
        for i in (0..b.rows).filter(|&i| b.n[i] > 0.0) {
            valid_rows += 1.0;
            if (i * b.cols..(i + 1) * b.cols).any(|k| b.valid(k) && !keep[k]) {
                rejected_rows += 1.0;
            }
        }
        let seq_masked = if valid_rows > 0.0 {
            rejected_rows / valid_rows
        } else {
            0.0
        };
        put(metrics, format!("{name}_seq_masked_fraction"), seq_masked);
    }
    put(
        metrics,
        "rollout_rs_masked_fraction",
        b.mean(|k| 1.0 - combined[k]),
    );
    let rows_hit: Vec<f64> = (0..b.rows)
        .map(|i| {
            let hit = (i * b.cols..(i + 1) * b.cols).any(|k| b.valid(k) && combined[k] <= 0.5);
            f64::from(u8::from(hit))
        })
        .collect();
    put(metrics, "rollout_rs_seq_masked_fraction", mean(&rows_hit));
    b.mask.iter().zip(&combined).map(|(m, c)| m * c).collect()
}

/// One filter's statistics (verl's `compute_rs_metrics`). `per_row` is set for row filters;
/// `lower` only for k1 (both thresholds in log space then).
fn rs_metrics(
    b: &Batch<'_>,
    prefix: &str,
    stat: &[f64],
    per_row: Option<&[f64]>,
    (upper, lower): (f64, Option<f64>),
    metrics: &mut BTreeMap<String, f64>,
) {
    let rows: Vec<f64> = per_row.map_or_else(|| b.row_mean(stat), <[f64]>::to_vec);
    let rows: Vec<f64> = rows
        .into_iter()
        .zip(&b.n)
        .filter(|(_, n)| **n > 0.0)
        .map(|(v, _)| v)
        .collect();
    let low = lower.unwrap_or(0.0);
    put(metrics, format!("{prefix}_mean"), b.mean(|k| stat[k]));
    let by_row = per_row.is_some() && !rows.is_empty();
    let (hi, lo) = if by_row {
        (max(&rows), min(&rows))
    } else {
        b.max_min(|k| stat[k])
    };
    put(metrics, format!("{prefix}_max"), hi);
    put(metrics, format!("{prefix}_min"), lo);
    let (frac_high, frac_low) = if by_row {
        (
            fraction(&rows, |v| v > upper),
            lower.map_or(0.0, |l| fraction(&rows, |v| v < l)),
        )
    } else {
        (
            b.fraction(|k| stat[k] > upper),
            lower.map_or(0.0, |l| b.fraction(|k| stat[k] < l)),
        )
    };
    put(metrics, format!("{prefix}_fraction_high"), frac_high);
    put(metrics, format!("{prefix}_fraction_low"), frac_low);
    put(
        metrics,
        format!("{prefix}_std"),
        b.clamped_std(|k| stat[k], low, upper),
    );
    if rows.is_empty() {
        for key in [
            "seq_mean",
            "seq_std",
            "seq_max",
            "seq_min",
            "seq_max_deviation",
            "seq_fraction_high",
            "seq_fraction_low",
        ] {
            put(metrics, format!("{prefix}_{key}"), 0.0);
        }
        return;
    }
    put(metrics, format!("{prefix}_seq_mean"), mean(&rows));
    put(metrics, format!("{prefix}_seq_std"), unbiased_std(&rows));
    put(metrics, format!("{prefix}_seq_max"), max(&rows));
    put(metrics, format!("{prefix}_seq_min"), min(&rows));
    let dev: Vec<f64> = rows.iter().map(|v| v.abs()).collect();
    put(metrics, format!("{prefix}_seq_max_deviation"), max(&dev));
    put(
        metrics,
        format!("{prefix}_seq_fraction_high"),
        fraction(&rows, |v| v > upper),
    );
    if let Some(l) = lower {
        put(
            metrics,
            format!("{prefix}_seq_fraction_low"),
            fraction(&rows, |v| v < l),
        );
    }
}

/// Mismatch KL, perplexities and χ² (verl's `compute_offpolicy_metrics`).
fn offpolicy_metrics(
    b: &Batch<'_>,
    train: &[f64],
    behaviour: &[f64],
    metrics: &mut BTreeMap<String, f64>,
) {
    let lr = |k: usize| train[k] - behaviour[k];
    let train_rows = b.row_mean(train);
    let mu_rows = b.row_mean(behaviour);
    let neg = |x: &[f64]| x.iter().map(|v| -v).collect::<Vec<_>>();
    let ppl = |x: &[f64]| mean(&x.iter().map(|v| (-v).exp()).collect::<Vec<_>>());
    put(metrics, "training_ppl", ppl(&train_rows));
    put(metrics, "training_log_ppl", mean(&neg(&train_rows)));
    put(metrics, "kl", b.mean(|k| -lr(k)));
    put(metrics, "k3_kl", b.mean(|k| lr(k).exp() - lr(k) - 1.0));
    put(metrics, "rollout_ppl", ppl(&mu_rows));
    put(metrics, "rollout_log_ppl", mean(&neg(&mu_rows)));
    let diff: Vec<f64> = mu_rows
        .iter()
        .zip(&train_rows)
        .map(|(m, t)| m - t)
        .collect();
    put(metrics, "log_ppl_diff", mean(&diff));
    put(
        metrics,
        "log_ppl_abs_diff",
        mean(&diff.iter().map(|d| d.abs()).collect::<Vec<_>>()),
    );
    put(metrics, "log_ppl_diff_max", max(&diff));
    put(metrics, "log_ppl_diff_min", min(&diff));
    put(
        metrics,
        "ppl_ratio",
        mean(&diff.iter().map(|d| d.exp()).collect::<Vec<_>>()),
    );
    let bound = |x: f64| x.clamp(-SAFETY_BOUND, SAFETY_BOUND);
    put(
        metrics,
        "chi2_token",
        b.mean(|k| bound(lr(k)).exp().powi(2)) - 1.0,
    );
    let lr_all: Vec<f64> = (0..train.len()).map(lr).collect();
    let seq: Vec<f64> = b
        .row_sum(&lr_all)
        .iter()
        .map(|s| (2.0 * bound(*s)).exp())
        .collect();
    put(metrics, "chi2_seq", mean(&seq) - 1.0);
}
