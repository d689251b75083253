//! prime-rl's losses: a policy gradient through the ratio itself, with tokens masked out when
//! their probability moved too far from the inference policy, plus a squared log-ratio penalty.

use super::{LossContext, LossSettings, LossTerms, PolicyLoss, SettingError};
use crate::Result;
use crate::masked::{valid, zero_padding};
use burn::tensor::Tensor;
use serde::{Deserialize, Serialize};

/// How prime-rl decides that a token's probability moved too far (`d = πθ − π_old`, the
/// probabilities of the sampled token).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrimeMask {
    /// `default_loss_fn` (a DPPO mask): masked if `A > 0 ? d > δ_high : d < −δ_low`, with
    /// `δ_low` / `δ_high` the config's `clip_ratio_low` / `clip_ratio_high` (`A = 0` uses the
    /// low rule).
    Dppo,
    /// `ipo_loss_fn`: masked if `|d| > ipo_threshold`.
    Ipo,
}

/// `[algorithm.prime_rl]`: the settings of prime-rl's losses (`prime_rl` and `prime_rl_ipo`).
#[derive(schemars::JsonSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PrimeRlSettings {
    /// Scale of the advantage term (`adv_tau`, default 1).
    pub adv_tau: f64,
    /// Coefficient of the squared log-ratio penalty (`kl_tau`, default 1e-3).
    pub kl_tau: f64,
    /// `prime_rl_ipo` only: tokens whose probability moved by more than this are masked (unset:
    /// 0.1).
    pub ipo_threshold: Option<f64>,
}

impl Default for PrimeRlSettings {
    fn default() -> Self {
        Self {
            adv_tau: 1.0,
            kl_tau: 1e-3,
            ipo_threshold: None,
        }
    }
}

impl LossSettings for PrimeRlSettings {
    const SECTION: &'static str = "prime_rl";
    fn check(&self) -> std::result::Result<(), SettingError> {
        SettingError::at_least("adv_tau", self.adv_tau, 0.0, false)?;
        SettingError::at_least("kl_tau", self.kl_tau, 0.0, false)?;
        if let Some(t) = self.ipo_threshold {
            SettingError::at_least("ipo_threshold", t, 0.0, false)?;
        }
        Ok(())
    }
}

/// prime-rl's default IPO threshold.
const IPO_THRESHOLD: f64 = 0.1;

/// `L = −keep·adv_tau·A·ρ + kl_tau·m·(log ρ)²` with `log ρ = log πθ − log π_old` unclamped,
/// `ρ` not detached and not clipped, `keep = m ∧ ¬masked`. With `token-mean` aggregation and
/// `batch_num_tokens` as prime-rl's `rl_scale` this is `compute_loss`.
///
/// Extras (`[batch, 1]`, means over the row's selected tokens, 0 when none): `masked_mismatch_kl`,
/// `unmasked_mismatch_kl` (of `ρ − log ρ − 1`), `is_masked`, and for [`PrimeMask::Dppo`]
/// `is_masked_low`, `is_masked_high`, `masked_advantage_positive`, `masked_advantage_negative`.
///
/// # Shapes
/// - every input `[batch, T]`; the extras `[batch, 1]`.
#[derive(Debug, Clone)]
pub struct PrimeRl {
    /// The trust-region mask.
    pub mask: PrimeMask,
    /// The settings.
    pub settings: PrimeRlSettings,
}

impl PrimeRl {
    /// The loss with `mask`, from `settings`.
    ///
    /// # Errors
    /// `ipo_threshold` with the DPPO mask (it applies to `prime_rl_ipo` only).
    pub fn new(
        mask: PrimeMask,
        settings: PrimeRlSettings,
    ) -> std::result::Result<Self, SettingError> {
        if mask == PrimeMask::Dppo && settings.ipo_threshold.is_some() {
            return Err(SettingError::new(
                "ipo_threshold",
                "applies to loss = \"prime_rl_ipo\" only; remove it or choose that loss",
            ));
        }
        Ok(Self { mask, settings })
    }
}

/// `Σ_t x·sel / max(Σ_t sel, 1)` per row, `[batch, 1]`.
fn safe_row_mean(x: Tensor<2>, sel: Tensor<2>) -> Tensor<2> {
    (x * sel.clone()).sum_dim(1) / sel.sum_dim(1).clamp_min(1.0)
}

impl PolicyLoss for PrimeRl {
    fn terms(&self, ctx: &LossContext<'_>) -> Result<LossTerms> {
        let (cfg, s) = (ctx.config, &self.settings);
        let input = ctx.input;
        let mask = &input.response_mask;
        let adv = zero_padding(input.advantages.clone(), mask);
        let log_r = ctx.token_log_ratio();
        let ratio = log_r.clone().exp();
        let p = zero_padding(input.log_prob.clone().detach(), mask).exp();
        let p_old = zero_padding(input.old_log_prob.clone(), mask).exp();
        let d = p - p_old;
        let m = valid(mask);
        let a_pos = adv.clone().greater_elem(0.0);
        let a_neg = adv.clone().lower_elem(0.0);
        let mut low_high = None;
        let masked = match self.mask {
            PrimeMask::Dppo => {
                let high = d.clone().greater_elem(cfg.clip_ratio_high);
                let low = d.clone().lower_elem(-cfg.clip_ratio_low);
                let masked = a_pos
                    .clone()
                    .bool_and(high.clone())
                    .bool_or(a_pos.clone().bool_not().bool_and(low.clone()));
                low_high = Some((low.bool_and(a_neg.clone()), high.bool_and(a_pos.clone())));
                masked
            }
            PrimeMask::Ipo => d
                .abs()
                .greater_elem(s.ipo_threshold.unwrap_or(IPO_THRESHOLD)),
        }
        .bool_and(m.clone());
        let keep = m.clone().bool_and(masked.clone().bool_not());
        let f = |b: burn::tensor::Tensor<2, burn::tensor::Bool>| b.float().cast(adv.dtype());
        let pg = (adv.clone() * ratio.clone() * f(keep.clone())).neg() * s.adv_tau;
        let penalty = zero_padding(log_r.clone().square(), mask) * s.kl_tau;
        let mut terms = LossTerms::per_token(pg + penalty);
        let mismatch = zero_padding((ratio.clone() - log_r - 1.0).detach(), mask);
        let fm = f(m);
        let ex = &mut terms.extras;
        ex.insert(
            "masked_mismatch_kl".into(),
            safe_row_mean(mismatch.clone(), f(masked.clone())),
        );
        ex.insert(
            "unmasked_mismatch_kl".into(),
            safe_row_mean(mismatch, f(keep)),
        );
        ex.insert(
            "is_masked".into(),
            safe_row_mean(f(masked.clone()), fm.clone()),
        );
        if let Some((low, high)) = low_high {
            ex.insert("is_masked_low".into(), safe_row_mean(f(low), fm.clone()));
            ex.insert("is_masked_high".into(), safe_row_mean(f(high), fm));
            let sel = f(masked);
            ex.insert(
                "masked_advantage_positive".into(),
                safe_row_mean(f(a_pos), sel.clone()),
            );
            ex.insert(
                "masked_advantage_negative".into(),
                safe_row_mean(f(a_neg), sel),
            );
        }
        terms.ratio = Some(ratio.detach());
        Ok(terms)
    }
}

#[cfg(test)]
mod tests {
    use crate::loss::{LossRegistry, PolicyLossConfig, PolicyLossInput};
    use crate::masked::to_host;
    use burn::tensor::Device;

    use crate::testing::t2_on as t2;

    /// A token whose probability rose by more than δ_high under a positive advantage is masked
    /// (only the squared log-ratio penalty moves it); an on-policy token is the plain
    /// `−A·ρ` gradient.
    #[test]
    fn masked_tokens_keep_only_the_penalty() {
        let dev = Device::flex().autodiff();
        let lp = t2(vec![(0.9f64).ln(), (0.5f64).ln()], 1, 2, &dev).require_grad();
        let old = t2(vec![(0.5f64).ln(), (0.5f64).ln()], 1, 2, &dev);
        let adv = t2(vec![1.0, 1.0], 1, 2, &dev);
        let mask = t2(vec![1.0, 1.0], 1, 2, &dev);
        let input = PolicyLossInput::new(lp.clone(), old, adv, mask);
        let settings = serde_json::json!({"kl_tau": 0.1});
        let out = LossRegistry::with_builtins()
            .build("prime_rl", Some(&settings))
            .unwrap()
            .compute(&input, &PolicyLossConfig::new())
            .unwrap();
        let g = to_host(&lp.grad(&out.loss.backward()).unwrap()).unwrap();
        let lr = (0.9f64 / 0.5).ln();
        assert!((g[0] - 2.0 * 0.1 * lr / 2.0).abs() < 1e-12, "{g:?}");
        assert!((g[1] + 0.5).abs() < 1e-12, "{g:?}");
        let masked = to_host(&out.metrics.extras["is_masked"]).unwrap();
        assert_eq!(masked, vec![0.5]);
    }
}
