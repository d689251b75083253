//! KL estimators between the policy and the frozen reference, and the adaptive KL controller.

use crate::logprob::check_bt;
use crate::masked::zero_padding;
use crate::{AlgoError, Result};
use burn::tensor::Tensor;
use serde::{Deserialize, Serialize};

/// Per-token estimator of `KL(πθ ‖ π_ref)` from sampled tokens (`x = log πθ − log π_ref`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum KlEstimator {
    /// k1: `x` (unbiased, high variance, can be negative).
    K1,
    /// k2: `½x²` (verl's `mse`).
    K2,
    /// k3: `e^{−x} + x − 1`, clamped to [−10, 10] (verl's `low_var_kl`, GRPO's default).
    K3,
    /// `|x|`.
    Abs,
    /// k1's value with k2's gradient (straight-through, `k1+`).
    K1Plus,
    /// k3's value with k2's gradient (straight-through, `k3+`).
    K3Plus,
    /// `|x|`'s value with k2's gradient (`abs+`).
    AbsPlus,
}

impl KlEstimator {
    /// Every accepted name (verl's included); the first name of a variant is its display name.
    /// A trailing `_plus` reads as `+`, and `k2+`/`mse+` are plain k2 (k2 already has k2's
    /// gradient), as in verl.
    pub const NAMES: [(KlEstimator, &'static str); 14] = [
        (KlEstimator::K1, "k1"),
        (KlEstimator::K1, "kl"),
        (KlEstimator::K2, "k2"),
        (KlEstimator::K2, "mse"),
        (KlEstimator::K2, "k2+"),
        (KlEstimator::K2, "mse+"),
        (KlEstimator::K3, "k3"),
        (KlEstimator::K3, "low_var_kl"),
        (KlEstimator::Abs, "abs"),
        (KlEstimator::K1Plus, "k1+"),
        (KlEstimator::K1Plus, "kl+"),
        (KlEstimator::K3Plus, "k3+"),
        (KlEstimator::K3Plus, "low_var_kl+"),
        (KlEstimator::AbsPlus, "abs+"),
    ];
}

crate::error::impl_names!(KlEstimator, KlEstimator::NAMES, "KL estimator", |s| {
    let key = s.trim().to_ascii_lowercase();
    key.strip_suffix("_plus")
        .map(|k| format!("{k}+"))
        .unwrap_or(key)
});

/// Per-token KL estimate between `log πθ` and `log π_ref`, differentiable with respect to
/// `log_prob`. Unmasked positions are 0 when a mask is given.
///
/// # Shapes
/// - `log_prob`, `ref_log_prob`: `[batch, T]` → `[batch, T]`
pub fn kl_penalty(
    log_prob: Tensor<2>,
    ref_log_prob: Tensor<2>,
    estimator: KlEstimator,
    mask: Option<&Tensor<2>>,
) -> Result<Tensor<2>> {
    check_bt("ref_log_prob", &ref_log_prob, log_prob.dims())?;
    let (lp, rf) = match mask {
        Some(m) => {
            check_bt("response_mask", m, log_prob.dims())?;
            (zero_padding(log_prob, m), zero_padding(ref_log_prob, m))
        }
        None => (log_prob, ref_log_prob),
    };
    let x = lp - rf;
    let k2 = |x: Tensor<2>| x.square() * 0.5;
    let k3 = |x: Tensor<2>| {
        let neg = x.neg().clamp(-20.0, 20.0);
        (neg.clone().exp() - neg - 1.0).clamp(-10.0, 10.0)
    };
    let straight_through = |value: Tensor<2>, x: Tensor<2>| {
        let g = k2(x);
        g.clone() - g.detach() + value.detach()
    };
    Ok(match estimator {
        KlEstimator::K1 => x,
        KlEstimator::K2 => k2(x),
        KlEstimator::K3 => k3(x),
        KlEstimator::Abs => x.abs(),
        KlEstimator::K1Plus => straight_through(x.clone(), x),
        KlEstimator::K3Plus => straight_through(k3(x.clone()), x),
        KlEstimator::AbsPlus => straight_through(x.clone().abs(), x),
    })
}

/// KL as a reward penalty: `r_t − β·kl_t` at masked tokens (verl's `use_kl_in_reward`), and the
/// batch KL (mean over sequences of the per-sequence token mean) to feed a controller.
///
/// # Shapes
/// - all inputs `[batch, T]` → (`[batch, T]`, `[1]`)
pub fn apply_kl_penalty_to_rewards(
    token_rewards: Tensor<2>,
    old_log_prob: Tensor<2>,
    ref_log_prob: Tensor<2>,
    mask: &Tensor<2>,
    estimator: KlEstimator,
    beta: f64,
) -> Result<(Tensor<2>, Tensor<1>)> {
    check_bt("token_rewards", &token_rewards, old_log_prob.dims())?;
    let kl = kl_penalty(old_log_prob, ref_log_prob, estimator, Some(mask))?.detach();
    let per_seq = kl.clone().sum_dim(1) / (mask.clone().sum_dim(1) + crate::masked::COUNT_EPS);
    Ok((token_rewards - kl * beta, per_seq.mean()))
}

/// The adaptive KL coefficient of Ziegler et al. (as in verl and TRL): `β ← β·(1 + clip(KL/target
/// − 1, ±0.2)·n/horizon)` after each batch of `n` samples.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AdaptiveKlController {
    /// Current coefficient β.
    pub value: f64,
    /// Target KL per sequence.
    pub target: f64,
    /// Number of samples over which β may change by ±20 %.
    pub horizon: f64,
}

impl AdaptiveKlController {
    /// A controller starting at `init` (all three must be > 0).
    pub fn new(init: f64, target: f64, horizon: f64) -> Result<Self> {
        for (name, v) in [
            ("kl_ctrl.init", init),
            ("kl_ctrl.target", target),
            ("kl_ctrl.horizon", horizon),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(AlgoError::InvalidSetting {
                    name,
                    value: v,
                    allowed: "must be finite and > 0",
                });
            }
        }
        Ok(Self {
            value: init,
            target,
            horizon,
        })
    }

    /// Updates β from the KL measured on a batch of `n_steps` samples; returns the new β.
    pub fn update(&mut self, current_kl: f64, n_steps: usize) -> f64 {
        let err = (current_kl / self.target - 1.0).clamp(-0.2, 0.2);
        self.value *= 1.0 + err * n_steps as f64 / self.horizon;
        self.value
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_unknown_lists_known() {
        assert_eq!(
            "low_var_kl".parse::<KlEstimator>().unwrap(),
            KlEstimator::K3
        );
        assert_eq!("k3+".parse::<KlEstimator>().unwrap(), KlEstimator::K3Plus);
        assert_eq!(
            "low_var_kl_plus".parse::<KlEstimator>().unwrap(),
            KlEstimator::K3Plus
        );
        assert_eq!("mse".parse::<KlEstimator>().unwrap(), KlEstimator::K2);
        let err = "full".parse::<KlEstimator>().unwrap_err().to_string();
        assert!(
            err.contains("unknown KL estimator 'full'") && err.contains("low_var_kl"),
            "{err}"
        );
    }

    #[test]
    fn adaptive_controller_moves_towards_target() {
        let mut c = AdaptiveKlController::new(0.1, 6.0, 10000.0).unwrap();
        let up = c.update(12.0, 100);
        assert!((up - 0.1 * (1.0 + 0.2 * 0.01)).abs() < 1e-15);
        let down = c.update(0.0, 100);
        assert!(down < up);
        assert!(AdaptiveKlController::new(0.1, 0.0, 1.0).is_err());
    }
}
