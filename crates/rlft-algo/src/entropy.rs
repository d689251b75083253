//! Token entropy of the policy and the entropy bonus.

use crate::aggregation::{GlobalBatchInfo, LossAggregation, aggregate_loss};
use crate::logprob::scale_by_temperature;
use crate::{Result, masked::check_shape};
use burn::tensor::Tensor;
use burn::tensor::activation::log_softmax;

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
    use burn::tensor::Device;

    #[test]
    fn uniform_has_log_v_entropy() {
        let dev = Device::flex();
        let logits = Tensor::<3>::zeros([2, 3, 7], &dev);
        let h = to_host(&entropy_from_logits(logits, None).unwrap()).unwrap();
        assert!(h.iter().all(|v| (v - 7f64.ln()).abs() < 1e-5));
    }
}
