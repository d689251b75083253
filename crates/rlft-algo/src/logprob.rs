//! Per-token log-probabilities of chosen tokens.

use crate::fused::log_softmax;
use crate::masked::check_shape;
use crate::{AlgoError, Result};
use burn::tensor::{Bool, Int, Tensor};

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

/// Where a kept set is padded: the logit a padded slot gets before the softmax, far below any
/// real (temperature-scaled) logit and finite in f16, so its probability is exactly 0 and its
/// `p · log p` is 0 (not `0 · ∞`).
const PADDED_LOGIT: f64 = -3.0e4;

/// `log softmax` of the temperature-scaled logits over each position's *kept set* (a
/// sampling mask: the tokens top-k / min-p / top-p left to draw from) instead of the whole
/// vocabulary: `z_k − logsumexp_{j ∈ kept} z_j`. Differentiable with respect to `logits`; the
/// gradient of a kept logit is the softmax over the kept set, the others get none.
///
/// `kept[b, t, ..]` lists token ids, `padding` marks the slots past a position's set (their
/// ids must still index the vocabulary; padded slots come out as a very negative number, not
/// a log-probability).
///
/// # Shapes
/// - `logits`: `[batch, T, vocab]`
/// - `kept`, `padding`: `[batch, T, K]`
/// - output: `[batch, T, K]`
pub fn kept_log_softmax(
    logits: Tensor<3>,
    kept: Tensor<3, Int>,
    padding: Tensor<3, Bool>,
    temperature: Option<f64>,
) -> Result<Tensor<3>> {
    check_kept(&logits, &kept, &padding)?;
    let z = scale_by_temperature(logits, temperature)?
        .gather(2, kept)
        .mask_fill(padding, PADDED_LOGIT);
    Ok(log_softmax(z, 2))
}

/// Kept sets of the shape `[batch, T, K]` of `logits`' first two dimensions.
fn check_kept(logits: &Tensor<3>, kept: &Tensor<3, Int>, padding: &Tensor<3, Bool>) -> Result<()> {
    let [b, t, _] = logits.dims();
    let k = kept.dims()[2];
    for (name, got) in [("kept", kept.dims()), ("padding", padding.dims())] {
        if got[..2] != [b, t] || got[2] != k {
            return Err(AlgoError::ShapeMismatch {
                name,
                expected: format!("[batch, T, K] = [{b}, {t}, {k}] to match logits and kept"),
                got: got.to_vec(),
            });
        }
    }
    Ok(())
}

/// The log of the probability mass the whole-vocabulary softmax of the temperature-scaled
/// logits puts inside each position's kept set, `log Σ_{j ∈ kept} softmax(z)_j ≤ 0`: 0 when the
/// set holds all the mass, and `1 − exp` of it is the mass outside the set, which a loss over
/// the kept sets ([`kept_log_softmax`]) neither sees nor moves. Differentiable with respect to
/// `logits`: the gradient of logit `j` is `softmax_kept(z)_j·[j ∈ kept] − softmax(z)_j`, so
/// raising it pulls mass from outside the set into it.
///
/// # Shapes
/// - `logits`: `[batch, T, vocab]`
/// - `kept`, `padding`: `[batch, T, K]` (as [`kept_log_softmax`])
/// - output: `[batch, T]`
pub fn kept_log_mass(
    logits: Tensor<3>,
    kept: Tensor<3, Int>,
    padding: Tensor<3, Bool>,
    temperature: Option<f64>,
) -> Result<Tensor<2>> {
    check_kept(&logits, &kept, &padding)?;
    let lp = log_softmax(scale_by_temperature(logits, temperature)?, 2)
        .gather(2, kept)
        .mask_fill(padding, PADDED_LOGIT);
    // log-sum-exp over the set, shifted by its largest term (a constant for the gradient).
    let top = lp.clone().max_dim(2).detach();
    let mass = (lp - top.clone()).exp().sum_dim(2).log() + top;
    Ok(mass.clamp_max(0.0).squeeze_dim::<2>(2))
}

/// [`logprobs_from_logits`] under a sampling mask: the log-probability of each position's
/// label in the renormalised distribution over its kept set, `z_y − logsumexp_{j ∈ kept} z_j`
/// ([`kept_log_softmax`]). The label is slot 0 of `kept`.
///
/// # Shapes
/// - `logits`: `[batch, T, vocab]`
/// - `kept`, `padding`: `[batch, T, K]`, `kept[.., .., 0]` the labels
/// - output: `[batch, T]`
pub fn logprobs_over_kept(
    logits: Tensor<3>,
    kept: Tensor<3, Int>,
    padding: Tensor<3, Bool>,
    temperature: Option<f64>,
) -> Result<Tensor<2>> {
    Ok(kept_log_softmax(logits, kept, padding, temperature)?
        .narrow(2, 0, 1)
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

    #[test]
    fn kept_sets_renormalise_over_their_tokens_only() {
        let dev = Device::flex();
        let z = [[1.0f32, 2.0, 3.0, -1.0], [0.5, 0.5, 4.0, 2.0]];
        let logits = Tensor::<3>::from_floats([z], &dev);
        // Position 0 keeps {1, 2} (label 1), position 1 keeps {2, 3, 0} (label 3); slot 2 of
        // position 0 is padding.
        let kept = Tensor::<3, Int>::from_data(TensorData::from([[[1i64, 2, 1], [3, 2, 0]]]), &dev);
        let padding = Tensor::<3, Bool>::from_data(
            TensorData::from([[[false, false, true], [false, false, false]]]),
            &dev,
        );
        for temperature in [None, Some(0.7)] {
            let tau = temperature.unwrap_or(1.0);
            let lp = to_host(
                &logprobs_over_kept(logits.clone(), kept.clone(), padding.clone(), temperature)
                    .unwrap(),
            )
            .unwrap();
            let over = |row: &[f32; 4], set: &[usize], y: usize| {
                let lse = set
                    .iter()
                    .map(|&j| (f64::from(row[j]) / tau).exp())
                    .sum::<f64>()
                    .ln();
                f64::from(row[y]) / tau - lse
            };
            assert!((lp[0] - over(&z[0], &[1, 2], 1)).abs() < 1e-6, "{lp:?}");
            assert!((lp[1] - over(&z[1], &[3, 2, 0], 3)).abs() < 1e-6, "{lp:?}");
        }
        let short = Tensor::<3, Bool>::from_data(TensorData::from([[[false, true]]]), &dev);
        assert!(logprobs_over_kept(logits, kept, short, None).is_err());
    }

    /// The mass inside each kept set against the softmax summed by hand, and its gradient
    /// against central differences: it moves the logits outside the set too.
    #[test]
    fn kept_mass_is_the_softmax_summed_over_the_set() {
        let dev = Device::flex().autodiff();
        let z = [[1.0f32, 2.0, 3.0, -1.0], [0.5, 0.5, 4.0, 2.0]];
        let kept =
            || Tensor::<3, Int>::from_data(TensorData::from([[[1i64, 2, 1], [3, 0, 0]]]), &dev);
        let padding = || {
            Tensor::<3, Bool>::from_data(
                TensorData::from([[[false, false, true], [false, false, true]]]),
                &dev,
            )
        };
        let sets: [&[usize]; 2] = [&[1, 2], &[3, 0]];
        let by_hand = |z: &[[f32; 4]; 2], tau: f64| -> Vec<f64> {
            z.iter()
                .zip(sets)
                .map(|(row, set)| {
                    let e: Vec<f64> = row.iter().map(|&x| (f64::from(x) / tau).exp()).collect();
                    (set.iter().map(|&j| e[j]).sum::<f64>() / e.iter().sum::<f64>()).ln()
                })
                .collect()
        };
        for temperature in [None, Some(0.7)] {
            let tau = temperature.unwrap_or(1.0);
            let logits = Tensor::<3>::from_floats([z], &dev).require_grad();
            let mass = kept_log_mass(logits.clone(), kept(), padding(), temperature).unwrap();
            let got = to_host(&mass).unwrap();
            let want = by_hand(&z, tau);
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() < 1e-5, "{got:?} vs {want:?}");
            }
            let grads = mass.sum().backward();
            let g = to_host(&logits.grad(&grads).unwrap()).unwrap();
            for i in 0..2 {
                for j in 0..4 {
                    let h = 1e-3f32;
                    let (mut up, mut down) = (z, z);
                    up[i][j] += h;
                    down[i][j] -= h;
                    let d = (by_hand(&up, tau)[i] - by_hand(&down, tau)[i]) / f64::from(2.0 * h);
                    let at = g[i * 4 + j];
                    assert!((at - d).abs() < 1e-3, "d/dz[{i}][{j}] {at} vs {d}");
                }
            }
        }
    }
}
