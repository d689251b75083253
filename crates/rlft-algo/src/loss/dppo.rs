//! DPPO (binary trust regions, arXiv 2602.04879): a policy gradient weighted by the truncated
//! ratio, with tokens whose probability left a trust region masked out.

use super::{LossContext, LossTerms, PolicyLoss};
use crate::Result;
use crate::masked::zero_padding;
use crate::ratio::LOG_RATIO_CLAMP;

/// The divergence that defines DPPO's trust region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DppoDivergence {
    /// Total variation of the sampled token: `p − p_old ≤ δ_high` for `A > 0`,
    /// `p − p_old ≥ −δ_low` otherwise.
    TotalVariation,
    /// Binary KL `p_old·(log p_old − log p) + (1 − p_old)·log((1 − p_old)/(1 − p))`: within
    /// `δ_high` (`A > 0`) or `δ_low` (otherwise), or moving the probability the other way.
    BinaryKl,
}

/// `L = −A · sg(min(ρ, c)) · log πθ · sg(valid)` with `ρ = exp(clamp(log ρ, ±20))`, `c` the
/// config's `dual_clip` (None: no truncation) and δ_low / δ_high the config's
/// `clip_ratio_low` / `clip_ratio_high`.
#[derive(Debug, Clone, Copy)]
pub struct Dppo {
    /// The trust region's divergence.
    pub divergence: DppoDivergence,
}

impl PolicyLoss for Dppo {
    fn terms(&self, ctx: &LossContext<'_>) -> Result<LossTerms> {
        let cfg = ctx.config;
        let mask = &ctx.input.response_mask;
        let adv = ctx.input.advantages.clone();
        let ratio = ctx
            .token_log_ratio()
            .clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
            .exp()
            .detach();
        let truncated = match cfg.dual_clip {
            Some(c) => ratio.clone().clamp_max(c),
            None => ratio.clone(),
        };
        let lp = zero_padding(ctx.input.log_prob.clone(), mask);
        let old = zero_padding(ctx.input.old_log_prob.clone(), mask);
        let (p, p_old) = (lp.clone().detach().exp(), old.clone().exp());
        let (pos_ok, neg_ok) = match self.divergence {
            DppoDivergence::TotalVariation => {
                let diff = p - p_old;
                (
                    diff.clone().lower_equal_elem(cfg.clip_ratio_high),
                    diff.greater_equal_elem(-cfg.clip_ratio_low),
                )
            }
            DppoDivergence::BinaryKl => {
                let bkl = p_old.clone() * (old - lp.clone().detach())
                    + (p_old.clone().neg() + 1.0)
                        * ((p_old.clone().neg() + (1.0 + 1e-8)) / (p.clone().neg() + (1.0 + 1e-8)))
                            .log();
                (
                    bkl.clone()
                        .lower_equal_elem(cfg.clip_ratio_high)
                        .bool_or(p.clone().lower_equal(p_old.clone())),
                    bkl.lower_equal_elem(cfg.clip_ratio_low)
                        .bool_or(p.greater_equal(p_old)),
                )
            }
        };
        let a_pos = adv.clone().greater_elem(0.0);
        let valid = a_pos
            .clone()
            .bool_and(pos_ok)
            .bool_or(a_pos.clone().bool_not().bool_and(neg_ok));
        let weight = truncated.mask_fill(valid.clone().bool_not(), 0.0);
        let loss = adv.neg() * weight * lp;
        let mut terms = LossTerms::per_token(loss);
        let out = valid.clone().bool_not();
        terms.clip_frac_high = Some(ctx.fraction(out.clone().bool_and(a_pos.clone())));
        terms.clip_frac_low = Some(ctx.fraction(out.bool_and(a_pos.bool_not())));
        if let Some(c) = cfg.dual_clip {
            terms.clip_frac_dual =
                Some(ctx.fraction(ratio.clone().greater_elem(c).bool_and(valid)));
        }
        terms.ratio = Some(ratio);
        Ok(terms)
    }
}
