//! Sampling on the model's device: the tempered softmax, top-k, min-p and top-p filters, the
//! inverse-CDF draw and the behaviour log-probs run as tensor operations, so only each row's
//! sampled id and its log-prob leave the device per step (instead of a `[rows, vocab]` block of
//! logits). The uniform variates come from the host (the same generator, in the same row order
//! as the host path), so every backend draws the same tokens but where two tokens' cumulative
//! probabilities lie within f32 rounding of the variate.
//!
//! The filters follow the host path ([`super::draw_on_host`]): top-k, then min-p relative to the most
//! likely token, then the smallest prefix whose probability reaches top-p, on the tokens sorted
//! by probability; without filters the draw walks the vocabulary in id order as the host does.
//! On wgpu and CUDA burn 0.22 sorts on the host, so the filters cost one round trip of the
//! logits; the unfiltered draw needs no sort.

use super::{Draw, SamplingConfig};
use crate::{Result, RolloutError};
use burn::tensor::{Int, Tensor, TensorData};

/// As [`super::draw_on_host`] on the logits' device ([`SampleOn::Device`](super::SampleOn::Device)): only the tokens,
/// their log-probs (under the distribution sampled from) and, with filters, the log of the kept
/// mass are read back.
///
/// # Shapes
/// - `logits`: `[rows, vocab]`; `draws`: one per row, all `Some` or all `None`
///
/// # Errors
/// When the results cannot be read back from the device.
pub fn draw_on_device(
    logits: Tensor<2>,
    cfg: &SamplingConfig,
    draws: &[Option<f64>],
) -> Result<Vec<Draw>> {
    let [n, v] = logits.dims();
    let device = logits.device();
    let max = logits.clone().max_dim(1);
    let shifted = logits - max;
    // log softmax over the whole vocabulary: μ is the learner's tempered softmax.
    let p = shifted.clone().exp();
    let log_total = p.clone().sum_dim(1).log();
    // Below 1 in f32 too (a variate within 2^-25 of 1 would round to it).
    let below_one = f32::from_bits(0x3F7F_FFFF);
    let uniforms: Option<Vec<f32>> = draws
        .iter()
        .map(|u| u.map(|u| (u as f32).min(below_one)))
        .collect();
    let to_host = |t: Tensor<2>, what: &str| {
        t.into_data()
            .convert::<f32>()
            .try_into_vec::<f32>()
            .map_err(|e| RolloutError::Input(format!("{what} to host: {e:?}")))
    };
    let ints = |t: Tensor<2, Int>, what: &str| {
        t.into_data()
            .convert::<i64>()
            .try_into_vec::<i64>()
            .map_err(|e| RolloutError::Input(format!("{what} to host: {e:?}")))
    };
    let mut kept_ids: Vec<Option<Vec<u32>>> = vec![None; n];
    let (token, lp, log_mass) = match uniforms {
        None => {
            let token = shifted.clone().argmax(1);
            let lp = shifted.gather(1, token.clone()) - log_total;
            (token, lp, None)
        }
        Some(u) => {
            let u = Tensor::<2>::from_data(TensorData::new(u, [n, 1]), &device);
            if cfg.has_filters() {
                // μ under the filtered, renormalised distribution; log S = log of the kept mass.
                let (token, kept, (count, order)) = filtered(shifted.clone(), cfg, u);
                if cfg.kept_ids_max > 0 {
                    // The kept set is a prefix of the descending order: its first `count` ids.
                    let width = cfg.kept_ids_max.min(v);
                    let counts = ints(count, "kept counts")?;
                    let order = ints(order.narrow(1, 0, width), "kept ids")?;
                    for (r, slot) in kept_ids.iter_mut().enumerate() {
                        let c = counts[r].max(1) as usize;
                        if c <= cfg.kept_ids_max {
                            let row = &order[r * width..r * width + c.min(width)];
                            *slot = Some(row.iter().map(|&i| i as u32).collect());
                        }
                    }
                }
                let log_kept = kept.log();
                let lp = shifted.gather(1, token.clone()) - log_kept.clone();
                (token, lp, Some(log_kept - log_total))
            } else {
                let token = inverse_cdf(p, u, v);
                let lp = shifted.gather(1, token.clone()) - log_total;
                (token, lp, None)
            }
        }
    };
    let ids = ints(token, "sampled ids")?;
    let lps = to_host(lp, "log-probs")?;
    let masses = match log_mass {
        Some(m) => to_host(m, "kept masses")?,
        None => vec![0.0; n],
    };
    Ok(ids
        .into_iter()
        .zip(lps)
        .zip(masses)
        .zip(kept_ids)
        .map(|(((t, logprob), m), kept_ids)| Draw {
            token: t.clamp(0, v as i64 - 1) as usize,
            logprob,
            log_kept_mass: f64::from(m).min(0.0),
            kept_ids,
        })
        .collect())
}

/// The first index where the running sum of the weights `w` exceeds `u` times their total, per
/// row (clamped to the last index against rounding).
///
/// # Shapes
/// - `w`: `[rows, vocab]`, `u`: `[rows, 1]` → `[rows, 1]`
fn inverse_cdf(w: Tensor<2>, u: Tensor<2>, v: usize) -> Tensor<2, Int> {
    let [n, _] = w.dims();
    let position = Tensor::<1, Int>::arange(0..v as i64, &w.device())
        .reshape([1, v])
        .expand([n, v]);
    // The last token with weight, should rounding leave the running sum short of the target.
    let last = (w.clone().greater_elem(0.0).int() * position).max_dim(1);
    let cum = w.cumsum(1);
    let total = cum.clone().narrow(1, v - 1, 1);
    let below = cum.lower_equal(total * u).int().sum_dim(1);
    below.min_pair(last)
}

/// The draw among the tokens kept by top-k, min-p and top-p, as a vocabulary id per row; the
/// kept tokens' total weight `Σ_kept exp(shifted)`; and the kept set: how many tokens, and the
/// vocabulary in descending order (the kept ones first).
///
/// # Shapes
/// - `shifted`: `[rows, vocab]` logits minus their row maximum, `u`: `[rows, 1]` →
///   `[rows, 1]`, `[rows, 1]`, (`[rows, 1]`, `[rows, vocab]`)
fn filtered(
    shifted: Tensor<2>,
    cfg: &SamplingConfig,
    u: Tensor<2>,
) -> (Tensor<2, Int>, Tensor<2>, (Tensor<2, Int>, Tensor<2, Int>)) {
    let [n, v] = shifted.dims();
    let device = shifted.device();
    let (sorted, order) = shifted.sort_descending_with_indices(1);
    // Relative probabilities, the most likely token at 1.
    let p = sorted.exp();
    let position = Tensor::<1, Int>::arange(0..v as i64, &device)
        .reshape([1, v])
        .expand([n, v]);
    let mut keep = Tensor::<2>::ones([n, v], &device);
    if cfg.top_k > 0 && cfg.top_k < v {
        keep = keep * position.lower_elem(cfg.top_k as i64).float();
    }
    if cfg.min_p > 0.0 {
        // The most likely token (at 1 > min_p) always stays.
        keep = keep * p.clone().greater_equal_elem(cfg.min_p).float();
    }
    if cfg.top_p < 1.0 {
        let w = p.clone() * keep.clone();
        let total = w.clone().sum_dim(1);
        // A token stays while the probability of the tokens before it is short of top_p.
        let before = (w.clone().cumsum(1) - w) / total;
        keep = keep * before.lower_elem(cfg.top_p).float();
    }
    // The most likely token always stays: first in the order, before it nothing (top-p), at
    // weight 1 (min-p below 1).
    let kept = keep.clone().sum_dim(1).int().clamp_min(1);
    let w = p * keep;
    let mass = w.clone().sum_dim(1);
    let at = inverse_cdf(w, u, v).min_pair(kept.clone() - 1);
    (order.clone().gather(1, at), mass, (kept, order))
}
