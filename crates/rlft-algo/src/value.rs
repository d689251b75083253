//! The PPO critic's clipped value loss.

use crate::aggregation::{GlobalBatchInfo, LossAggregation, aggregate_loss};
use crate::logprob::check_bt;
use crate::masked::masked_mean;
use crate::{AlgoError, Result};
use burn::tensor::Tensor;

/// `½·agg(max((v − R)², (clip(v, v_old − ε, v_old + ε) − R)²))` and the fraction of tokens
/// where the clipped term is larger (`vf_clipfrac`).
///
/// # Shapes
/// - `vpreds` (differentiated), `old_values`, `returns`, `mask`: `[batch, T]` → (`[1]`, `[1]`)
pub fn clipped_value_loss(
    vpreds: Tensor<2>,
    old_values: Tensor<2>,
    returns: Tensor<2>,
    mask: &Tensor<2>,
    clip: f64,
    mode: LossAggregation,
    global: &GlobalBatchInfo,
) -> Result<(Tensor<1>, Tensor<1>)> {
    let dims = vpreds.dims();
    check_bt("old_values", &old_values, dims)?;
    check_bt("returns", &returns, dims)?;
    check_bt("response_mask", mask, dims)?;
    if !(clip.is_finite() && clip > 0.0) {
        return Err(AlgoError::InvalidSetting {
            name: "cliprange_value",
            value: clip,
            allowed: "must be finite and > 0 (typical: 0.2-0.5)",
        });
    }
    let lo = old_values.clone() - clip;
    let hi = old_values + clip;
    let clipped = vpreds.clone().max_pair(lo).min_pair(hi);
    let l1 = (vpreds - returns.clone()).square();
    let l2 = (clipped - returns).square();
    let larger = l2.clone().greater(l1.clone());
    let loss = l1.mask_where(larger.clone(), l2);
    let frac = masked_mean(larger.float().cast(loss.dtype()), mask).detach();
    Ok((aggregate_loss(loss, mask, mode, global)? * 0.5, frac))
}
