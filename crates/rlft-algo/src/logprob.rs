//! Per-token log-probabilities of chosen tokens.

use crate::masked::check_shape;
use crate::{AlgoError, Result};
use burn::tensor::activation::log_softmax;
use burn::tensor::{Int, Tensor};

/// `log softmax(logits / temperature)[label]` per position, computed stably (max-shifted
/// log-sum-exp) and differentiable with respect to `logits`.
///
/// `temperature` must be the sampling temperature: the behaviour log-probs `log μ` recorded by
/// the sampler are taken after temperature, and a learner that skips it computes ratios against
/// a different distribution.
///
/// # Shapes
/// - `logits`: `[batch, T, vocab]`
/// - `labels`: `[batch, T]` token ids
/// - output: `[batch, T]`
pub fn logprobs_from_logits(
    logits: Tensor<3>,
    labels: Tensor<2, Int>,
    temperature: Option<f64>,
) -> Result<Tensor<2>> {
    let [b, t, _] = logits.dims();
    if labels.dims() != [b, t] {
        return Err(AlgoError::ShapeMismatch {
            name: "labels",
            expected: format!("labels must be [batch, T] = [{b}, {t}] to match logits"),
            got: labels.dims().to_vec(),
        });
    }
    let logits = scale_by_temperature(logits, temperature)?;
    Ok(log_softmax(logits, 2)
        .gather(2, labels.unsqueeze_dim::<3>(2))
        .squeeze_dim::<2>(2))
}

/// Divides logits by the temperature (an error unless it is finite and > 0).
pub(crate) fn scale_by_temperature(
    logits: Tensor<3>,
    temperature: Option<f64>,
) -> Result<Tensor<3>> {
    match temperature {
        None => Ok(logits),
        Some(t) if t.is_finite() && t > 0.0 => Ok(if t == 1.0 {
            logits
        } else {
            crate::masked::div_scalar(logits, t)
        }),
        Some(t) => Err(AlgoError::InvalidSetting {
            name: "temperature",
            value: t,
            allowed: "must be finite and > 0 (use 1.0 for the raw distribution)",
        }),
    }
}

/// Checks that a `[batch, T]` tensor matches the reference shape.
pub(crate) fn check_bt(name: &'static str, t: &Tensor<2>, dims: [usize; 2]) -> Result<()> {
    check_shape(name, t, dims, "the [batch, T] shape of log_prob")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::masked::to_host;
    use burn::tensor::{Device, TensorData};

    #[test]
    fn matches_naive_log_softmax_and_temperature() {
        let dev = Device::flex();
        let logits = Tensor::<3>::from_floats([[[1.0, 2.0, 3.0], [0.5, 0.5, 4.0]]], &dev);
        let labels = Tensor::<2, Int>::from_data(TensorData::from([[2i64, 0]]), &dev);
        let lp =
            to_host(&logprobs_from_logits(logits.clone(), labels.clone(), None).unwrap()).unwrap();
        let naive = |z: [f64; 3], k: usize| z[k] - z.iter().map(|x| x.exp()).sum::<f64>().ln();
        assert!((lp[0] - naive([1.0, 2.0, 3.0], 2)).abs() < 1e-6);
        assert!((lp[1] - naive([0.5, 0.5, 4.0], 0)).abs() < 1e-6);
        let lp2 = to_host(&logprobs_from_logits(logits, labels, Some(2.0)).unwrap()).unwrap();
        assert!((lp2[0] - naive([0.5, 1.0, 1.5], 2)).abs() < 1e-6);
    }

    #[test]
    fn bad_temperature_and_shape_are_errors() {
        let dev = Device::flex();
        let logits = Tensor::<3>::zeros([1, 2, 3], &dev);
        let labels = Tensor::<2, Int>::zeros([1, 3], &dev);
        assert!(logprobs_from_logits(logits.clone(), labels, None).is_err());
        let labels = Tensor::<2, Int>::zeros([1, 2], &dev);
        assert!(logprobs_from_logits(logits, labels, Some(0.0)).is_err());
    }
}
