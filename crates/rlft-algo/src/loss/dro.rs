//! DRO: policy gradient with a quadratic penalty on the log-ratio.

use super::{LossContext, LossTerms, PolicyLoss};
use crate::Result;

/// `L = −(A · log πθ − ½β·(log πθ − log μ)²)` with `β = dro_beta`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Dro;

impl PolicyLoss for Dro {
    fn terms(&self, ctx: &LossContext<'_>) -> Result<LossTerms> {
        let d = ctx.token_log_ratio();
        let pg = ctx.input.advantages.clone() * ctx.input.log_prob.clone();
        Ok(LossTerms::per_token(
            (pg - d.square() * (0.5 * ctx.config.dro_beta)).neg(),
        ))
    }
}
