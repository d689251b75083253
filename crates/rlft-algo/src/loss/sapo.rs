//! SAPO: a smooth sigmoid gate instead of a hard clip.

use super::{LossContext, LossSettings, LossTerms, LossValue, PolicyLoss, SettingError};
use crate::Result;
use crate::aggregation::LossAggregation;
use burn::tensor::activation::sigmoid;
use serde::{Deserialize, Serialize};

/// `[algorithm.sapo]`: the gate temperatures.
#[derive(schemars::JsonSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SapoSettings {
    /// Gate temperature for positive advantages (verl's default 1.0).
    pub tau_pos: f64,
    /// Gate temperature for non-positive advantages (verl's default 1.05).
    pub tau_neg: f64,
}

impl Default for SapoSettings {
    fn default() -> Self {
        Self {
            tau_pos: 1.0,
            tau_neg: 1.05,
        }
    }
}

impl LossSettings for SapoSettings {
    const SECTION: &'static str = "sapo";
    fn check(&self) -> std::result::Result<(), SettingError> {
        SettingError::at_least("tau_pos", self.tau_pos, 0.0, false)?;
        SettingError::at_least("tau_neg", self.tau_neg, 0.0, false)
    }
}

/// `L = −A · σ(τ(ρ − 1))·4/τ`, with `τ = tau_pos` for `A > 0` and `tau_neg` otherwise. The
/// gate's slope at `ρ = 1` is 1 (the plain policy gradient) and decays smoothly away from it.
/// Always aggregated as `seq-mean-token-mean`, as in the reference.
#[derive(Debug, Clone, Default)]
pub struct Sapo {
    /// The settings.
    pub settings: SapoSettings,
}

impl PolicyLoss for Sapo {
    fn terms(&self, ctx: &LossContext<'_>) -> Result<LossTerms> {
        let ratio = ctx.ratio();
        let (_, a_pos) = ctx.advantage_signs();
        let (tp, tn) = (self.settings.tau_pos, self.settings.tau_neg);
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
