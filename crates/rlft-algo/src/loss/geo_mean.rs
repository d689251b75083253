//! GMPO: the geometric mean of clipped token ratios per sequence.

use super::{LossContext, LossTerms, LossValue, PolicyLoss};
use crate::Result;
use crate::masked::{COUNT_EPS, masked_row_sum};

/// Per sequence `i`: `R_i = exp(Σ_t k_t / n_i)` with the log-ratio clipped in log space towards
/// the advantage's sign, `k = sgn(A)·min(sgn(A)·d, sgn(A)·clip(d, −ε_low, ε_high))`;
/// `L = mean_i(−Ā_i · R_i)` over all rows, `Ā_i` the sequence's mean advantage. Aggregation and
/// global normalisers do not apply; rollout IS weights enter as their per-sequence geometric mean.
#[derive(Debug, Clone, Copy, Default)]
pub struct GeoMean;

impl PolicyLoss for GeoMean {
    fn terms(&self, ctx: &LossContext<'_>) -> Result<LossTerms> {
        let mask = &ctx.input.response_mask;
        let adv = ctx.input.advantages.clone();
        let d = ctx.token_log_ratio();
        let (lo, hi) = (ctx.config.clip_ratio_low, ctx.config.clip_ratio_high);
        let d_clip = d.clone().clamp(-lo, hi);
        let sgn = adv.clone().sign();
        let k = (sgn.clone() * d.clone()).min_pair(sgn.clone() * d_clip.clone()) * sgn;
        let n = mask.clone().sum_dim(1).squeeze_dim::<1>(1) + COUNT_EPS;
        let seq_ratio = (masked_row_sum(k, mask) / n.clone()).exp();
        let seq_adv = masked_row_sum(adv, mask) / n.clone();
        let mut per_seq = (seq_adv * seq_ratio).neg();
        if let Some(w) = &ctx.input.rollout_is_weights {
            let log_w = (w.clone() + 1e-10).log();
            per_seq = per_seq * (masked_row_sum(log_w, mask) / n).exp();
        }
        let clipped = d.not_equal(d_clip);
        let (a_neg, a_pos) = ctx.advantage_signs();
        let mut terms = LossTerms::from_value(LossValue::Reduced(per_seq.mean()));
        terms.clip_frac_high = Some(ctx.fraction(clipped.clone().bool_and(a_pos)));
        terms.clip_frac_low = Some(ctx.fraction(clipped.bool_and(a_neg)));
        Ok(terms)
    }
}
