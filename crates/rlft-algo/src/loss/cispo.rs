//! CISPO: clip the importance weight, not the update — the gradient never vanishes.

use super::{LossContext, LossTerms, PolicyLoss};
use crate::Result;

/// `L = −sg(clip(ρ, 1 − ε_low, 1 + ε_high)) · A · log πθ`: every token keeps a gradient through
/// `log πθ`; only its weight is bounded. The ratio is taken at the configured level. Extra
/// `clipped` (`[batch, T]`): 1 where the weight was clipped.
#[derive(Debug, Clone, Copy, Default)]
pub struct Cispo;

impl PolicyLoss for Cispo {
    fn terms(&self, ctx: &LossContext<'_>) -> Result<LossTerms> {
        let ratio = ctx.ratio();
        let bounds = ctx.bounds(false);
        let weight = bounds.clip(ratio.clone()).detach();
        let loss = (weight * ctx.input.advantages.clone() * ctx.input.log_prob.clone()).neg();
        let (below, above) = bounds.outside(&ratio);
        let mut terms = LossTerms::per_token(loss);
        let clipped = below.clone().bool_or(above.clone());
        terms.extras.insert(
            "clipped".into(),
            clipped.float().cast(ratio.dtype()).detach(),
        );
        terms.clip_frac_low = Some(ctx.fraction(below));
        terms.clip_frac_high = Some(ctx.fraction(above));
        terms.ratio = Some(ratio);
        Ok(terms)
    }
}
