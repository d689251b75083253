//! verl's REINFORCE with explicit importance weights (`compute_policy_loss_reinforce`).

use super::{LossContext, LossTerms, PolicyLoss};
use crate::Result;

/// `L = −A · log πθ · sg(w)`: the plain policy gradient, weighted by the rollout IS weights
/// when given (they are constants: pass detached weights, as
/// [`rollout_correction`](crate::correction::rollout_correction) returns them). No ratio, no
/// clip. With verl's bypass mode (μ as the anchor, `w` of πθ against μ) this is verl's
/// `loss_type = "reinforce"`; unlike [`Reinforce`](super::Reinforce) (`−A·ρ`) its value is
/// `−A·log πθ`, though both have the gradient `−A·w·∇log πθ` when `w = ρ`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReinforceIs;

impl PolicyLoss for ReinforceIs {
    fn uses_importance_ratio(&self) -> bool {
        false
    }

    fn terms(&self, ctx: &LossContext<'_>) -> Result<LossTerms> {
        Ok(LossTerms::per_token(
            (ctx.input.advantages.clone() * ctx.input.log_prob.clone()).neg(),
        ))
    }
}
