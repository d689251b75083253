//! SAPO: a smooth sigmoid gate instead of a hard clip.

use super::{LossContext, LossTerms, LossValue, PolicyLoss};
use crate::Result;
use crate::aggregation::LossAggregation;
use burn::tensor::activation::sigmoid;

/// `L = −A · σ(τ(ρ − 1))·4/τ`, with `τ = tau_pos` for `A > 0` and `tau_neg` otherwise. The
/// gate's slope at `ρ = 1` is 1 (the plain policy gradient) and decays smoothly away from it.
/// Always aggregated as `seq-mean-token-mean`, as in the reference.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sapo;

impl PolicyLoss for Sapo {
    fn terms(&self, ctx: &LossContext<'_>) -> Result<LossTerms> {
        let ratio = ctx.ratio();
        let (_, a_pos) = ctx.advantage_signs();
        let (tp, tn) = (ctx.config.sapo_tau_pos, ctx.config.sapo_tau_neg);
        let tau = ratio
            .clone()
            .ones_like()
            .mul_scalar(tn)
            .mask_fill(a_pos, tp);
        let gate = sigmoid((ratio.clone() - 1.0) * tau.clone()) * 4.0 / tau;
        let loss = (gate * ctx.input.advantages.clone()).neg();
        let mut terms = LossTerms::from_value(LossValue::PerToken {
            loss,
            aggregation: Some(LossAggregation::SeqMeanTokenMean),
        });
        terms.ratio = Some(ratio);
        Ok(terms)
    }
}
