//! What a recipe's `[algorithm]` resolves to — the loss and its settings, the advantage
//! estimator, the ratio's anchor and off-policy correction, the adaptive KL controller — and the
//! losses and reward terms a downstream trainer adds ([`Extensions`]). Recipe validation and the
//! trainer both resolve through here, so a recipe that validates builds.

use crate::correction::{CorrectionMode, RatioReference};
use crate::offpolicy::OffPolicy;
use crate::recipe::{KlPlacement, Recipe};
use crate::{Result, TrainError};
use rlft_algo::advantage::AdvantageEstimator;
use rlft_algo::kl::AdaptiveKlController;
use rlft_algo::loss::{LossRegistry, PolicyLoss, PolicyLossConfig};
use rlft_algo::ratio::RatioLevel;
use std::sync::Arc;

/// The loss, its settings and the advantage estimator a recipe selects.
#[derive(Clone)]
pub struct ResolvedAlgorithm {
    /// Registry name.
    pub loss: String,
    /// The loss, built from its own settings (`[algorithm.<section>]`, else its defaults).
    pub policy: Arc<dyn PolicyLoss>,
    /// The settings every loss shares (preset, then recipe overrides).
    pub config: PolicyLossConfig,
    /// Advantage estimator.
    pub advantage: AdvantageEstimator,
    /// The ratio's anchor and the off-policy correction.
    pub offpolicy: OffPolicy,
    /// The adaptive KL controller (`kl_target`, `kl_horizon`), starting at `kl_coef`.
    pub kl_control: Option<AdaptiveKlController>,
}

impl std::fmt::Debug for ResolvedAlgorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResolvedAlgorithm")
            .field("loss", &self.loss)
            .field("config", &self.config)
            .field("advantage", &self.advantage)
            .field("offpolicy", &self.offpolicy)
            .field("kl_control", &self.kl_control)
            .finish_non_exhaustive()
    }
}

impl Recipe {
    /// Checks every value's range and resolves `[algorithm]` against the built-in losses;
    /// messages say what is allowed.
    ///
    /// # Errors
    /// The first value out of range, or an algorithm setting that does not resolve.
    pub fn validate(&self) -> Result<()> {
        self.validate_with(&LossRegistry::with_builtins())
    }

    /// As [`Recipe::validate`], looking `algorithm.loss` up in `registry`. [`Recipe::load`]
    /// checks values only; the trainer makes the same checks with the registry it trains with
    /// ([`crate::Trainer::with_extensions`]) before anything is written, so a recipe file may
    /// name a loss a downstream trainer registered.
    ///
    /// # Errors
    /// As [`Recipe::validate`]; an unknown loss lists the registered names.
    pub fn validate_with(&self, registry: &LossRegistry) -> Result<()> {
        self.check_values()?;
        resolve_algorithm(self, registry).map(|_| ())
    }
}

/// Resolves `[algorithm]` against `registry` (also run by [`Recipe::validate_with`]).
pub fn resolve_algorithm(recipe: &Recipe, registry: &LossRegistry) -> Result<ResolvedAlgorithm> {
    let a = &recipe.algorithm;
    let preset = registry
        .resolve(&a.loss)
        .map_err(|e| TrainError::Recipe(format!("algorithm.loss: {e}")))?;
    let mut c = preset.config.clone();
    if let Some(v) = a.clip_low {
        c.clip_ratio_low = v;
    }
    if let Some(v) = a.clip_high {
        c.clip_ratio_high = v;
    }
    if let Some(level) = a.ratio_level {
        c.ratio_level = level;
    }
    if let Some(aggregation) = a.aggregation {
        c.aggregation = aggregation;
    }
    c.kl_estimator = a.kl_estimator;
    c.kl_bias_correction = a.kl_bias_correction;
    let policy = crate::recipe::losses::build_policy(a, registry)?;

    c.kl_coef = if a.kl_placement == KlPlacement::Loss {
        a.kl_coef
    } else {
        0.0
    };
    c.entropy_coef = a.entropy_coef;
    preset
        .validate(&c)
        .map_err(|e| TrainError::Recipe(format!("algorithm: {e}")))?;
    let advantage = recipe.checked_advantage(a.advantage.unwrap_or(preset.advantage))?;
    let correction = a.correction.resolve()?;
    let mode = a.correction.mode;
    if a.ratio_reference == RatioReference::Behaviour {
        if c.ratio_level != RatioLevel::Cumulative {
            return Err(TrainError::Recipe(format!(
                "algorithm.ratio_reference: \"behaviour\" applies to cumulative-ratio losses \
                 (ratio_level = \"cumulative\", e.g. loss = \"ctpo\"), not a {} ratio; remove it \
                 or set ratio_level = \"cumulative\"",
                c.ratio_level
            )));
        }
        if mode == CorrectionMode::Decoupled {
            return Err(TrainError::Recipe(
                "algorithm.ratio_reference: \"behaviour\" with mode = \"decoupled\" would count \
                 π_prox/μ twice (in the ratio and in the IS weights); use \"proximal\" or \
                 mode = \"bypass\""
                    .into(),
            ));
        }
    }
    let kl_control = a.kl_control()?;
    let offpolicy = OffPolicy {
        mode,
        correction,
        ratio_reference: a.ratio_reference,
        bypass_applies_weights: !registry
            .uses_importance_ratio(&a.loss)
            .map_err(|e| TrainError::Recipe(format!("algorithm.loss: {e}")))?,
        filtered_sampling: recipe.rollout.filtered()
            && a.sampling_mask == crate::correction::SamplingMask::Off,
        loglinear_prox: a.correction.prox == crate::correction::ProxMethod::Loglinear,
        opsm: (a.correction.opsm != crate::correction::Opsm::Off)
            .then(|| (a.correction.opsm, a.correction.opsm_delta.unwrap_or(0.0))),
        m2po_threshold: a.correction.m2po_threshold,
        kpop: a.correction.kpop_threshold.map(|upper| {
            use crate::correction::KpopLevel;
            use rlft_algo::decoupled::{
                RejectionAgg, RejectionConfig, RejectionLevel, RejectionMetric,
            };
            let (level, agg) = match a.correction.kpop_level {
                KpopLevel::Token => (RejectionLevel::Token, RejectionAgg::Mean),
                KpopLevel::SeqMean => (RejectionLevel::Sequence, RejectionAgg::Mean),
                KpopLevel::SeqMax => (RejectionLevel::Sequence, RejectionAgg::Max),
                KpopLevel::SeqSum => (RejectionLevel::Sequence, RejectionAgg::Sum),
            };
            RejectionConfig {
                level,
                metric: RejectionMetric::BinaryKl,
                agg,
                upper,
                lower: None,
            }
        }),
        veto_threshold: a.correction.veto_threshold,
    };
    Ok(ResolvedAlgorithm {
        loss: a.loss.clone(),
        policy,
        config: c,
        advantage,
        offpolicy,
        kl_control,
    })
}

/// What a downstream trainer adds to a recipe: its own losses, reward terms, environment and
/// evaluation set.
#[derive(Clone)]
pub struct Extensions {
    /// The loss registry (built-ins plus anything registered); `algorithm.loss` is looked up here.
    pub registry: LossRegistry,
    /// Extra weighted reward terms added to the task's verifier or the recipe's terms.
    pub rewards: Vec<(f64, Arc<dyn rlft_rollout::Reward>)>,
    /// The environment, instead of the recipe's (`[[tool]]`s, the task's, or single-turn).
    pub environment: Option<Arc<dyn rlft_rollout::Environment>>,
    /// The evaluation problems, instead of `data.eval` or the task's test split.
    pub eval_set: Option<Vec<rlft_rollout::Example>>,
    /// Under `[distributed] backend = "mpi"`: the learner's process ranks, of which this
    /// trainer is rank 0 (the others run [`crate::follower::Follower`]).
    pub group: Option<Arc<dyn crate::distributed::group::ProcessGroup>>,
}

impl Default for Extensions {
    fn default() -> Self {
        Self {
            registry: LossRegistry::with_builtins(),
            rewards: Vec::new(),
            environment: None,
            eval_set: None,
            group: None,
        }
    }
}
