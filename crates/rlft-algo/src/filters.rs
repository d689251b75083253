//! Token and sequence filters for stale samples that multiply the policy loss without changing
//! its normalisers: off-policy sequence masking (OPSM, as TRL and as slime compute it) and
//! top-entropy token masking.
//!
//! Each returns a detached keep mask; pass it with
//! [`PolicyLossInput::with_loss_mask`](crate::loss::PolicyLossInput::with_loss_mask).

use crate::logprob::check_bt;
use crate::masked::{check_shape, from_host, to_host, valid, zero_padding};
use crate::{AlgoError, Result};
use burn::tensor::Tensor;

/// Per-row `Σ_t (μ − πθ)·m / max(n_i, 1)` with NaN terms counted as 0, `[batch, 1]`, detached.
fn row_kl(log_prob: &Tensor<2>, behaviour: &Tensor<2>, mask: &Tensor<2>) -> Tensor<2> {
    let d = behaviour.clone() - log_prob.clone().detach();
    let d = d.clone().mask_fill(d.is_nan(), 0.0);
    let n = mask.clone().sum_dim(1).clamp_min(1.0);
    (zero_padding(d, mask).sum_dim(1) / n).detach()
}

fn check_delta(delta: f64) -> Result<()> {
    if delta.is_nan() {
        return Err(AlgoError::InvalidSetting {
            name: "opsm delta",
            value: delta,
            allowed: "must be a number (the largest mean KL(μ‖πθ) a negative-advantage row may have)",
        });
    }
    Ok(())
}

/// TRL's `get_off_policy_mask` (1.16): keep row `i` when `A_i ≥ 0` or
/// `kl_i = Σ_t (μ − sg πθ)·m / max(n_i, 1) ≤ δ`. `μ` is the sampling policy's log-probs (TRL
/// uses π_old when the engine's are absent).
///
/// # Shapes
/// - `log_prob`, `behaviour_log_prob`, `mask`: `[batch, T]`; `row_advantages`: `[batch, 1]`
///   → keep `[batch, 1]` (`1.0`/`0.0`)
pub fn opsm_trl(
    log_prob: &Tensor<2>,
    behaviour_log_prob: &Tensor<2>,
    row_advantages: &Tensor<2>,
    mask: &Tensor<2>,
    delta: f64,
) -> Result<Tensor<2>> {
    check_delta(delta)?;
    let dims = log_prob.dims();
    check_bt("behaviour_log_prob", behaviour_log_prob, dims)?;
    check_bt("response_mask", mask, dims)?;
    check_shape(
        "row_advantages",
        row_advantages,
        [dims[0], 1],
        "one advantage per row",
    )?;
    let kl = row_kl(log_prob, behaviour_log_prob, mask);
    let keep = row_advantages
        .clone()
        .greater_equal_elem(0.0)
        .bool_or(kl.lower_equal_elem(delta));
    Ok(keep.float().cast(log_prob.dtype()))
}

/// slime's `compute_opsm_mask` (per token advantages): with
/// `kl_i = Σ_t (π_old − πθ)·m / max(n_i, 1)`, drop token `t` of row `i` when `A_t < 0` and
/// `kl_i > δ`. Returns the keep mask (0 at padding) and slime's `opsm_clipfrac`
/// (`Σ_i Σ_t drop·m / max(n_i, 1)`: the number of dropped rows when whole rows are negative).
///
/// # Shapes
/// - every input `[batch, T]` → (`[batch, T]`, `[1]`)
pub fn opsm_slime(
    log_prob: &Tensor<2>,
    old_log_prob: &Tensor<2>,
    advantages: &Tensor<2>,
    mask: &Tensor<2>,
    delta: f64,
) -> Result<(Tensor<2>, Tensor<1>)> {
    check_delta(delta)?;
    let dims = log_prob.dims();
    check_bt("old_log_prob", old_log_prob, dims)?;
    check_bt("advantages", advantages, dims)?;
    check_bt("response_mask", mask, dims)?;
    let kl = row_kl(log_prob, old_log_prob, mask);
    let drop = advantages
        .clone()
        .lower_elem(0.0)
        .bool_and(kl.greater_elem(delta).expand(dims.map(|d| d as i64)))
        .bool_and(valid(mask));
    let drop = drop.float().cast(log_prob.dtype());
    let n = mask.clone().sum_dim(1).clamp_min(1.0);
    let clipfrac = (drop.clone().sum_dim(1) / n).sum();
    let keep = (drop.neg() + 1.0) * zero_padding(mask.ones_like(), mask);
    Ok((keep.detach(), clipfrac.detach()))
}

/// TRL's `get_high_entropy_mask`: keep the valid tokens whose entropy is at least the
/// `1 − ρ` quantile of the valid tokens' entropies, computed as torch's `quantile` computes it
/// on float32 values (linear interpolation with torch's `lerp`). `ρ = 1` keeps every valid
/// token, `ρ = 0` only the most uncertain ones.
///
/// # Shapes
/// - `entropy`, `mask`: `[batch, T]` → `[batch, T]` (`1.0`/`0.0`, 0 at padding)
pub fn top_entropy_mask(entropy: &Tensor<2>, mask: &Tensor<2>, rho: f64) -> Result<Tensor<2>> {
    if !(0.0..=1.0).contains(&rho) {
        return Err(AlgoError::InvalidSetting {
            name: "top_entropy_quantile",
            value: rho,
            allowed: "must be in [0, 1] (the fraction of highest-entropy tokens kept; 1 keeps all)",
        });
    }
    let dims = entropy.dims();
    check_bt("response_mask", mask, dims)?;
    let h = to_host(entropy)?;
    let m = to_host(mask)?;
    let mut vals: Vec<f32> = h
        .iter()
        .zip(&m)
        .filter(|(_, m)| **m > 0.5)
        .map(|(h, _)| *h as f32)
        .collect();
    vals.sort_by(f32::total_cmp);
    let keep: Vec<f64> = if vals.is_empty() {
        vec![0.0; h.len()]
    } else {
        let thr = quantile_f32(&vals, (1.0 - rho) as f32);
        h.iter()
            .zip(&m)
            .map(|(h, m)| f64::from(*m > 0.5 && (*h as f32) >= thr))
            .collect()
    };
    Ok(from_host(keep, dims, entropy))
}

/// torch's linear `quantile` of ascending float32 values: rank `q·(n − 1)` and `lerp` in f32.
fn quantile_f32(sorted: &[f32], q: f32) -> f32 {
    let rank = q * (sorted.len() - 1) as f32;
    let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
    let (a, b) = (sorted[lo], sorted[hi.min(sorted.len() - 1)]);
    let w = rank - lo as f32;
    if w < 0.5 {
        a + w * (b - a)
    } else {
        b - (b - a) * (1.0 - w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::t2;

    #[test]
    fn opsm_drops_only_stale_negative_rows() {
        let lp = t2(vec![-1.0, -1.0, -1.0, -1.0, -1.0, -1.0], 3, 2);
        let mu = t2(vec![-0.5, -0.5, -0.5, -0.5, -1.0, -1.0], 3, 2);
        let m = t2(vec![1.0; 6], 3, 2);
        let a = t2(vec![1.0, -1.0, -1.0], 3, 1);
        let keep = to_host(&opsm_trl(&lp, &mu, &a, &m, 0.1).unwrap()).unwrap();
        assert_eq!(keep, vec![1.0, 0.0, 1.0]);
        let adv = t2(vec![1.0, 1.0, -1.0, -1.0, -1.0, -1.0], 3, 2);
        let (k, frac) = opsm_slime(&lp, &mu, &adv, &m, 0.1).unwrap();
        assert_eq!(to_host(&k).unwrap(), vec![1.0, 1.0, 0.0, 0.0, 1.0, 1.0]);
        assert_eq!(to_host(&frac).unwrap(), vec![1.0]);
    }

    /// A NaN behaviour log-prob (an engine glitch) counts as 0 in the row's mean, as TRL's
    /// `nan_to_num` makes it.
    #[test]
    fn opsm_ignores_nan_behaviour_log_probs() {
        let lp = t2(vec![-1.0, -1.0], 1, 2);
        let mu = t2(vec![f64::NAN, -0.5], 1, 2);
        let m = t2(vec![1.0, 1.0], 1, 2);
        let a = t2(vec![-1.0], 1, 1);
        let keep = to_host(&opsm_trl(&lp, &mu, &a, &m, 0.3).unwrap()).unwrap();
        assert_eq!(keep, vec![1.0]);
        let keep = to_host(&opsm_trl(&lp, &mu, &a, &m, 0.2).unwrap()).unwrap();
        assert_eq!(keep, vec![0.0]);
    }

    #[test]
    fn top_entropy_keeps_the_quantile() {
        let h = t2(vec![0.1, 0.4, 0.3, 0.2, 9.0, 9.0], 2, 3);
        let m = t2(vec![1.0, 1.0, 1.0, 1.0, 0.0, 0.0], 2, 3);
        let k = to_host(&top_entropy_mask(&h, &m, 0.5).unwrap()).unwrap();
        assert_eq!(k, vec![0.0, 1.0, 1.0, 0.0, 0.0, 0.0]);
        let all = to_host(&top_entropy_mask(&h, &m, 1.0).unwrap()).unwrap();
        assert_eq!(all, vec![1.0, 1.0, 1.0, 1.0, 0.0, 0.0]);
        assert!(top_entropy_mask(&h, &m, 1.5).is_err());
    }
}
