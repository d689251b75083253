//! The PPO clipped surrogate, `max(−A·ρ, −A·clip(ρ))` with an optional dual clip: the loss
//! behind `ppo`, `grpo`, `dr_grpo`, `dapo`, `gspo` (sequence ratio) and `ctpo` (cumulative ratio
//! with position-adaptive bounds).

use super::{LossContext, LossTerms, PolicyLoss};
use crate::Result;

/// `L = max(−A·ρ, −A·clip(ρ, lo, hi))`, and for `A < 0` with dual clip `c`: `min(L, −A·c)`.
///
/// The ratio `ρ` is taken at the configured [`RatioLevel`](crate::RatioLevel). Extra
/// `clipped` (`[batch, T]`): 1 where the clipped branch is the larger.
#[derive(Debug, Clone, Copy, Default)]
pub struct ClippedSurrogate {
    /// Use CTPO's position-adaptive bounds instead of `[1 − ε_low, 1 + ε_high]`.
    pub position_adaptive: bool,
    /// Ignore the configured dual clip (GSPO has none).
    pub no_dual_clip: bool,
}

impl PolicyLoss for ClippedSurrogate {
    fn terms(&self, ctx: &LossContext<'_>) -> Result<LossTerms> {
        let adv = ctx.input.advantages.clone();
        let ratio = ctx.ratio();
        let bounds = ctx.bounds(self.position_adaptive);
        let neg_adv = adv.neg();
        let unclipped = neg_adv.clone() * ratio.clone();
        let clipped = neg_adv.clone() * bounds.clip(ratio.clone());
        let clip_active = clipped.clone().greater(unclipped.clone());
        // Where ρ sits exactly on a bound (ε = 0 and ρ = 1) both branches are equal: torch's
        // `maximum` gives each half the gradient and the clamp passes none.
        let tie = clipped
            .clone()
            .equal(unclipped.clone())
            .bool_and(bounds.at_bound(&ratio));
        let half = (clipped.clone().detach() + unclipped.clone()) * 0.5;
        let loss = unclipped
            .mask_where(clip_active.clone(), clipped)
            .mask_where(tie, half);
        let (a_neg, a_pos) = ctx.advantage_signs();
        let mut terms = LossTerms::per_token(loss.clone());
        terms.extras.insert(
            "clipped".into(),
            clip_active.clone().float().cast(ratio.dtype()).detach(),
        );
        let high = clip_active.clone().bool_and(a_pos);
        let low = clip_active.bool_and(a_neg.clone());
        terms.clip_frac_high = Some(ctx.fraction(high.clone()));
        terms.clip_frac_low = Some(ctx.fraction(low.clone()));
        let mut dual_count = None;
        let dual = if self.no_dual_clip {
            None
        } else {
            bounds.dual(&ratio)
        };
        if let Some(c) = dual {
            let capped = neg_adv * c;
            let dual_active = loss.clone().greater(capped.clone()).bool_and(a_neg);
            terms.clip_frac_dual = Some(ctx.fraction(dual_active.clone()));
            dual_count = Some(ctx.count(dual_active.clone()));
            terms.value = super::LossValue::PerToken {
                loss: loss.mask_where(dual_active, capped),
                aggregation: None,
            };
        }
        let low_count = ctx.count(low);
        let dual_count = dual_count.unwrap_or_else(|| low_count.zeros_like());
        terms.clip_counts = Some([low_count, ctx.count(high), dual_count]);
        terms.ratio = Some(ratio);
        Ok(terms)
    }
}
