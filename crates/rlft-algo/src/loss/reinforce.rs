//! Importance-weighted REINFORCE: `−A · ρ`, unclipped.

use super::{LossContext, LossTerms, PolicyLoss};
use crate::Result;

/// `L = −A · ρ` with `ρ` at the configured level and no clipping (the gradient is
/// `−A·ρ·∇log πθ`, the unbiased off-policy policy gradient; pair it with truncated IS weights).
#[derive(Debug, Clone, Copy, Default)]
pub struct Reinforce;

impl PolicyLoss for Reinforce {
    fn terms(&self, ctx: &LossContext<'_>) -> Result<LossTerms> {
        let ratio = ctx.ratio();
        let mut terms = LossTerms::per_token((ctx.input.advantages.clone() * ratio.clone()).neg());
        terms.ratio = Some(ratio);
        Ok(terms)
    }
}
