//! Token entropy of the policy and the entropy bonus.

use crate::aggregation::{GlobalBatchInfo, LossAggregation, aggregate_loss};
use crate::fused::log_softmax;
use crate::logprob::scale_by_temperature;
use crate::{Result, masked::check_shape};
use burn::tensor::{Bool, Int, Tensor};

/// Entropy `H = −Σ_v p_v log p_v` of the softmax over the vocabulary at every position
/// (equal to `logsumexp(z) − Σ softmax(z)·z`), differentiable with respect to `logits`.
///
/// # Shapes
/// - `logits`: `[batch, T, vocab]` → `[batch, T]`
pub fn entropy_from_logits(logits: Tensor<3>, temperature: Option<f64>) -> Result<Tensor<2>> {
    let logits = scale_by_temperature(logits, temperature)?;
    let logp = log_softmax(logits, 2);
    let p = logp.clone().exp();
    Ok((p * logp).sum_dim(2).squeeze_dim::<2>(2).neg())
}

/// [`entropy_from_logits`] under a sampling mask: the entropy of the renormalised
/// distribution over each position's kept set ([`crate::logprob::kept_log_softmax`]; padded
/// slots contribute exactly 0).
///
/// # Shapes
/// - `logits`: `[batch, T, vocab]`
/// - `kept`, `padding`: `[batch, T, K]`
/// - output: `[batch, T]`
pub fn entropy_over_kept(
    logits: Tensor<3>,
    kept: Tensor<3, Int>,
    padding: Tensor<3, Bool>,
    temperature: Option<f64>,
) -> Result<Tensor<2>> {
    let logp = crate::logprob::kept_log_softmax(logits, kept, padding, temperature)?;
    let p = logp.clone().exp();
    Ok((p * logp).sum_dim(2).squeeze_dim::<2>(2).neg())
}

/// The entropy term of the loss, `−α · agg(H)`: minimising it raises the policy's entropy
/// (keeps it exploring). verl's `compute_entropy_loss` is `agg(H)`; this returns it already
/// scaled by `−α`.
///
/// # Shapes
/// - `entropy`, `mask`: `[batch, T]` → `[1]`
pub fn entropy_bonus(
    entropy: Tensor<2>,
    mask: &Tensor<2>,
    mode: LossAggregation,
    global: &GlobalBatchInfo,
    alpha: f64,
) -> Result<Tensor<1>> {
    check_shape(
        "entropy",
        &entropy,
        mask.dims(),
        "the [batch, T] shape of the mask",
    )?;
    Ok(aggregate_loss(entropy, mask, mode, global)? * (-alpha))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::masked::to_host;
    use burn::tensor::{Device, TensorData};

    #[test]
    fn uniform_has_log_v_entropy() {
        let dev = Device::flex();
        let logits = Tensor::<3>::zeros([2, 3, 7], &dev);
        let h = to_host(&entropy_from_logits(logits, None).unwrap()).unwrap();
        assert!(h.iter().all(|v| (v - 7f64.ln()).abs() < 1e-5));
    }

    #[test]
    fn kept_set_entropy_ignores_the_rest_and_the_padding() {
        let dev = Device::flex();
        let logits = Tensor::<3>::from_floats([[[0.0, 0.0, 0.0, 9.0, 0.0]]], &dev);
        let kept = Tensor::<3, Int>::from_data(TensorData::from([[[0i64, 1, 2, 0]]]), &dev);
        let padding =
            Tensor::<3, Bool>::from_data(TensorData::from([[[false, false, false, true]]]), &dev);
        let h = to_host(&entropy_over_kept(logits, kept, padding, Some(0.5)).unwrap()).unwrap();
        assert!((h[0] - 3f64.ln()).abs() < 1e-6, "{h:?}");
    }
}
