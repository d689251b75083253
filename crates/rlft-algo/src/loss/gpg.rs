//! GPG: the plain policy gradient `−A · log πθ` (no ratio, no clip).

use super::{LossContext, LossTerms, PolicyLoss};
use crate::Result;

/// `L = −A · log πθ`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Gpg;

impl PolicyLoss for Gpg {
    fn uses_importance_ratio(&self) -> bool {
        false
    }

    fn terms(&self, ctx: &LossContext<'_>) -> Result<LossTerms> {
        Ok(LossTerms::per_token(
            (ctx.input.advantages.clone() * ctx.input.log_prob.clone()).neg(),
        ))
    }
}
