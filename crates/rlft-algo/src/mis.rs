//! slime's train/inference mismatch correction (`examples/train_infer_mismatch_helper/mis.py`):
//! per-sample truncated, clipped or masked importance weights of the trainer's `π_old` against
//! the rollout engine's `μ`, rejection of tokens or rows outside a band, a veto on rows with a
//! catastrophic token, and batch normalisation of the weights.
//!
//! slime computes per sample (rows cut to their length) and reports every metric as a sum over
//! samples of per-sample means `Σ_t x·m / max(n_i, 1)`; so does [`slime_mis`]. The arithmetic
//! runs on the host in f64.

use crate::correction::IsLevel;
use crate::masked::{check_shape, from_host, to_host};
use crate::{AlgoError, Result};
use burn::tensor::Tensor;
use std::collections::BTreeMap;

/// slime's safety bound on log-ratios before `exp`.
const SAFETY_BOUND: f64 = 20.0;

/// What TIS does with weights outside `[lower, upper]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TisMode {
    /// `clamp(w, 0, upper)`.
    Truncate,
    /// `clamp(w, lower, upper)`.
    Clip,
    /// Keep `w` as it is and drop the tokens outside the band from the mask.
    Mask,
}

/// slime's `--use-tis` settings with its MIS helper.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SlimeMisConfig {
    /// Level of the TIS log-ratio (`token`, `sequence` = row sum, `geometric` = row mean).
    pub tis_level: IsLevel,
    /// TIS mode.
    pub tis_mode: TisMode,
    /// Lower bound (default `1/upper`).
    pub tis_lower: Option<f64>,
    /// Upper bound.
    pub tis_upper: f64,
    /// Rejection sampling (`--use-rs`): level and bounds (default: the TIS bounds).
    pub rs: Option<(IsLevel, Option<f64>, Option<f64>)>,
    /// Veto threshold: rows with a token whose `π_old/μ` is below it are dropped (needs RS).
    pub veto: Option<f64>,
    /// Divide the weights by their batch mean (`token` or `sequence` level only).
    pub batch_normalize: bool,
}

impl SlimeMisConfig {
    /// The lower bound: `tis_lower`, else `1/tis_upper`.
    fn lower(&self) -> f64 {
        self.tis_lower.unwrap_or(1.0 / self.tis_upper)
    }
}

/// [`slime_mis`]'s result.
#[derive(Debug, Clone)]
pub struct SlimeMis {
    /// The weights (0 at padding), `[batch, T]`.
    pub weights: Tensor<2>,
    /// The mask after TIS mask mode, RS and veto, `[batch, T]`.
    pub mask: Tensor<2>,
    /// slime's `mis_*` metrics, each a sum over samples of per-sample means.
    pub metrics: BTreeMap<String, f64>,
}

/// Per-sample accumulation of `x·m / max(n, 1)` into named sums.
struct Acc<'a> {
    m: &'a [f64],
    n: f64,
    out: &'a mut BTreeMap<String, f64>,
}

impl Acc<'_> {
    fn tokens(&mut self, key: &str, x: impl Fn(usize) -> f64) {
        let s: f64 = (0..self.m.len()).map(|k| x(k) * self.m[k]).sum();
        *self.out.entry(format!("mis_{key}")).or_default() += s / self.n.max(1.0);
    }

    fn row(&mut self, key: &str, v: f64) {
        let e = self.out.entry(format!("mis_{key}")).or_default();
        if self.n > 0.0 {
            *e += v;
        }
    }
}

fn level_log_ratio(d: &[f64], m: &[f64], level: IsLevel) -> Vec<f64> {
    let sum: f64 = d.iter().zip(m).map(|(x, m)| x * m).sum();
    let n = m.iter().sum::<f64>().max(1.0);
    match level {
        IsLevel::Token => d.to_vec(),
        IsLevel::Sequence => vec![sum; d.len()],
        IsLevel::Geometric => vec![sum / n; d.len()],
    }
}

/// slime's `compute_mis_weights` on `[batch, T]` tensors (`train` = π_old, `rollout` = μ).
///
/// # Shapes
/// - every input `[batch, T]`
pub fn slime_mis(
    train_log_prob: &Tensor<2>,
    rollout_log_prob: &Tensor<2>,
    mask: &Tensor<2>,
    cfg: &SlimeMisConfig,
) -> Result<SlimeMis> {
    let dims = train_log_prob.dims();
    check_inputs(rollout_log_prob, mask, dims, cfg)?;
    let [b, t] = dims;
    let (tr, ro, mk) = (
        to_host(train_log_prob)?,
        to_host(rollout_log_prob)?,
        to_host(mask)?,
    );
    let mut metrics = BTreeMap::new();
    let mut weights = vec![0.0; b * t];
    let mut out_mask = vec![0.0; b * t];
    let mut per_sample: Vec<(std::ops::Range<usize>, f64)> = Vec::new();
    for i in 0..b {
        let r = i * t..(i + 1) * t;
        let m: Vec<f64> = mk[r.clone()].iter().map(|x| f64::from(*x > 0.5)).collect();
        let n: f64 = m.iter().sum();
        let mut acc = Acc {
            m: &m,
            n,
            out: &mut metrics,
        };
        let (w, modified) = acc.mis_row((&tr[r.clone()], &ro[r.clone()]), cfg);
        weights[r.clone()].copy_from_slice(&w);
        out_mask[r.clone()].copy_from_slice(&modified);
        per_sample.push((r, n));
    }
    let factor = cfg
        .batch_normalize
        .then(|| batch_normalize(&mut weights, &mk, &per_sample, cfg.tis_level));
    for (r, n) in &per_sample {
        let m: Vec<f64> = mk[r.clone()].iter().map(|x| f64::from(*x > 0.5)).collect();
        let w = &weights[r.clone()];
        let mut acc = Acc {
            m: &m,
            n: *n,
            out: &mut metrics,
        };
        if let Some(f) = factor {
            acc.row("batch_norm_factor", f);
        }
        let valid = || w.iter().zip(&m).filter(|(_, m)| **m > 0.0).map(|(w, _)| *w);
        acc.tokens("is_ratio_mean_final", |k| w[k]);
        acc.row("is_ratio_min_final", valid().fold(f64::INFINITY, f64::min));
        acc.row(
            "is_ratio_max_final",
            valid().fold(f64::NEG_INFINITY, f64::max),
        );
    }
    Ok(SlimeMis {
        weights: from_host(weights, dims, train_log_prob),
        mask: from_host(out_mask, dims, train_log_prob),
        metrics,
    })
}

/// The shapes and settings [`slime_mis`] refuses.
fn check_inputs(
    rollout_log_prob: &Tensor<2>,
    mask: &Tensor<2>,
    dims: [usize; 2],
    cfg: &SlimeMisConfig,
) -> Result<()> {
    check_shape(
        "rollout_log_prob",
        rollout_log_prob,
        dims,
        "the [batch, T] shape of the train log-probs",
    )?;
    check_shape(
        "response_mask",
        mask,
        dims,
        "the [batch, T] shape of the train log-probs",
    )?;
    if !(cfg.tis_upper.is_finite() && cfg.tis_upper > 0.0) {
        return Err(AlgoError::InvalidSetting {
            name: "tis_upper_bound",
            value: cfg.tis_upper,
            allowed: "must be finite and > 0 (typical: 2.0)",
        });
    }
    if cfg.batch_normalize && cfg.tis_level == IsLevel::Geometric {
        return Err(AlgoError::InvalidSpec {
            name: "tis_batch_normalize".into(),
            value: "true".into(),
            allowed: "slime normalises token- or sequence-level weights only; set tis_level to token or sequence, or switch batch normalisation off".into(),
        });
    }
    Ok(())
}

/// Divides `weights` by their batch mean (over tokens at token level, of the rows' means
/// otherwise); returns the factor (1 when the mean is ~0).
fn batch_normalize(
    weights: &mut [f64],
    mk: &[f64],
    per_sample: &[(std::ops::Range<usize>, f64)],
    level: IsLevel,
) -> f64 {
    let mean = match level {
        IsLevel::Token => {
            let s: f64 = (0..weights.len())
                .map(|k| weights[k] * f64::from(mk[k] > 0.5))
                .sum();
            let n: f64 = per_sample.iter().map(|(_, n)| n).sum();
            s / n.max(1.0)
        }
        _ => {
            let s: f64 = per_sample
                .iter()
                .map(|(r, n)| weights[r.clone()].iter().sum::<f64>() / n.max(1.0))
                .sum();
            s / per_sample.len().max(1) as f64
        }
    };
    if mean > 1e-8 {
        weights.iter_mut().for_each(|w| *w /= mean);
        mean
    } else {
        1.0
    }
}

impl Acc<'_> {
    /// One row's weights and mask from its π_old (`trv`) and μ (`rov`) log-probs, with its
    /// diagnostics, truncation and rejection metrics.
    fn mis_row(
        &mut self,
        (trv, rov): (&[f64], &[f64]),
        cfg: &SlimeMisConfig,
    ) -> (Vec<f64>, Vec<f64>) {
        let m = self.m;
        let t = m.len();
        let d: Vec<f64> = (0..t)
            .map(|k| if m[k] > 0.0 { trv[k] - rov[k] } else { 0.0 })
            .collect();
        self.diagnostics((trv, rov), &d);
        let lr_tis = level_log_ratio(&d, m, cfg.tis_level);
        let raw: Vec<f64> = lr_tis
            .iter()
            .map(|x| x.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp())
            .collect();
        self.tokens("tis_weight_before_bound", |k| raw[k]);
        let mut modified = m.to_vec();
        let w = self.bound(&raw, cfg, &mut modified);
        self.tokens("tis_weight_after_bound", |k| w[k]);
        if let Some(rs) = cfg.rs {
            self.reject(&d, &lr_tis, rs, cfg, &mut modified);
        }
        self.tokens("is_ratio_mean_after_tis_rs", |k| w[k]);
        (w, modified)
    }

    /// The gap between π_old and μ on one row: perplexities, KL estimates, χ².
    fn diagnostics(&mut self, (trv, rov): (&[f64], &[f64]), d: &[f64]) {
        let (m, n) = (self.m, self.n);
        let mean = |v: &[f64]| v.iter().zip(m).map(|(x, m)| x * m).sum::<f64>() / n.max(1.0);
        let (mt, mr) = (mean(trv), mean(rov));
        self.row("training_log_ppl", -mt);
        self.row("training_ppl", (-mt).exp());
        self.row("rollout_log_ppl", -mr);
        self.row("rollout_ppl", (-mr).exp());
        self.tokens("kl", |k| -d[k]);
        self.tokens("k3_kl", |k| d[k].exp() - d[k] - 1.0);
        self.row("log_ppl_diff", mr - mt);
        self.row("log_ppl_abs_diff", (mr - mt).abs());
        self.row("ppl_ratio", (mr - mt).exp());
        let rho2: Vec<f64> = d
            .iter()
            .map(|x| (2.0 * x.clamp(-SAFETY_BOUND, SAFETY_BOUND)).exp())
            .collect();
        self.row("chi2_token", mean(&rho2) - 1.0);
        let sum_d: f64 = d.iter().sum();
        self.row(
            "chi2_seq",
            (2.0 * sum_d.clamp(-SAFETY_BOUND, SAFETY_BOUND)).exp() - 1.0,
        );
    }

    /// The row's weights `raw` bounded as `cfg.tis_mode` says (masked tokens into `modified`).
    fn bound(&mut self, raw: &[f64], cfg: &SlimeMisConfig, modified: &mut [f64]) -> Vec<f64> {
        let (m, t) = (self.m, self.m.len());
        let lower = cfg.lower();
        match cfg.tis_mode {
            TisMode::Truncate => {
                self.tokens("tis_truncate_fraction", |k| {
                    f64::from(raw[k] > cfg.tis_upper)
                });
                (0..t)
                    .map(|k| raw[k].clamp(0.0, cfg.tis_upper) * m[k])
                    .collect()
            }
            TisMode::Clip => {
                self.tokens("tis_clip_fraction_low", |k| f64::from(raw[k] < lower));
                self.tokens("tis_clip_fraction_high", |k| {
                    f64::from(raw[k] > cfg.tis_upper)
                });
                (0..t)
                    .map(|k| raw[k].clamp(lower, cfg.tis_upper) * m[k])
                    .collect()
            }
            TisMode::Mask => {
                self.tokens("tis_mask_fraction_low", |k| f64::from(raw[k] < lower));
                self.tokens("tis_mask_fraction_high", |k| {
                    f64::from(raw[k] > cfg.tis_upper)
                });
                for k in 0..t {
                    modified[k] *= f64::from(raw[k] >= lower && raw[k] <= cfg.tis_upper);
                }
                (0..t).map(|k| raw[k] * m[k]).collect()
            }
        }
    }

    /// Rejection sampling at `level` within `[lo, hi]` (defaults: the truncation's bounds) and
    /// slime's veto of a row with a catastrophic token, into `modified`.
    fn reject(
        &mut self,
        d: &[f64],
        lr_tis: &[f64],
        (level, rs_lo, rs_hi): (IsLevel, Option<f64>, Option<f64>),
        cfg: &SlimeMisConfig,
        modified: &mut [f64],
    ) {
        let (m, t) = (self.m, self.m.len());
        let lower = cfg.lower();
        let (lo, hi) = (rs_lo.unwrap_or(lower), rs_hi.unwrap_or(cfg.tis_upper));
        let lr = if level == cfg.tis_level {
            lr_tis.to_vec()
        } else {
            level_log_ratio(d, m, level)
        };
        let ws: Vec<f64> = lr
            .iter()
            .map(|x| x.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp())
            .collect();
        self.tokens("rs_mask_fraction_low", |k| f64::from(ws[k] < lo));
        self.tokens("rs_mask_fraction_high", |k| f64::from(ws[k] > hi));
        for k in 0..t {
            modified[k] *= f64::from(ws[k] >= lo && ws[k] <= hi);
        }
        if let Some(v) = cfg.veto {
            let log_v = v.ln();
            let bad: Vec<bool> = (0..t).map(|k| m[k] > 0.0 && d[k] < log_v).collect();
            let any = bad.iter().any(|x| *x);
            self.tokens("rs_catastrophic_token_fraction", |k| f64::from(bad[k]));
            self.row("rs_catastrophic_seq_fraction", f64::from(any));
            if any {
                modified.iter_mut().for_each(|x| *x = 0.0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::t2;

    /// Token TIS truncates at the upper bound; the veto drops the row holding a token far below
    /// the threshold (a log-ratio beyond slime's ±20 safety bound stays finite).
    #[test]
    fn truncation_and_veto() {
        let train = t2(vec![0.0, 1.0, -30.0, 0.0], 2, 2);
        let rollout = t2(vec![0.0, 0.0, 0.0, 0.0], 2, 2);
        let m = t2(vec![1.0; 4], 2, 2);
        let cfg = SlimeMisConfig {
            tis_level: IsLevel::Token,
            tis_mode: TisMode::Truncate,
            tis_lower: None,
            tis_upper: 2.0,
            rs: Some((IsLevel::Token, Some(0.0), Some(1e9))),
            veto: Some(1e-4),
            batch_normalize: false,
        };
        let out = slime_mis(&train, &rollout, &m, &cfg).unwrap();
        let w = to_host(&out.weights).unwrap();
        assert_eq!(w[..2], [1.0, 2.0]);
        assert!(w[2].is_finite() && w[2] > 0.0);
        assert_eq!(to_host(&out.mask).unwrap(), vec![1.0, 1.0, 0.0, 0.0]);
        assert_eq!(out.metrics["mis_rs_catastrophic_seq_fraction"], 1.0);
        let geo = SlimeMisConfig {
            tis_level: IsLevel::Geometric,
            batch_normalize: true,
            ..cfg
        };
        assert!(slime_mis(&train, &rollout, &m, &geo).is_err());
    }
}
