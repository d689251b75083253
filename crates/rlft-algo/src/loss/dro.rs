//! DRO: policy gradient with a quadratic penalty on the log-ratio.

use super::{LossContext, LossSettings, LossTerms, PolicyLoss, SettingError};
use crate::Result;
use serde::{Deserialize, Serialize};

/// `[algorithm.dro]`: DRO's settings.
#[derive(schemars::JsonSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DroSettings {
    /// DRO's quadratic penalty β on the log-ratio (verl's default 0.1).
    pub beta: f64,
}

impl Default for DroSettings {
    fn default() -> Self {
        Self { beta: 0.1 }
    }
}

impl LossSettings for DroSettings {
    const SECTION: &'static str = "dro";
    fn check(&self) -> std::result::Result<(), SettingError> {
        SettingError::at_least("beta", self.beta, 0.0, false)
    }
}

/// `L = −(A · log πθ − ½β·(log πθ − log μ)²)` with `β` from [`DroSettings`].
#[derive(Debug, Clone, Default)]
pub struct Dro {
    /// The settings.
    pub settings: DroSettings,
}

impl PolicyLoss for Dro {
    fn terms(&self, ctx: &LossContext<'_>) -> Result<LossTerms> {
        let d = ctx.token_log_ratio();
        let pg = ctx.input.advantages.clone() * ctx.input.log_prob.clone();
        Ok(LossTerms::per_token(
            (pg - d.square() * (0.5 * self.settings.beta)).neg(),
        ))
    }
}
