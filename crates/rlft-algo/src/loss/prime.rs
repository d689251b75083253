//! prime-rl's losses: a policy gradient through the ratio itself, with tokens masked out when
//! their probability moved too far from the inference policy, plus a squared log-ratio penalty.

use super::{LossContext, LossTerms, PolicyLoss};
use crate::Result;
use crate::masked::{valid, zero_padding};
use burn::tensor::Tensor;

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
#[derive(Debug, Clone, Copy)]
pub struct PrimeRl {
    /// The trust-region mask.
    pub mask: PrimeMask,
}

/// `Σ_t x·sel / max(Σ_t sel, 1)` per row, `[batch, 1]`.
fn safe_row_mean(x: Tensor<2>, sel: Tensor<2>) -> Tensor<2> {
    (x * sel.clone()).sum_dim(1) / sel.sum_dim(1).clamp_min(1.0)
}

impl PolicyLoss for PrimeRl {
    fn terms(&self, ctx: &LossContext<'_>) -> Result<LossTerms> {
        let cfg = ctx.config;
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
            PrimeMask::Ipo => d.abs().greater_elem(cfg.ipo_threshold),
        }
        .bool_and(m.clone());
        let keep = m.clone().bool_and(masked.clone().bool_not());
        let f = |b: burn::tensor::Tensor<2, burn::tensor::Bool>| b.float().cast(adv.dtype());
        let pg = (adv.clone() * ratio.clone() * f(keep.clone())).neg() * cfg.adv_tau;
        let penalty = zero_padding(log_r.clone().square(), mask) * cfg.kl_tau;
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
        let cfg = PolicyLossConfig::new().with_kl_tau(0.1);
        let input = PolicyLossInput::new(lp.clone(), old, adv, mask);
        let out = LossRegistry::with_builtins()
            .compute("prime_rl", &input, &cfg)
            .unwrap();
        let g = to_host(&lp.grad(&out.loss.backward()).unwrap()).unwrap();
        let lr = (0.9f64 / 0.5).ln();
        assert!((g[0] - 2.0 * 0.1 * lr / 2.0).abs() < 1e-12, "{g:?}");
        assert!((g[1] + 0.5).abs() < 1e-12, "{g:?}");
        let masked = to_host(&out.metrics.extras["is_masked"]).unwrap();
        assert_eq!(masked, vec![0.5]);
    }
}
