//! Policy losses: one input, one output, one trait, and a registry keyed by name.
//!
//! Every loss sees the same [`PolicyLossInput`] (log πθ, log μ or log π_old, advantages, mask,
//! optional rollout IS weights, reference log-probs and entropy) and a [`PolicyLossConfig`]. It
//! returns per-token losses (or an already reduced scalar) plus its clip statistics; the shared
//! pipeline in [`PolicyLoss::compute`] applies the IS weights, aggregates with global
//! normalisation, adds the reference KL (β) and the entropy bonus (α), and fills the metrics.

mod cispo;
mod clipped;
mod cov;
mod dppo;
mod dro;
mod geo_mean;
mod gpg;
mod registry;
mod reinforce;
mod reinforce_is;
mod sapo;

pub use cispo::Cispo;
pub use clipped::ClippedSurrogate;
pub use cov::{ClipCov, KlCov};
pub use dppo::{Dppo, DppoDivergence};
pub use dro::Dro;
pub use geo_mean::GeoMean;
pub use gpg::Gpg;
pub use registry::{LossRegistry, Preset};
pub use reinforce::Reinforce;
pub use reinforce_is::ReinforceIs;
pub use sapo::Sapo;

use crate::aggregation::{GlobalBatchInfo, LossAggregation, aggregate_loss};
use crate::clip::{Bounds, ClipRange, CtpoBounds};
use crate::kl::{KlEstimator, kl_penalty};
use crate::logprob::check_bt;
use crate::masked::{masked_mean, masked_sum, to_host, valid};
use crate::ratio::{CumulativeGradient, LOG_RATIO_CLAMP, RatioLevel, log_ratio, token_log_ratio};
use crate::{AlgoError, Result};
use burn::config::Config;
use burn::tensor::{Bool, Tensor};

/// Settings shared by all policy losses. A loss reads the fields it needs; presets
/// ([`LossRegistry::resolve`]) fill them for a named algorithm, and explicit settings override.
#[derive(Config, Debug, PartialEq)]
pub struct PolicyLossConfig {
    /// ε_low: ratios are clipped below at `1 − clip_ratio_low`.
    #[config(default = 0.2)]
    pub clip_ratio_low: f64,
    /// ε_high: ratios are clipped above at `1 + clip_ratio_high` (DAPO: 0.28).
    #[config(default = 0.2)]
    pub clip_ratio_high: f64,
    /// Dual-clip constant `c > 1` for negative advantages (None: off).
    pub dual_clip: Option<f64>,
    /// Level of the importance ratio: token, sequence (GSPO) or cumulative (CTPO).
    #[config(default = "RatioLevel::Token")]
    pub ratio_level: RatioLevel,
    /// With [`RatioLevel::Cumulative`]: use the geometric mean of the prefix ratios.
    #[config(default = false)]
    pub cumulative_geometric_mean: bool,
    /// With [`RatioLevel::Cumulative`]: whether the gradient flows through the current token
    /// only (the CTPO authors' form, default) or through the whole prefix.
    #[config(default = "CumulativeGradient::CurrentToken")]
    pub cumulative_gradient: CumulativeGradient,
    /// How per-token losses are reduced.
    #[config(default = "LossAggregation::TokenMean")]
    pub aggregation: LossAggregation,
    /// CTPO's position-adaptive log-space bounds (used by `ctpo`).
    #[config(default = "CtpoBounds::default()")]
    pub ctpo: CtpoBounds,
    /// DRO's quadratic penalty β on the log-ratio.
    #[config(default = 0.1)]
    pub dro_beta: f64,
    /// Clip-Cov: fraction of the valid tokens whose gradient is detached (at least one).
    #[config(default = 0.0002)]
    pub clip_cov_ratio: f64,
    /// Clip-Cov: candidates have a covariance above this.
    #[config(default = 1.0)]
    pub clip_cov_lb: f64,
    /// Clip-Cov: candidates have a covariance below this.
    #[config(default = 5.0)]
    pub clip_cov_ub: f64,
    /// Clip-Cov: seed of the host RNG that draws among the candidates.
    #[config(default = 0)]
    pub clip_cov_seed: u64,
    /// KL-Cov: fraction of the valid tokens that get the |log ρ| penalty (at least one).
    #[config(default = 0.0002)]
    pub kl_cov_ratio: f64,
    /// KL-Cov: coefficient of the |log ρ| penalty.
    #[config(default = 0.1)]
    pub ppo_kl_coef: f64,
    /// SAPO gate temperature for positive advantages.
    #[config(default = 1.0)]
    pub sapo_tau_pos: f64,
    /// SAPO gate temperature for non-positive advantages.
    #[config(default = 1.05)]
    pub sapo_tau_neg: f64,
    /// β of the reference KL added to the loss (0: off; needs `ref_log_prob`).
    #[config(default = 0.0)]
    pub kl_coef: f64,
    /// Estimator of the reference KL.
    #[config(default = "KlEstimator::K3")]
    pub kl_estimator: KlEstimator,
    /// α of the entropy bonus subtracted from the loss (0: off; needs `entropy`).
    #[config(default = 0.0)]
    pub entropy_coef: f64,
}

impl PolicyLossConfig {
    /// The clip range `[1 − low, 1 + high]` with the dual clip.
    pub fn clip_range(&self) -> ClipRange {
        ClipRange::decoupled(self.clip_ratio_low, self.clip_ratio_high).with_dual(self.dual_clip)
    }

    /// Range-checks every field; the error says what is allowed.
    pub fn validate(&self) -> Result<()> {
        self.clip_range().validate(false)?;
        self.ctpo.validate()?;
        let positive = [
            ("dro_beta", self.dro_beta),
            ("sapo_tau_pos", self.sapo_tau_pos),
            ("sapo_tau_neg", self.sapo_tau_neg),
        ];
        for (name, v) in positive {
            if !(v.is_finite() && v > 0.0) {
                return Err(AlgoError::InvalidSetting {
                    name,
                    value: v,
                    allowed: "must be finite and > 0",
                });
            }
        }
        for (name, v) in [
            ("clip_cov_ratio", self.clip_cov_ratio),
            ("kl_cov_ratio", self.kl_cov_ratio),
        ] {
            if !(v.is_finite() && v > 0.0 && v <= 1.0) {
                return Err(AlgoError::InvalidSetting {
                    name,
                    value: v,
                    allowed: "must be in (0, 1] (the fraction of tokens selected; verl's default 0.0002)",
                });
            }
        }
        if self.clip_cov_lb.partial_cmp(&self.clip_cov_ub) != Some(std::cmp::Ordering::Less) {
            return Err(AlgoError::InvalidSetting {
                name: "clip_cov_ub",
                value: self.clip_cov_ub,
                allowed: "must be above clip_cov_lb (defaults 1.0 and 5.0)",
            });
        }
        for (name, v) in [
            ("kl_coef", self.kl_coef),
            ("entropy_coef", self.entropy_coef),
            ("ppo_kl_coef", self.ppo_kl_coef),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(AlgoError::InvalidSetting {
                    name,
                    value: v,
                    allowed: "must be finite and >= 0 (0 switches the term off)",
                });
            }
        }
        Ok(())
    }
}

/// Everything a policy loss may read. All tensors are `[batch, T]`.
#[derive(Debug, Clone)]
pub struct PolicyLossInput {
    /// `log πθ` of the sampled tokens: the tensor that is differentiated.
    pub log_prob: Tensor<2>,
    /// `log μ` (behaviour) or `log π_old` (proximal) of the same tokens.
    pub old_log_prob: Tensor<2>,
    /// Advantages `A` per token.
    pub advantages: Tensor<2>,
    /// `1.0` where the token is trained on, `0.0` for padding and tool observations.
    pub response_mask: Tensor<2>,
    /// Per-token importance weights correcting rollout/learner mismatch (multiply the loss).
    pub rollout_is_weights: Option<Tensor<2>>,
    /// `log π_ref` for the reference KL term.
    pub ref_log_prob: Option<Tensor<2>>,
    /// Per-token policy entropy for the entropy bonus.
    pub entropy: Option<Tensor<2>>,
    /// Normalisers of the whole batch when this is a micro-batch or one rank's share.
    pub global: GlobalBatchInfo,
}

impl PolicyLossInput {
    /// The four required tensors; shapes are checked when the loss runs.
    pub fn new(
        log_prob: Tensor<2>,
        old_log_prob: Tensor<2>,
        advantages: Tensor<2>,
        response_mask: Tensor<2>,
    ) -> Self {
        Self {
            log_prob,
            old_log_prob,
            advantages,
            response_mask,
            rollout_is_weights: None,
            ref_log_prob: None,
            entropy: None,
            global: GlobalBatchInfo::local(),
        }
    }

    /// Adds rollout importance weights.
    pub fn with_rollout_is_weights(mut self, w: Tensor<2>) -> Self {
        self.rollout_is_weights = Some(w);
        self
    }

    /// Adds reference log-probs (for the KL term).
    pub fn with_ref_log_prob(mut self, r: Tensor<2>) -> Self {
        self.ref_log_prob = Some(r);
        self
    }

    /// Adds per-token entropy (for the entropy bonus and metric).
    pub fn with_entropy(mut self, h: Tensor<2>) -> Self {
        self.entropy = Some(h);
        self
    }

    /// Sets the whole-batch normalisers.
    pub fn with_global(mut self, g: GlobalBatchInfo) -> Self {
        self.global = g;
        self
    }

    fn validate(&self) -> Result<()> {
        let dims = self.log_prob.dims();
        check_bt("old_log_prob", &self.old_log_prob, dims)?;
        check_bt("advantages", &self.advantages, dims)?;
        check_bt("response_mask", &self.response_mask, dims)?;
        for (name, t) in [
            ("rollout_is_weights", &self.rollout_is_weights),
            ("ref_log_prob", &self.ref_log_prob),
            ("entropy", &self.entropy),
        ] {
            if let Some(t) = t {
                check_bt(name, t, dims)?;
            }
        }
        Ok(())
    }
}

/// What a loss hands back to the shared pipeline.
#[derive(Debug, Clone)]
pub struct LossTerms {
    /// The loss before IS weights and aggregation, or already reduced.
    pub value: LossValue,
    /// Fraction of tokens clipped at the lower bound (where the clip changed the loss).
    pub clip_frac_low: Option<Tensor<1>>,
    /// Fraction of tokens clipped at the upper bound.
    pub clip_frac_high: Option<Tensor<1>>,
    /// Fraction of negative-advantage tokens capped by the dual clip.
    pub clip_frac_dual: Option<Tensor<1>>,
    /// Numbers of tokens clipped at the lower bound, at the upper bound and by the dual clip.
    pub clip_counts: Option<[Tensor<1>; 3]>,
    /// The importance ratio the loss used (for min/mean/max metrics); default: token ratio.
    pub ratio: Option<Tensor<2>>,
}

impl LossTerms {
    /// Per-token losses, aggregated with the configured mode.
    pub fn per_token(loss: Tensor<2>) -> Self {
        Self::from_value(LossValue::PerToken {
            loss,
            aggregation: None,
        })
    }

    /// Any value, no clip statistics.
    pub fn from_value(value: LossValue) -> Self {
        Self {
            value,
            clip_frac_low: None,
            clip_frac_high: None,
            clip_frac_dual: None,
            clip_counts: None,
            ratio: None,
        }
    }
}

/// A loss value before the pipeline finishes it.
#[derive(Debug, Clone)]
pub enum LossValue {
    /// `[batch, T]` per-token losses; IS weights multiply them, then they are aggregated with
    /// `aggregation` (the configured mode when None).
    PerToken {
        /// The per-token losses.
        loss: Tensor<2>,
        /// A mode the loss always uses (SAPO), overriding the configured one.
        aggregation: Option<LossAggregation>,
    },
    /// A `[1]` scalar the loss reduced itself (it applied IS weights itself).
    Reduced(Tensor<1>),
}

/// The view of one batch a loss computes from.
pub struct LossContext<'a> {
    /// The inputs.
    pub input: &'a PolicyLossInput,
    /// The settings.
    pub config: &'a PolicyLossConfig,
}

impl LossContext<'_> {
    /// `log πθ − log μ` per token, unclamped, 0 at unmasked positions.
    pub fn token_log_ratio(&self) -> Tensor<2> {
        token_log_ratio(
            self.input.log_prob.clone(),
            self.input.old_log_prob.clone(),
            &self.input.response_mask,
        )
    }

    /// The importance ratio at the configured level (see [`crate::ratio::log_ratio`]).
    pub fn ratio(&self) -> Tensor<2> {
        log_ratio(
            self.input.log_prob.clone(),
            self.input.old_log_prob.clone(),
            &self.input.response_mask,
            self.config.ratio_level,
            self.config.cumulative_geometric_mean,
            self.config.cumulative_gradient,
        )
        .exp()
    }

    /// Masked mean of a condition (a fraction of masked tokens), verl's `masked_mean` semantics.
    pub fn fraction(&self, cond: Tensor<2, Bool>) -> Tensor<1> {
        masked_mean(
            cond.float().cast(self.input.log_prob.dtype()),
            &self.input.response_mask,
        )
        .detach()
    }

    /// Number of masked tokens where `cond` holds.
    pub fn count(&self, cond: Tensor<2, Bool>) -> Tensor<1> {
        masked_sum(
            cond.float().cast(self.input.log_prob.dtype()),
            &self.input.response_mask,
        )
        .detach()
    }

    /// `A < 0`, `A > 0` masks.
    pub fn advantage_signs(&self) -> (Tensor<2, Bool>, Tensor<2, Bool>) {
        let a = &self.input.advantages;
        (a.clone().lower_elem(0.0), a.clone().greater_elem(0.0))
    }

    pub(crate) fn bounds(&self, position_adaptive: bool) -> Bounds {
        if position_adaptive {
            Bounds::position_adaptive(&self.config.ctpo, &self.input.response_mask)
        } else {
            Bounds::from_range(&self.config.clip_range(), &self.input.log_prob)
        }
    }
}

/// A policy-gradient loss. Implement [`terms`](PolicyLoss::terms); [`compute`](PolicyLoss::compute)
/// runs the shared pipeline around it. Register it in a [`LossRegistry`] to use it by name.
pub trait PolicyLoss: Send + Sync {
    /// Per-token losses (or a reduced scalar) and clip statistics for one batch.
    fn terms(&self, ctx: &LossContext<'_>) -> Result<LossTerms>;

    /// Whether the loss couples the tokens of a batch (selects tokens by batch statistics), so
    /// that splitting a batch into micro-batches or ranks changes it (`clip_cov`, `kl_cov`).
    /// Every other loss gives the whole batch's gradient however the batch is split.
    fn batch_coupled(&self) -> bool {
        false
    }

    /// Whether the loss's value carries an importance ratio `πθ / π_old`. Losses without one
    /// (`reinforce_is`, `gpg`) take rollout IS weights as their only off-policy correction;
    /// with μ as the anchor (bypass), a ratio-carrying loss is already corrected by its ratio.
    fn uses_importance_ratio(&self) -> bool {
        true
    }

    /// Validates the inputs, computes [`terms`](PolicyLoss::terms), applies rollout IS weights,
    /// aggregates, and adds `β·KL(πθ‖π_ref)` and `−α·H`.
    fn compute(
        &self,
        input: &PolicyLossInput,
        config: &PolicyLossConfig,
    ) -> Result<PolicyLossOutput> {
        input.validate()?;
        config.validate()?;
        let ctx = LossContext { input, config };
        let terms = self.terms(&ctx)?;
        finish(&ctx, terms)
    }
}

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

fn finish(ctx: &LossContext<'_>, terms: LossTerms) -> Result<PolicyLossOutput> {
    let input = ctx.input;
    let cfg = ctx.config;
    let mask = &input.response_mask;
    let pg_loss = match terms.value {
        LossValue::PerToken { loss, aggregation } => {
            let loss = match &input.rollout_is_weights {
                Some(w) => loss * w.clone(),
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

    let kl = match &input.ref_log_prob {
        Some(r) => {
            let kl = kl_penalty(
                input.log_prob.clone(),
                r.clone(),
                cfg.kl_estimator,
                Some(mask),
            )?;
            if cfg.kl_coef > 0.0 {
                loss = loss
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
    };
    let entropy = match &input.entropy {
        Some(h) => {
            if cfg.entropy_coef > 0.0 {
                loss = loss
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
    };

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
    };
    Ok(PolicyLossOutput { loss, metrics })
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{DType, Device, TensorData};

    fn t2(v: Vec<f64>, b: usize, t: usize, dev: &Device) -> Tensor<2> {
        Tensor::from_data(TensorData::new(v, [b, t]), (dev, DType::F64))
    }

    /// A batch with drifting ratios, mixed-sign advantages and one padded tail.
    fn batch(dev: &Device) -> PolicyLossInput {
        let (b, t) = (3, 5);
        let lp: Vec<f64> = (0..b * t).map(|k| -0.2 - 0.1 * (k % 7) as f64).collect();
        let old: Vec<f64> = (0..b * t)
            .map(|k| -0.2 - 0.1 * (k % 7) as f64 - 0.15 * ((k % 3) as f64 - 1.0))
            .collect();
        let adv: Vec<f64> = (0..b * t)
            .map(|k| if (k / t) % 2 == 0 { 1.0 } else { -0.5 })
            .collect();
        let mask: Vec<f64> = (0..b * t)
            .map(|k| if k / t == 2 && k % t >= 3 { 0.0 } else { 1.0 })
            .collect();
        let lp = t2(lp, b, t, dev);
        let lp = if dev.is_autodiff() {
            lp.require_grad()
        } else {
            lp
        };
        PolicyLossInput::new(
            lp,
            t2(old, b, t, dev),
            t2(adv, b, t, dev),
            t2(mask, b, t, dev),
        )
    }

    fn loss_and_grad(name: &str, cfg: &PolicyLossConfig) -> (f64, Vec<f64>) {
        let dev = Device::flex().autodiff();
        let input = batch(&dev);
        let out = LossRegistry::with_builtins()
            .compute(name, &input, cfg)
            .unwrap();
        let g = input.log_prob.grad(&out.loss.backward()).unwrap();
        (to_host(&out.loss).unwrap()[0], to_host(&g).unwrap())
    }

    #[test]
    fn ratio_level_is_orthogonal_to_the_loss() {
        // PPO-clip at sequence level without dual clip is GSPO.
        let cfg = PolicyLossConfig::new()
            .with_ratio_level(RatioLevel::Sequence)
            .with_clip_ratio_low(0.01);
        let (a, ga) = loss_and_grad("ppo", &cfg);
        let (b, gb) = loss_and_grad("gspo", &cfg);
        assert!((a - b).abs() < 1e-15 && ga == gb);
        // ...and differs from token level.
        let (c, _) = loss_and_grad("ppo", &cfg.clone().with_ratio_level(RatioLevel::Token));
        assert!((a - c).abs() > 1e-6);
        // Every registered loss runs at every level.
        for name in LossRegistry::with_builtins().names() {
            for (level, _) in RatioLevel::ALL {
                let (v, g) = loss_and_grad(&name, &PolicyLossConfig::new().with_ratio_level(level));
                assert!(
                    v.is_finite() && g.iter().all(|x| x.is_finite()),
                    "{name} at {level}"
                );
                assert!(
                    g[13] == 0.0 && g[14] == 0.0,
                    "{name}: padding got a gradient"
                );
            }
        }
    }

    /// CTPO keeps exploding cumulative ratios bounded: loss and gradient stay finite where
    /// the unclipped cumulative product over 100 steps of 1.05 would be ≈ 131.5.
    #[test]
    fn ctpo_stays_finite_on_exploding_products() {
        let dev = Device::flex().autodiff();
        let (b, t) = (2, 100);
        let lp = t2(vec![1.05f64.ln() - 1.0; b * t], b, t, &dev).require_grad();
        let old = t2(vec![-1.0; b * t], b, t, &dev);
        let adv = t2(
            (0..b * t).map(|k| if k < t { 1.0 } else { -1.0 }).collect(),
            b,
            t,
            &dev,
        );
        let input = PolicyLossInput::new(lp.clone(), old, adv, t2(vec![1.0; b * t], b, t, &dev));
        let registry = LossRegistry::with_builtins();
        let cfg = registry.resolve("ctpo").unwrap().config;
        let out = registry.compute("ctpo", &input, &cfg).unwrap();
        let m = out.metrics.read().unwrap();
        assert!(
            (m.ratio_max - 1.05f64.powi(100)).abs() < 1e-6,
            "{}",
            m.ratio_max
        );
        // A < 0 row: capped by the dual bound exp(0.05·√t) ≤ e^0.5; A > 0 row: clipped at the upper bound.
        assert!(
            m.pg_loss.abs() < 2.0 && m.clip_frac_high > 0.45 && m.clip_frac_dual > 0.45,
            "{m:?}"
        );
        let g = to_host(&lp.grad(&out.loss.backward()).unwrap()).unwrap();
        assert!(g.iter().all(|x| x.is_finite()));
    }

    /// The CTPO authors' cumulative ratio: per-token log-ratios clamped at ±20 before the sum,
    /// the sum capped at 10 (value e^10, zero gradient there), the gradient of the current token
    /// only; `FullPrefix` sends each token's gradient to its whole prefix.
    #[test]
    fn cumulative_ratio_is_capped_and_passes_the_current_token_gradient() {
        let dev = Device::flex().autodiff();
        // Row 0: log-ratios 6, 6, 0.5 → cumulative 6, 12 (capped), 12.5 (capped).
        // Row 1: log-ratio -25 (clamped to -20 in the value), then 0.1, 0.1.
        let lp = t2(vec![6.0, 6.0, 0.5, -25.0, 0.1, 0.1], 2, 3, &dev).require_grad();
        let old = t2(vec![0.0; 6], 2, 3, &dev);
        // A < 0 on row 0 (large ratios stay unclipped), A > 0 on row 1 (small ones do).
        let adv = t2(vec![-1.0, -1.0, -1.0, 1.0, 1.0, 1.0], 2, 3, &dev);
        let mask = t2(vec![1.0; 6], 2, 3, &dev);
        let input = PolicyLossInput::new(lp.clone(), old, adv, mask);
        let registry = LossRegistry::with_builtins();
        let cfg = PolicyLossConfig::new().with_ratio_level(RatioLevel::Cumulative);
        let out = registry.compute("ppo", &input, &cfg).unwrap();
        let ratios = out.metrics.valid_ratios().unwrap();
        assert!((ratios[5] - 10f64.exp()).abs() < 1e-6 && (ratios[4] - 10f64.exp()).abs() < 1e-6);
        assert!((ratios[0] - (-20f64).exp()).abs() < 1e-20, "{ratios:?}");
        let g = to_host(&lp.grad(&out.loss.backward()).unwrap()).unwrap();
        // token-mean over 6 tokens of -A·r: d/dlp_t = -A_t·r_t / 6 where not capped.
        assert!((g[0] - 6f64.exp() / 6.0).abs() < 1e-9, "{g:?}");
        assert_eq!((g[1], g[2]), (0.0, 0.0), "capped tokens get no gradient");
        assert!((g[3] + (-20f64).exp() / 6.0).abs() < 1e-20, "{g:?}");
        let r5 = (-19.8f64).exp();
        assert!((g[5] + r5 / 6.0).abs() < 1e-20);

        let full = cfg.with_cumulative_gradient(CumulativeGradient::FullPrefix);
        let out = registry.compute("ppo", &input, &full).unwrap();
        let gf = to_host(&lp.grad(&out.loss.backward()).unwrap()).unwrap();
        // Row 1 (no cap): token 4's gradient also carries token 5's; the clamped token none.
        assert!(
            (gf[4] + ((-19.9f64).exp() + r5) / 6.0).abs() < 1e-20,
            "{gf:?}"
        );
        assert_eq!(gf[3], 0.0);
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        let dev = Device::flex();
        let registry = LossRegistry::with_builtins();
        let cfg = PolicyLossConfig::new();
        let good = batch(&dev);

        let err = registry
            .compute("pppo", &good, &cfg)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("unknown policy loss 'pppo'")
                && err.contains("dapo")
                && err.contains("ctpo"),
            "{err}"
        );

        let mut bad = good.clone();
        bad.advantages = t2(vec![0.0; 4], 2, 2, &dev);
        let err = registry.compute("ppo", &bad, &cfg).unwrap_err().to_string();
        assert!(err.contains("`advantages` has shape [2, 2]"), "{err}");

        let bad = good
            .clone()
            .with_rollout_is_weights(t2(vec![1.0; 3], 3, 1, &dev));
        assert!(registry.compute("ppo", &bad, &cfg).is_err());

        let err = registry
            .compute("ppo", &good, &cfg.clone().with_clip_ratio_low(-0.1))
            .unwrap_err();
        assert!(err.to_string().contains("clip_ratio_low"), "{err}");
        let err = registry
            .compute("ppo", &good, &cfg.clone().with_dual_clip(Some(0.9)))
            .unwrap_err();
        assert!(err.to_string().contains("dual_clip"), "{err}");
        // DAPO's Clip-Higher requires high >= low; plain PPO does not.
        let lowered = registry
            .resolve("dapo")
            .unwrap()
            .config
            .with_clip_ratio_high(0.1);
        assert!(registry.compute("dapo", &good, &lowered).is_err());
        assert!(registry.compute("ppo", &good, &lowered).is_ok());

        let err = registry
            .compute("grpo", &good, &registry.resolve("grpo").unwrap().config)
            .unwrap_err();
        assert!(err.to_string().contains("ref_log_prob"), "{err}");
        let err = registry
            .compute("ppo", &good, &cfg.clone().with_entropy_coef(0.01))
            .unwrap_err();
        assert!(err.to_string().contains("entropy"), "{err}");
    }

    #[test]
    fn kl_and_entropy_terms_add_to_the_loss() {
        let dev = Device::flex();
        let registry = LossRegistry::with_builtins();
        let input = batch(&dev);
        let reference = input.old_log_prob.clone() - 0.3;
        let entropy = input.old_log_prob.clone().ones_like() * 2.0;
        let cfg = PolicyLossConfig::new();
        let base = to_host(&registry.compute("ppo", &input, &cfg).unwrap().loss).unwrap()[0];
        let full_input = input.with_ref_log_prob(reference).with_entropy(entropy);
        let out = registry
            .compute(
                "ppo",
                &full_input,
                &cfg.clone().with_kl_coef(0.1).with_entropy_coef(0.01),
            )
            .unwrap();
        let m = out.metrics.read().unwrap();
        let (kl, h) = (m.kl.unwrap(), m.entropy.unwrap());
        assert!((h - 2.0).abs() < 1e-7 && kl > 0.0);
        let total = to_host(&out.loss).unwrap()[0];
        // token-mean KL is the masked mean here (one reduction), so the sum is exact up to eps.
        assert!(
            (total - (base + 0.1 * kl - 0.01 * 2.0)).abs() < 1e-7,
            "{total} vs {base}"
        );
    }
}
