//! What a recipe's `[algorithm]` resolves to — the loss and its settings, the advantage
//! estimator, the ratio's anchor and off-policy correction, the adaptive KL controller — and the
//! losses and reward terms a downstream trainer adds ([`Extensions`]). Recipe validation and the
//! trainer both resolve through here, so a recipe that validates builds.

use crate::correction::{CorrectionMode, RatioReference};
use crate::offpolicy::OffPolicy;
use crate::recipe::{KlPlacement, Recipe};
use crate::{Result, TrainError};
use rlft_algo::advantage::AdvantageEstimator;
use rlft_algo::aggregation::LossAggregation;
use rlft_algo::kl::{AdaptiveKlController, KlEstimator};
use rlft_algo::loss::{LossRegistry, PolicyLossConfig};
use rlft_algo::ratio::RatioLevel;
use std::sync::Arc;

/// The loss, its settings and the advantage estimator a recipe selects.
#[derive(Debug, Clone)]
pub struct ResolvedAlgorithm {
    /// Registry name.
    pub loss: String,
    /// Loss settings (preset, then recipe overrides).
    pub config: PolicyLossConfig,
    /// Advantage estimator.
    pub advantage: AdvantageEstimator,
    /// The ratio's anchor and the off-policy correction.
    pub offpolicy: OffPolicy,
    /// The adaptive KL controller (`kl_target`, `kl_horizon`), starting at `kl_coef`.
    pub kl_control: Option<AdaptiveKlController>,
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
    if !a.ratio_level.is_empty() {
        c.ratio_level = a
            .ratio_level
            .parse::<RatioLevel>()
            .map_err(|e| TrainError::Recipe(format!("algorithm.ratio_level: {e}")))?;
    }
    if !a.aggregation.is_empty() {
        c.aggregation = a
            .aggregation
            .parse::<LossAggregation>()
            .map_err(|e| TrainError::Recipe(format!("algorithm.aggregation: {e}")))?;
    }
    c.kl_estimator = a
        .kl_estimator
        .parse::<KlEstimator>()
        .map_err(|e| TrainError::Recipe(format!("algorithm.kl_estimator: {e}")))?;
    c.kl_coef = if a.kl_placement == KlPlacement::Loss {
        a.kl_coef
    } else {
        0.0
    };
    c.entropy_coef = a.entropy_coef;
    preset
        .validate(&c)
        .map_err(|e| TrainError::Recipe(format!("algorithm: {e}")))?;
    let mut advantage = preset.advantage;
    if !a.advantage.is_empty() {
        advantage = AdvantageEstimator::from_name(&a.advantage)
            .map_err(|e| TrainError::Recipe(format!("algorithm.advantage: {e}")))?;
    }
    if let AdvantageEstimator::Gae { .. } = advantage {
        advantage = AdvantageEstimator::Gae {
            gamma: a.gamma,
            lam: a.lam,
        };
        if !recipe.model.critic {
            return Err(TrainError::Recipe(
                "algorithm.advantage = 'gae' needs a critic: set model.critic = true".into(),
            ));
        }
    }
    if advantage.needs_reward_baselines() {
        return Err(TrainError::Recipe(
            "algorithm.advantage = 'remax' needs the reward of a greedy response per prompt, \
             which the trainer does not generate; use it through the library \
             (AdvantageInput::with_reward_baselines) or choose grpo, rloo, opo, gpg, ..."
                .into(),
        ));
    }
    let correction = a.correction.resolve()?;
    let mode = a.correction.mode;
    if mode == CorrectionMode::Bypass && recipe.model.critic {
        return Err(TrainError::Recipe(
            "algorithm.correction.mode: \"bypass\" skips the π_old pass that gives a critic its \
             old values (model.critic = true); use mode = \"decoupled\" or \"recompute\", or \
             drop the critic"
                .into(),
        ));
    }
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
    let kl_control = match (a.kl_target, a.kl_horizon) {
        (None, None) => None,
        (Some(target), Some(horizon)) => Some(
            AdaptiveKlController::new(a.kl_coef, target, horizon).map_err(|e| {
                TrainError::Recipe(format!(
                    "algorithm.kl_target / kl_horizon / kl_coef (β's start): {e}"
                ))
            })?,
        ),
        _ => {
            return Err(TrainError::Recipe(
                "algorithm.kl_target and algorithm.kl_horizon select the adaptive KL controller \
                 together: set both (and kl_coef > 0, β's start) or neither"
                    .into(),
            ));
        }
    };
    let offpolicy = OffPolicy {
        mode,
        correction,
        ratio_reference: a.ratio_reference,
        bypass_applies_weights: !registry
            .uses_importance_ratio(&a.loss)
            .map_err(|e| TrainError::Recipe(format!("algorithm.loss: {e}")))?,
    };
    Ok(ResolvedAlgorithm {
        loss: a.loss.clone(),
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
}

impl Default for Extensions {
    fn default() -> Self {
        Self {
            registry: LossRegistry::with_builtins(),
            rewards: Vec::new(),
            environment: None,
            eval_set: None,
        }
    }
}
