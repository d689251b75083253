//! What the shared pipeline makes of a loss's [`LossTerms`]: the loss to differentiate, with
//! rollout IS weights, aggregation, the reference KL and the entropy bonus applied
//! ([`PolicyLossOutput`]), and its metrics ([`PolicyLossMetrics`], read back as
//! [`MetricValues`]).

use super::{LossContext, LossTerms, LossValue};
use crate::aggregation::aggregate_loss;
use crate::kl::kl_penalty;
use crate::masked::{masked_mean, masked_sum, to_host, valid, zero_padding};
use crate::ratio::LOG_RATIO_CLAMP;
use crate::{AlgoError, Result};
use burn::tensor::Tensor;
use std::collections::BTreeMap;

/// The loss to differentiate, and its metrics.
#[derive(Debug, Clone)]
pub struct PolicyLossOutput {
    /// Policy-gradient loss + β·KL − α·entropy, `[1]`.
    pub loss: Tensor<1>,
    /// Metrics (detached scalars).
    pub metrics: PolicyLossMetrics,
}

/// Detached `[1]` scalars describing one loss evaluation.
#[derive(Debug, Clone)]
pub struct PolicyLossMetrics {
    /// The policy-gradient part of the loss alone.
    pub pg_loss: Tensor<1>,
    /// Fraction of tokens clipped at the lower bound.
    pub clip_frac_low: Tensor<1>,
    /// Fraction of tokens clipped at the upper bound.
    pub clip_frac_high: Tensor<1>,
    /// Fraction of tokens capped by the dual clip.
    pub clip_frac_dual: Tensor<1>,
    /// Number of tokens clipped at the lower bound (0 for losses that do not count).
    pub clip_count_low: Tensor<1>,
    /// Number of tokens clipped at the upper bound.
    pub clip_count_high: Tensor<1>,
    /// Number of tokens capped by the dual clip.
    pub clip_count_dual: Tensor<1>,
    /// Number of masked tokens.
    pub valid_tokens: Tensor<1>,
    /// Number of masked tokens with a negative advantage.
    pub neg_adv_tokens: Tensor<1>,
    /// The importance ratio per token (detached), read with
    /// [`valid_ratios`](PolicyLossMetrics::valid_ratios).
    pub ratios: Tensor<2>,
    /// The response mask the loss used.
    pub mask: Tensor<2>,
    /// `mean(log μ − log πθ)`: k1 estimate of KL(μ‖πθ), a staleness gauge.
    pub approx_kl: Tensor<1>,
    /// `mean |log πθ − log μ|` (unclamped) over masked tokens (what verl's KL-Cov reports).
    pub mean_abs_log_ratio: Tensor<1>,
    /// Smallest importance ratio over masked tokens.
    pub ratio_min: Tensor<1>,
    /// Mean importance ratio over masked tokens.
    pub ratio_mean: Tensor<1>,
    /// Largest importance ratio over masked tokens.
    pub ratio_max: Tensor<1>,
    /// Mean reference KL over masked tokens (when `ref_log_prob` was given).
    pub kl: Option<Tensor<1>>,
    /// Mean entropy over masked tokens (when `entropy` was given).
    pub entropy: Option<Tensor<1>>,
    /// Loss-specific values under their anchor's names (see [`super::LossTerms::extras`]),
    /// read with [`read_extras`](PolicyLossMetrics::read_extras).
    pub extras: BTreeMap<String, Tensor<2>>,
}

/// [`PolicyLossMetrics`] read back to the host.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MetricValues {
    /// See [`PolicyLossMetrics::pg_loss`].
    pub pg_loss: f64,
    /// See [`PolicyLossMetrics::clip_frac_low`].
    pub clip_frac_low: f64,
    /// See [`PolicyLossMetrics::clip_frac_high`].
    pub clip_frac_high: f64,
    /// See [`PolicyLossMetrics::clip_frac_dual`].
    pub clip_frac_dual: f64,
    /// See [`PolicyLossMetrics::clip_count_low`].
    pub clip_count_low: f64,
    /// See [`PolicyLossMetrics::clip_count_high`].
    pub clip_count_high: f64,
    /// See [`PolicyLossMetrics::clip_count_dual`].
    pub clip_count_dual: f64,
    /// See [`PolicyLossMetrics::valid_tokens`].
    pub valid_tokens: f64,
    /// See [`PolicyLossMetrics::neg_adv_tokens`].
    pub neg_adv_tokens: f64,
    /// See [`PolicyLossMetrics::approx_kl`].
    pub approx_kl: f64,
    /// See [`PolicyLossMetrics::mean_abs_log_ratio`].
    pub mean_abs_log_ratio: f64,
    /// See [`PolicyLossMetrics::ratio_min`].
    pub ratio_min: f64,
    /// See [`PolicyLossMetrics::ratio_mean`].
    pub ratio_mean: f64,
    /// See [`PolicyLossMetrics::ratio_max`].
    pub ratio_max: f64,
    /// See [`PolicyLossMetrics::kl`].
    pub kl: Option<f64>,
    /// See [`PolicyLossMetrics::entropy`].
    pub entropy: Option<f64>,
}

impl PolicyLossMetrics {
    /// Reads every metric back to the host in one transfer.
    pub fn read(&self) -> Result<MetricValues> {
        let mut parts = vec![
            self.pg_loss.clone(),
            self.clip_frac_low.clone(),
            self.clip_frac_high.clone(),
            self.clip_frac_dual.clone(),
            self.approx_kl.clone(),
            self.ratio_min.clone(),
            self.ratio_mean.clone(),
            self.ratio_max.clone(),
            self.clip_count_low.clone(),
            self.clip_count_high.clone(),
            self.clip_count_dual.clone(),
            self.valid_tokens.clone(),
            self.neg_adv_tokens.clone(),
            self.mean_abs_log_ratio.clone(),
        ];
        parts.extend(self.kl.clone());
        parts.extend(self.entropy.clone());
        let v = to_host(&Tensor::cat(parts, 0))?;
        let mut extra = v[14..].iter().copied();
        Ok(MetricValues {
            pg_loss: v[0],
            clip_frac_low: v[1],
            clip_frac_high: v[2],
            clip_frac_dual: v[3],
            approx_kl: v[4],
            ratio_min: v[5],
            ratio_mean: v[6],
            ratio_max: v[7],
            clip_count_low: v[8],
            clip_count_high: v[9],
            clip_count_dual: v[10],
            valid_tokens: v[11],
            neg_adv_tokens: v[12],
            mean_abs_log_ratio: v[13],
            kl: self.kl.as_ref().and_then(|_| extra.next()),
            entropy: self.entropy.as_ref().and_then(|_| extra.next()),
        })
    }

    /// Every loss-specific value read back to the host (row-major).
    pub fn read_extras(&self) -> Result<BTreeMap<String, Vec<f64>>> {
        self.extras
            .iter()
            .map(|(k, t)| Ok((k.clone(), to_host(t)?)))
            .collect()
    }

    /// The importance ratios of the masked tokens, sorted ascending (for quantiles).
    pub fn valid_ratios(&self) -> Result<Vec<f64>> {
        let r = to_host(&self.ratios)?;
        let m = to_host(&self.mask)?;
        let mut v: Vec<f64> = r
            .into_iter()
            .zip(m)
            .filter(|(_, m)| *m > 0.5)
            .map(|(r, _)| r)
            .collect();
        v.sort_by(f64::total_cmp);
        Ok(v)
    }
}

/// The shared pipeline behind [`super::PolicyLoss::compute`].
pub(super) fn finish(ctx: &LossContext<'_>, terms: LossTerms) -> Result<PolicyLossOutput> {
    let input = ctx.input;
    let cfg = ctx.config;
    let mask = &input.response_mask;
    let pg_loss = match terms.value {
        LossValue::PerToken { loss, aggregation } => {
            let loss = match &input.rollout_is_weights {
                Some(w) => loss * w.clone(),
                None => loss,
            };
            let loss = match &input.loss_mask {
                Some(keep) => loss * keep.clone(),
                None => loss,
            };
            aggregate_loss(
                loss,
                mask,
                aggregation.unwrap_or(cfg.aggregation),
                &input.global,
            )?
        }
        LossValue::Reduced(loss) => loss,
    };
    let mut loss = pg_loss.clone();

    let kl = kl_term(ctx, &mut loss)?;
    let entropy = entropy_term(ctx, &mut loss)?;

    let raw = ctx.token_log_ratio().detach();
    let d = raw.clone().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP);
    let ratio = terms
        .ratio
        .map(|r| r.detach())
        .unwrap_or_else(|| d.clone().exp());
    let pad = valid(mask).bool_not();
    let pg_loss = pg_loss.detach();
    let zero = || pg_loss.zeros_like();
    let [count_low, count_high, count_dual] = terms
        .clip_counts
        .unwrap_or_else(|| [zero(), zero(), zero()]);
    let metrics = PolicyLossMetrics {
        pg_loss: pg_loss.clone(),
        clip_frac_low: terms.clip_frac_low.unwrap_or_else(zero),
        clip_frac_high: terms.clip_frac_high.unwrap_or_else(zero),
        clip_frac_dual: terms.clip_frac_dual.unwrap_or_else(zero),
        clip_count_low: count_low,
        clip_count_high: count_high,
        clip_count_dual: count_dual,
        valid_tokens: masked_sum(mask.ones_like(), mask).detach(),
        neg_adv_tokens: ctx.count(input.advantages.clone().lower_elem(0.0)),
        ratios: ratio.clone(),
        mask: mask.clone(),
        approx_kl: masked_mean(d.neg(), mask),
        mean_abs_log_ratio: masked_mean(raw.abs(), mask),
        ratio_min: ratio.clone().mask_fill(pad.clone(), f64::INFINITY).min(),
        ratio_mean: masked_mean(ratio.clone(), mask),
        ratio_max: ratio.mask_fill(pad, f64::NEG_INFINITY).max(),
        kl,
        entropy,
        extras: terms.extras,
    };
    Ok(PolicyLossOutput { loss, metrics })
}

/// The reference KL: added to `loss` as β · its aggregate when β > 0; returns its masked mean
/// for the metrics (`None` without reference log-probs).
fn kl_term(ctx: &LossContext<'_>, loss: &mut Tensor<1>) -> Result<Option<Tensor<1>>> {
    let (input, cfg) = (ctx.input, ctx.config);
    let mask = &input.response_mask;
    Ok(match &input.ref_log_prob {
        Some(r) => {
            let kl = kl_penalty(
                input.log_prob.clone(),
                r.clone(),
                cfg.kl_estimator,
                Some(mask),
            )?;
            let kl = if cfg.kl_bias_correction {
                zero_padding(kl * ctx.ratio(), mask)
            } else {
                kl
            };
            if cfg.kl_coef > 0.0 {
                *loss = loss.clone()
                    + aggregate_loss(kl.clone(), mask, cfg.aggregation, &input.global)?
                        * cfg.kl_coef;
            }
            Some(masked_mean(kl, mask).detach())
        }
        None if cfg.kl_coef > 0.0 => {
            return Err(AlgoError::MissingInput {
                loss: "reference KL".into(),
                input: "ref_log_prob",
                hint: "kl_coef > 0 needs reference log-probs: pass them with PolicyLossInput::with_ref_log_prob, or set kl_coef = 0",
            });
        }
        None => None,
    })
}

/// The entropy bonus: added to `loss` when its coefficient is > 0; returns the masked mean
/// entropy for the metrics (`None` without entropies).
fn entropy_term(ctx: &LossContext<'_>, loss: &mut Tensor<1>) -> Result<Option<Tensor<1>>> {
    let (input, cfg) = (ctx.input, ctx.config);
    let mask = &input.response_mask;
    Ok(match &input.entropy {
        Some(h) => {
            if cfg.entropy_coef > 0.0 {
                *loss = loss.clone()
                    + crate::entropy::entropy_bonus(
                        h.clone(),
                        mask,
                        cfg.aggregation,
                        &input.global,
                        cfg.entropy_coef,
                    )?;
            }
            Some(masked_mean(h.clone(), mask).detach())
        }
        None if cfg.entropy_coef > 0.0 => {
            return Err(AlgoError::MissingInput {
                loss: "entropy bonus".into(),
                input: "entropy",
                hint: "entropy_coef > 0 needs per-token entropy: pass entropy_from_logits(..) with PolicyLossInput::with_entropy, or set entropy_coef = 0",
            });
        }
        None => None,
    })
}
