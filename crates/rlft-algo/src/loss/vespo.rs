//! VESPO (TRL 1.16 `loss_type="vespo"`): a REINFORCE loss whose rows are weighted by a gamma
//! function of their sequence importance weight.

use super::{LossContext, LossSettings, LossTerms, PolicyLoss, SettingError};
use crate::Result;
use crate::masked::zero_padding;
use burn::tensor::Tensor;
use serde::{Deserialize, Serialize};

/// Lower clamp of VESPO's log sequence weight (`log 1e-8`), also applied to each `log ρ` of the
/// rollout engine's ratio.
const LOG_W_MIN: f64 = -18.420_680_743_952_367;
/// Upper clamp of the log sequence weight and of each token's log-ratio.
const LOG_W_MAX: f64 = 20.0;
/// Smallest λ used.
const LAMBDA_MIN: f64 = 1e-4;

/// `[algorithm.vespo]`: the gamma weights of TRL 1.16's VESPO.
#[derive(schemars::JsonSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct VespoSettings {
    /// `[k, λ]` for rows with a non-negative advantage (TRL's default `[2, 3]`).
    pub pos: [f64; 2],
    /// `[k, λ]` for rows with a negative advantage (TRL's default `[3, 2]`).
    pub neg: [f64; 2],
}

impl Default for VespoSettings {
    fn default() -> Self {
        Self {
            pos: [2.0, 3.0],
            neg: [3.0, 2.0],
        }
    }
}

impl LossSettings for VespoSettings {
    const SECTION: &'static str = "vespo";
    fn check(&self) -> std::result::Result<(), SettingError> {
        for (key, [k, l]) in [("pos", self.pos), ("neg", self.neg)] {
            if !(k.is_finite() && l.is_finite() && k > 0.0 && l > 0.0) {
                return Err(SettingError::new(
                    key,
                    format!("[k, λ] must both be finite and > 0, got [{k}, {l}]"),
                ));
            }
        }
        Ok(())
    }
}

/// `L = −φ_i·A·log πθ`, differentiated through `log πθ` (not a ratio), with the detached row
/// weight `φ_i = exp(λ + k·log w_i − λ·w_i)`:
///
/// - `log w_i = clamp(Σ_t clamp(log πθ − log π_old, ±20)·m + Σ_all t clamp(log ρ_t, log 1e-8,
///   20), log 1e-8, 20)`, where `ρ` is the optional rollout-engine ratio
///   ([`PolicyLossInput::sampling_is_ratio`](super::PolicyLossInput::sampling_is_ratio)) taken
///   over every position (padding must hold 1);
/// - `(k, λ)` is the settings' `pos` for rows whose advantage (read at the first position)
///   is `≥ 0`, `neg` otherwise; λ is clamped to ≥ 1e-4; a non-finite φ becomes 0.
///
/// The ratio level, clip range and rollout IS weights do not enter. Extras: `phi_seq`
/// (`[batch, 1]`) and `vespo/phi_seq_mean` (`Σ_i φ_i / B` over all rows).
///
/// # Shapes
/// - every input `[batch, T]`; the row weight is `[batch, 1]`.
#[derive(Debug, Clone, Default)]
pub struct Vespo {
    /// The settings.
    pub settings: VespoSettings,
}

impl Vespo {
    /// The detached row weights `φ`, `[batch, 1]`.
    pub fn phi(&self, ctx: &LossContext<'_>) -> Tensor<2> {
        let input = ctx.input;
        let [b, _] = input.log_prob.dims();
        let d = zero_padding(
            (input.log_prob.clone().detach() - input.old_log_prob.clone())
                .clamp(-LOG_W_MAX, LOG_W_MAX),
            &input.response_mask,
        );
        let mut s = d.sum_dim(1);
        if let Some(rho) = &input.sampling_is_ratio {
            s = s + rho.clone().log().clamp(LOG_W_MIN, LOG_W_MAX).sum_dim(1);
        }
        let log_w = s.clamp(LOG_W_MIN, LOG_W_MAX);
        let w = log_w.clone().exp();
        let a0 = input.advantages.clone().slice([0..b, 0..1]);
        let pos = a0.greater_equal_elem(0.0);
        let [kp, lp] = self.settings.pos;
        let [kn, ln] = self.settings.neg;
        let k = log_w.zeros_like().mask_fill(pos.clone(), kp);
        let k = k.mask_fill(pos.clone().bool_not(), kn);
        let lam = log_w
            .zeros_like()
            .mask_fill(pos.clone(), lp.max(LAMBDA_MIN));
        let lam = lam.mask_fill(pos.bool_not(), ln.max(LAMBDA_MIN));
        let phi = (lam.clone() + k * log_w - lam * w).exp();
        let bad = phi.clone().is_nan().bool_or(phi.clone().is_inf());
        phi.mask_fill(bad, 0.0).detach()
    }
}

impl PolicyLoss for Vespo {
    fn uses_importance_ratio(&self) -> bool {
        false
    }

    fn terms(&self, ctx: &LossContext<'_>) -> Result<LossTerms> {
        let phi = self.phi(ctx);
        let [b, _] = phi.dims();
        let loss = (ctx.input.advantages.clone() * ctx.input.log_prob.clone() * phi.clone()).neg();
        let mut terms = LossTerms::per_token(loss);
        let mean = phi.clone().sum().reshape([1, 1]) / b.max(1) as f64;
        terms.extras.insert("vespo/phi_seq_mean".into(), mean);
        terms.extras.insert("phi_seq".into(), phi);
        Ok(terms)
    }
}

#[cfg(test)]
mod tests {
    use crate::loss::{LossRegistry, PolicyLossConfig, PolicyLossInput};
    use crate::masked::to_host;
    use burn::tensor::Device;

    use crate::testing::t2_on as t2;

    /// On-policy rows get φ = 1; a row 30 nats off (beyond the +20 clamp) and a row with a
    /// rejected engine token get a finite φ, and the padding no gradient.
    #[test]
    fn phi_is_one_on_policy_and_finite_at_the_clamps() {
        let dev = Device::flex().autodiff();
        let lp = t2(vec![-1.0, -1.0, 29.0, 1.0, -1.0, -1.0], 3, 2, &dev).require_grad();
        let old = t2(vec![-1.0, -1.0, -1.0, 1.0, -1.0, -1.0], 3, 2, &dev);
        let adv = t2(vec![1.0, 1.0, -1.0, -1.0, 1.0, 1.0], 3, 2, &dev);
        let mask = t2(vec![1.0, 1.0, 1.0, 0.0, 1.0, 1.0], 3, 2, &dev);
        let rho = t2(vec![1.0, 1.0, 1.0, 1.0, 0.0, 1.0], 3, 2, &dev);
        let input = PolicyLossInput::new(lp.clone(), old, adv, mask).with_sampling_is_ratio(rho);
        let out = LossRegistry::with_builtins()
            .compute("vespo", &input, &PolicyLossConfig::new())
            .unwrap();
        let phi = to_host(&out.metrics.extras["phi_seq"]).unwrap();
        assert!((phi[0] - 1.0).abs() < 1e-12, "{phi:?}");
        assert!(phi.iter().all(|p| p.is_finite() && *p >= 0.0), "{phi:?}");
        let g = to_host(&lp.grad(&out.loss.backward()).unwrap()).unwrap();
        assert!((g[0] + 1.0 / 5.0).abs() < 1e-12, "{g:?}");
        assert_eq!(g[3], 0.0);
    }
}
