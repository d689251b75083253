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
mod output;
mod prime;
mod registry;
mod reinforce;
mod reinforce_is;
mod sapo;
mod settings;
#[cfg(test)]
mod tests;
mod topr;
mod vespo;

pub use cispo::Cispo;
pub use clipped::ClippedSurrogate;
pub use cov::{ClipCov, ClipCovSettings, KlCov, KlCovSettings};
pub use dppo::{Dppo, DppoDivergence};
pub use dro::{Dro, DroSettings};
pub use geo_mean::GeoMean;
pub use gpg::Gpg;
pub use output::{MetricValues, PolicyLossMetrics, PolicyLossOutput};
pub use prime::{PrimeMask, PrimeRl, PrimeRlSettings};
pub use registry::{LossRegistry, LossSection, Preset};
pub use reinforce::Reinforce;
pub use reinforce_is::ReinforceIs;
pub use sapo::{Sapo, SapoSettings};
pub use settings::{LossSettings, SettingError};
pub use topr::{Topr, ToprSettings};
pub use vespo::{Vespo, VespoSettings};

use crate::aggregation::{GlobalBatchInfo, LossAggregation};
use crate::clip::{Bounds, ClipRange, CtpoBounds};
use crate::kl::KlEstimator;
use crate::logprob::check_bt;
use crate::masked::{masked_mean, masked_sum};
use crate::ratio::{CumulativeGradient, RatioLevel, log_ratio, token_log_ratio};
use crate::{AlgoError, Result};
use burn::config::Config;
use burn::tensor::{Bool, Tensor};
use std::collections::BTreeMap;

/// Settings every policy loss shares: the clip range, the ratio's level, the aggregation, the
/// reference KL and the entropy bonus. Presets ([`LossRegistry::resolve`]) fill them for a named
/// algorithm, and explicit settings override. A loss's own settings (VESPO's gamma weights,
/// Clip-Cov's band, …) live in the loss, read from its [`LossSettings`].
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
    /// β of the reference KL added to the loss (0: off; needs `ref_log_prob`).
    #[config(default = 0.0)]
    pub kl_coef: f64,
    /// Estimator of the reference KL.
    #[config(default = "KlEstimator::K3")]
    pub kl_estimator: KlEstimator,
    /// α of the entropy bonus subtracted from the loss (0: off; needs `entropy`).
    #[config(default = 0.0)]
    pub entropy_coef: f64,
    /// TRL's bias-corrected KL: the reference KL of each token is multiplied by the importance
    /// ratio `πθ/π_old` at the configured level, not detached (TRL's `use_bias_correction_kl`).
    #[config(default = false)]
    pub kl_bias_correction: bool,
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
        for (name, v) in [
            ("kl_coef", self.kl_coef),
            ("entropy_coef", self.entropy_coef),
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
    /// A keep mask (or weight) on the per-token policy loss that leaves every normaliser as the
    /// response mask gives it: off-policy sequence masks, top-entropy masks and rejection
    /// filters whose rejected tokens stay in the denominator.
    pub loss_mask: Option<Tensor<2>>,
    /// `log μ` of the behaviour (rollout / inference) policy, where it differs from
    /// `old_log_prob`.
    pub behaviour_log_prob: Option<Tensor<2>>,
    /// `log π_prox` of a proximal policy (decoupled PPO), where it differs from `old_log_prob`.
    pub prox_log_prob: Option<Tensor<2>>,
    /// The policy version that sampled each token (partial rollouts can change it mid-row).
    pub versions: Option<Tensor<2>>,
    /// One score (reward) per row, `[batch]`.
    pub scores: Option<Tensor<1>>,
    /// The rollout engine's per-token importance ratio `π_old/μ` (0 for rejected tokens, 1 at
    /// padding), which VESPO folds into its sequence weight over all positions.
    pub sampling_is_ratio: Option<Tensor<2>>,
    /// Seed of any host RNG the loss draws from (Clip-Cov's choice among its candidates); vary
    /// it per step for fresh draws.
    pub seed: u64,
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
            loss_mask: None,
            behaviour_log_prob: None,
            prox_log_prob: None,
            versions: None,
            scores: None,
            sampling_is_ratio: None,
            seed: 0,
        }
    }

    /// Sets the seed of the loss's host RNG.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Multiplies the per-token policy loss by `keep` (a `[batch, T]` or `[batch, 1]` mask or
    /// weight), leaving the normalisers alone; a second call multiplies the two.
    pub fn with_loss_mask(mut self, keep: Tensor<2>) -> Self {
        let [b, t] = self.log_prob.dims();
        let keep = keep.expand([b as i64, t as i64]);
        self.loss_mask = Some(match self.loss_mask.take() {
            Some(k) => k * keep,
            None => keep,
        });
        self
    }

    /// Adds the behaviour policy's log-probs `log μ`.
    pub fn with_behaviour_log_prob(mut self, mu: Tensor<2>) -> Self {
        self.behaviour_log_prob = Some(mu);
        self
    }

    /// Adds a proximal policy's log-probs `log π_prox`.
    pub fn with_prox_log_prob(mut self, prox: Tensor<2>) -> Self {
        self.prox_log_prob = Some(prox);
        self
    }

    /// Adds the per-token policy versions.
    pub fn with_versions(mut self, v: Tensor<2>) -> Self {
        self.versions = Some(v);
        self
    }

    /// Adds one score per row.
    pub fn with_scores(mut self, s: Tensor<1>) -> Self {
        self.scores = Some(s);
        self
    }

    /// Adds the rollout engine's per-token importance ratio.
    pub fn with_sampling_is_ratio(mut self, r: Tensor<2>) -> Self {
        self.sampling_is_ratio = Some(r);
        self
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
            ("loss_mask", &self.loss_mask),
            ("behaviour_log_prob", &self.behaviour_log_prob),
            ("prox_log_prob", &self.prox_log_prob),
            ("versions", &self.versions),
            ("sampling_is_ratio", &self.sampling_is_ratio),
        ] {
            if let Some(t) = t {
                check_bt(name, t, dims)?;
            }
        }
        if let Some(s) = &self.scores
            && s.dims()[0] != dims[0]
        {
            return Err(AlgoError::ShapeMismatch {
                name: "scores",
                expected: format!("one score per row: [{}]", dims[0]),
                got: s.dims().to_vec(),
            });
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
    /// Loss-specific detached values under the names their anchor logs them (scalars as
    /// `[1, 1]`, per-row values as `[batch, 1]`, per-token values as `[batch, T]`).
    pub extras: BTreeMap<String, Tensor<2>>,
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
            extras: BTreeMap::new(),
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

    /// The scores per row, or an error naming `loss` that needs them.
    pub fn scores(&self, loss: &str) -> Result<Tensor<1>> {
        self.input.scores.clone().ok_or_else(|| AlgoError::MissingInput {
            loss: loss.into(),
            input: "scores",
            hint: "this loss splits rows by their reward: pass one score per row with PolicyLossInput::with_scores",
        })
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
        output::finish(&ctx, terms)
    }
}
