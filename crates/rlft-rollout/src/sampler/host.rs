//! The host draw ([`SampleOn::Host`](super::SampleOn::Host)): tempered softmax, top-k, min-p and top-p on one row of
//! logits in host memory, the inverse-CDF draw with a running sum in f64, and the token's
//! log-prob under the distribution it was drawn from.

use super::{Draw, SamplingConfig};
use rayon::prelude::*;

/// One token per row drawn on the host from row-major `[rows, vocab]` (temperature-scaled)
/// logits with the uniform variates `draws` (greedy where `None`): the draw of
/// [`SampleOn::Host`](super::SampleOn::Host). Each [`Draw`] holds the token's log-prob under the
/// distribution actually sampled from: the tempered softmax, or with top-k / min-p / top-p the
/// filtered and renormalised one (then also the log of the kept mass).
pub fn draw_on_host(
    logits: &[f32],
    vocab: usize,
    cfg: &SamplingConfig,
    draws: &[Option<f64>],
) -> Vec<Draw> {
    logits
        .par_chunks(vocab)
        .zip(draws)
        .map(|(x, u)| pick(x, cfg, *u))
        .collect()
}

pub(super) fn argmax(x: &[f32]) -> usize {
    x.iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &v)| {
            if v > bv { (i, v) } else { (bi, bv) }
        })
        .0
}

/// The next token and its log-prob from (temperature-scaled) logits `x`: greedy without a
/// variate `u` (log-prob under the full softmax), else drawn as [`sample`] does. Without
/// filters one pass of `exp` serves both the normaliser and the draw; with filters the
/// log-prob is `x_y − log Σ_kept exp x` and the kept mass `S` is reported, both in f64.
fn pick(x: &[f32], cfg: &SamplingConfig, u: Option<f64>) -> Draw {
    match u {
        Some(u) if cfg.has_filters() => {
            let (token, kept, kept_ids) = draw_filtered(x, cfg, u);
            let max = f64::from(x.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)));
            let total: f64 = x.iter().map(|&v| (f64::from(v) - max).exp()).sum();
            // `kept` is relative to the kept tokens' maximum, which is the row's maximum.
            Draw {
                token,
                logprob: ((f64::from(x[token]) - max) - kept.ln()) as f32,
                log_kept_mass: (kept.ln() - total.ln()).min(0.0),
                kept_ids,
            }
        }
        _ => {
            let (max, p, total) = exp_weights(x);
            let token = match u {
                None => argmax(x),
                Some(u) => inverse_cdf(&p, u * total),
            };
            Draw {
                token,
                logprob: x[token] - max - total.ln() as f32,
                log_kept_mass: 0.0,
                kept_ids: None,
            }
        }
    }
}

/// `(max x, exp(x − max), Σ exp(x − max))`: the unnormalised probabilities of logits `x`.
fn exp_weights(x: &[f32]) -> (f32, Vec<f32>, f64) {
    let max = x.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let p: Vec<f32> = x.iter().map(|&v| (v - max).exp()).collect();
    let total = p.iter().map(|&q| f64::from(q)).sum();
    (max, p, total)
}

/// The first index where the running sum of `p` exceeds `target` (the last nonzero one if
/// rounding leaves it short).
fn inverse_cdf(p: &[f32], target: f64) -> usize {
    let mut acc = 0.0f64;
    let mut last = 0;
    for (i, &q) in p.iter().enumerate() {
        if q > 0.0 {
            last = i;
        }
        acc += f64::from(q);
        if acc > target {
            return i;
        }
    }
    last
}

/// Draws a token from log-probs (or logits) `lp` with uniform variate `u ∈ [0, 1)`, applying
/// top-k, min-p and top-p (in that order, as vLLM does) when set.
#[cfg(test)]
pub(super) fn sample(lp: &[f32], cfg: &SamplingConfig, u: f64) -> usize {
    if !cfg.has_filters() {
        let (_, p, total) = exp_weights(lp);
        return inverse_cdf(&p, u * total);
    }
    draw_filtered(lp, cfg, u).0
}

/// The filtered draw: the token, the kept tokens' total weight `Σ_kept exp(lp − max lp)` (the
/// most likely token at weight 1) in f64, and the kept ids when recorded
/// ([`SamplingConfig::kept_ids_max`]).
fn draw_filtered(lp: &[f32], cfg: &SamplingConfig, u: f64) -> (usize, f64, Option<Vec<u32>>) {
    let mut idx: Vec<usize> = (0..lp.len()).collect();
    if cfg.top_k > 0 && cfg.top_k < idx.len() {
        idx.select_nth_unstable_by(cfg.top_k - 1, |&a, &b| lp[b].total_cmp(&lp[a]));
        idx.truncate(cfg.top_k);
    }
    idx.sort_unstable_by(|&a, &b| lp[b].total_cmp(&lp[a]).then(a.cmp(&b)));
    let max = lp[idx[0]] as f64;
    let mut probs: Vec<f64> = idx.iter().map(|&i| (lp[i] as f64 - max).exp()).collect();
    if cfg.min_p > 0.0 {
        let keep = probs.iter().take_while(|&&p| p >= cfg.min_p).count().max(1);
        probs.truncate(keep);
    }
    if cfg.top_p < 1.0 {
        let total: f64 = probs.iter().sum();
        let mut acc = 0.0;
        let mut keep = probs.len();
        for (i, p) in probs.iter().enumerate() {
            acc += p / total;
            if acc >= cfg.top_p {
                keep = i + 1;
                break;
            }
        }
        probs.truncate(keep);
    }
    let kept: f64 = probs.iter().sum();
    let n = probs.len();
    let ids = (cfg.kept_ids_max >= n).then(|| idx[..n].iter().map(|&i| i as u32).collect());
    let target = u * kept;
    let mut acc = 0.0;
    for (i, p) in probs.iter().enumerate() {
        acc += p;
        if acc > target {
            return (idx[i], kept, ids);
        }
    }
    (idx[n - 1], kept, ids)
}
