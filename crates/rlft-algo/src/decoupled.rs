//! Decoupled PPO's three policies (AReaL): the behaviour policy `μ` that sampled a token, the
//! proximal policy `π_prox` that anchors the clip, and `πθ`. Here: the log-linear approximation
//! of `π_prox` from per-token versions, M2PO's second-moment token mask, and rejection sampling
//! of tokens or rows by the `π_prox`/`μ` ratio or by a binary KL (KPop), with the behaviour
//! weight `π_prox/μ` that multiplies the loss.
//!
//! Masks and weights are computed on the host from detached values (AReaL computes them under
//! `no_grad`); the float32 steps AReaL takes are reproduced in f32.

use crate::loss::PolicyLossInput;
use crate::masked::{check_shape, from_host, to_host};
use crate::{AlgoError, Result};
use burn::tensor::Tensor;

fn host3(
    a: &Tensor<2>,
    b: &Tensor<2>,
    mask: &Tensor<2>,
    names: [&'static str; 2],
) -> Result<(Vec<f64>, Vec<f64>, Vec<f64>)> {
    let dims = a.dims();
    check_shape(
        names[1],
        b,
        dims,
        "the [batch, T] shape of the first log-probs",
    )?;
    check_shape(
        "response_mask",
        mask,
        dims,
        "the [batch, T] shape of the log-probs",
    )?;
    Ok((to_host(a)?, to_host(b)?, to_host(mask)?))
}

/// AReaL's `prox_logp_method="loglinear"`: `log π_prox = log μ + α·(sg log πθ − log μ)` with
/// `α = clamp((v_prox − v)/(v_cur − v), 0, 1)` in float32, `v_prox = v_cur − 1`, and `α = 0`
/// where `v_cur − v ≤ 0` or the version is negative. The gradient reaches `πθ` only through the
/// ratio `πθ/π_prox` that uses it.
///
/// # Shapes
/// - `log_prob`, `behaviour_log_prob`, `versions`, `mask`: `[batch, T]` → `[batch, T]`
pub fn loglinear_prox(
    log_prob: &Tensor<2>,
    behaviour_log_prob: &Tensor<2>,
    versions: &Tensor<2>,
    mask: &Tensor<2>,
    current_version: i64,
) -> Result<Tensor<2>> {
    let dims = log_prob.dims();
    check_shape(
        "versions",
        versions,
        dims,
        "the [batch, T] shape of log_prob",
    )?;
    let (_, _, _) = host3(
        log_prob,
        behaviour_log_prob,
        mask,
        ["log_prob", "behaviour_log_prob"],
    )?;
    let v = to_host(versions)?;
    let cur = current_version as f32;
    let prox_v = (current_version - 1) as f32;
    let alpha: Vec<f64> = v
        .iter()
        .map(|&x| {
            let vf = x as f32;
            let gap = cur - vf;
            if gap > 0.0 && x >= 0.0 {
                f64::from(((prox_v - vf) / gap).clamp(0.0, 1.0))
            } else {
                0.0
            }
        })
        .collect();
    let alpha = from_host(alpha, dims, log_prob);
    let mu = behaviour_log_prob.clone();
    Ok((mu.clone() + alpha * (log_prob.clone().detach() - mu)).detach())
}

/// M2PO (AReaL `m2_threshold`): over the whole batch's valid tokens, sort `(log μ − log π_prox)²`
/// descending and remove the `k` largest from the mask, `k` the first index whose suffix mean
/// drops below `threshold` (all but one when none does). Batch-coupled: the selection depends
/// on every token of the batch.
///
/// # Shapes
/// - every input `[batch, T]` → `[batch, T]` mask
pub fn m2po_mask(
    behaviour_log_prob: &Tensor<2>,
    prox_log_prob: &Tensor<2>,
    mask: &Tensor<2>,
    threshold: f64,
) -> Result<Tensor<2>> {
    if !(threshold.is_finite() && threshold > 0.0) {
        return Err(AlgoError::InvalidSetting {
            name: "m2_threshold",
            value: threshold,
            allowed: "must be finite and > 0 (AReaL's example: 0.04)",
        });
    }
    let (mu, prox, m) = host3(
        behaviour_log_prob,
        prox_log_prob,
        mask,
        ["behaviour_log_prob", "prox_log_prob"],
    )?;
    let mut idx: Vec<(usize, f64)> = (0..m.len())
        .filter(|&k| m[k] > 0.5)
        .map(|k| (k, (mu[k] - prox[k]).powi(2)))
        .collect();
    idx.sort_by(|a, b| b.1.total_cmp(&a.1));
    let n = idx.len();
    let mut out: Vec<f64> = m.iter().map(|x| f64::from(*x > 0.5)).collect();
    if n > 0 {
        let mut suffix = vec![0.0; n + 1];
        for j in (0..n).rev() {
            suffix[j] = suffix[j + 1] + idx[j].1;
        }
        let k = (0..n)
            .find(|&j| suffix[j] / ((n - j) as f64) < threshold)
            .unwrap_or(n - 1);
        for (pos, _) in &idx[..k] {
            out[*pos] = 0.0;
        }
    }
    Ok(from_host(out, mask.dims(), mask))
}

/// What rejection sampling measures per token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectionMetric {
    /// `π_prox/μ`, from the float32 log-ratio.
    Ratio,
    /// KPop: `max(KLb(p‖q), KLb(q‖p))` of the Bernoulli distributions of the sampled token
    /// under `π_prox` (p) and `μ` (q), both clamped to `[1e-8, 1 − 1e-8]`.
    BinaryKl,
}

/// Whether rejection acts on tokens or on whole rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectionLevel {
    /// Each token against the bounds.
    Token,
    /// Each row's aggregated metric against the bounds.
    Sequence,
}

/// How a row's token metrics are aggregated (arithmetically, over its valid tokens; an empty
/// row gives 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectionAgg {
    /// `Σ / max(n, 1)`.
    Mean,
    /// `Σ`.
    Sum,
    /// The largest.
    Max,
}

/// AReaL's `rejection_sampling` settings (`action = "mask"`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RejectionConfig {
    /// Token or sequence.
    pub level: RejectionLevel,
    /// The metric.
    pub metric: RejectionMetric,
    /// Row aggregation (sequence level).
    pub agg: RejectionAgg,
    /// Keep where the metric is at most this.
    pub upper: f64,
    /// Keep where the metric is at least this, when set.
    pub lower: Option<f64>,
}

/// Rejection sampling's result.
#[derive(Debug, Clone)]
pub struct Rejection {
    /// `mask ∧ keep`, `[batch, T]`.
    pub mask: Tensor<2>,
    /// The behaviour weight `exp(f32(log π_prox) − f32(log μ))`, 0 where non-finite or rejected,
    /// `[batch, T]` (multiply the loss with it; rejected tokens stay in the denominator).
    pub weight: Tensor<2>,
    /// `#(valid ∧ ¬keep) / max(#valid, 1)`.
    pub filtered_fraction: f64,
    /// Mean weight over the tokens it is positive and kept (AReaL's `behave_imp_weight/avg`).
    pub weight_mean: f64,
    /// Tokens of the input mask dropped or zero-weighted, over its count (AReaL's
    /// `behave_filtered_ratio/avg`).
    pub filtered_ratio: f64,
}

/// AReaL's `apply_rejection_sampling(prox, μ, mask, cfg)` with the behaviour weight.
///
/// # Shapes
/// - `prox_log_prob`, `behaviour_log_prob`, `mask`: `[batch, T]`
pub fn rejection_sampling(
    prox_log_prob: &Tensor<2>,
    behaviour_log_prob: &Tensor<2>,
    mask: &Tensor<2>,
    cfg: &RejectionConfig,
) -> Result<Rejection> {
    if !(cfg.upper.is_finite() && cfg.lower.is_none_or(|l| l.is_finite() && l <= cfg.upper)) {
        return Err(AlgoError::InvalidSetting {
            name: "rejection_sampling.upper",
            value: cfg.upper,
            allowed: "must be finite and at least rejection_sampling.lower",
        });
    }
    let [b, t] = mask.dims();
    let (prox, mu, m) = host3(
        prox_log_prob,
        behaviour_log_prob,
        mask,
        ["prox_log_prob", "behaviour_log_prob"],
    )?;
    let w32: Vec<f32> = prox
        .iter()
        .zip(&mu)
        .map(|(p, q)| ((*p as f32) - (*q as f32)).exp())
        .collect();
    let bkl = |p: f64, q: f64| p * (p / q).ln() + (1.0 - p) * ((1.0 - p) / (1.0 - q)).ln();
    let metric: Vec<f64> = (0..m.len())
        .map(|k| match cfg.metric {
            RejectionMetric::Ratio => f64::from(w32[k]),
            RejectionMetric::BinaryKl => {
                let p = prox[k].exp().clamp(1e-8, 1.0 - 1e-8);
                let q = mu[k].exp().clamp(1e-8, 1.0 - 1e-8);
                bkl(p, q).max(bkl(q, p))
            }
        })
        .collect();
    let inside = |x: f64| x <= cfg.upper && cfg.lower.is_none_or(|l| x >= l);
    let valid = |k: usize| m[k] > 0.5;
    let mut keep = vec![false; m.len()];
    for i in 0..b {
        let row = i * t..(i + 1) * t;
        match cfg.level {
            RejectionLevel::Token => row.for_each(|k| keep[k] = inside(metric[k])),
            RejectionLevel::Sequence => {
                let vals: Vec<f64> = row
                    .clone()
                    .filter(|&k| valid(k))
                    .map(|k| metric[k])
                    .collect();
                let agg = match cfg.agg {
                    RejectionAgg::Mean => vals.iter().sum::<f64>() / (vals.len().max(1)) as f64,
                    RejectionAgg::Sum => vals.iter().sum(),
                    RejectionAgg::Max if vals.is_empty() => 0.0,
                    RejectionAgg::Max => vals.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                };
                let ok = inside(agg);
                row.for_each(|k| keep[k] = ok);
            }
        }
    }
    let n_valid = (0..m.len()).filter(|&k| valid(k)).count();
    let rejected = (0..m.len()).filter(|&k| valid(k) && !keep[k]).count();
    let new_mask: Vec<f64> = (0..m.len())
        .map(|k| f64::from(valid(k) && keep[k]))
        .collect();
    let weight: Vec<f64> = (0..m.len())
        .map(|k| {
            let w = f64::from(w32[k]);
            if w.is_finite() && new_mask[k] > 0.5 {
                w
            } else {
                0.0
            }
        })
        .collect();
    let used: Vec<usize> = (0..m.len())
        .filter(|&k| weight[k] > 0.0 && new_mask[k] > 0.5)
        .collect();
    let weight_mean = if used.is_empty() {
        0.0
    } else {
        used.iter().map(|&k| weight[k]).sum::<f64>() / used.len() as f64
    };
    let denom = n_valid.max(1) as f64;
    Ok(Rejection {
        mask: from_host(new_mask, [b, t], mask),
        weight: from_host(weight, [b, t], mask),
        filtered_fraction: rejected as f64 / denom,
        weight_mean,
        filtered_ratio: (n_valid - used.len()) as f64 / denom,
    })
}

/// AReaL's decoupled-loss settings for [`prepare_decoupled`].
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct DecoupledConfig {
    /// The trainer's current policy version; with per-token versions and no `prox_log_prob`
    /// the proximal policy is the log-linear approximation.
    pub current_version: Option<i64>,
    /// M2PO's threshold on the mean second moment (None: off).
    pub m2_threshold: Option<f64>,
    /// Rejection sampling (None: off; AReaL then applies no behaviour weight).
    pub rejection: Option<RejectionConfig>,
}

/// [`prepare_decoupled`]'s result.
#[derive(Debug, Clone)]
pub struct Decoupled {
    /// The input to pass to the loss (`ppo` for AReaL's `grpo_loss_fn`).
    pub input: PolicyLossInput,
    /// The proximal log-probs used.
    pub prox_log_prob: Tensor<2>,
    /// The M2PO mask, when on (it is also `input.response_mask`).
    pub m2po_mask: Option<Tensor<2>>,
    /// The rejection result, when on (its weight is also `input.rollout_is_weights`).
    pub rejection: Option<Rejection>,
}

/// Prepares a [`PolicyLossInput`] for AReaL's decoupled PPO from one that carries `μ`
/// (`behaviour_log_prob`, else `old_log_prob`) and either `prox_log_prob` or per-token
/// `versions`: π_prox becomes the ratio's anchor (`old_log_prob`), M2PO shrinks the response
/// mask, and rejection sampling's behaviour weight becomes the rollout IS weight (rejected
/// tokens stay in the denominator).
///
/// # Shapes
/// - every tensor of `input` `[batch, T]` (as [`PolicyLossInput`] requires)
pub fn prepare_decoupled(input: PolicyLossInput, cfg: &DecoupledConfig) -> Result<Decoupled> {
    let mu = input
        .behaviour_log_prob
        .clone()
        .unwrap_or_else(|| input.old_log_prob.clone());
    let prox = match (&input.prox_log_prob, &input.versions, cfg.current_version) {
        (Some(p), _, _) => p.clone(),
        (None, Some(v), Some(cur)) => {
            loglinear_prox(&input.log_prob, &mu, v, &input.response_mask, cur)?
        }
        _ => {
            return Err(AlgoError::MissingInput {
                loss: "decoupled PPO".into(),
                input: "prox_log_prob",
                hint: "pass the proximal log-probs with PolicyLossInput::with_prox_log_prob, or per-token versions (with_versions) and DecoupledConfig::current_version for the log-linear approximation",
            });
        }
    };
    let m2po = match cfg.m2_threshold {
        Some(thr) => Some(m2po_mask(&mu, &prox, &input.response_mask, thr)?),
        None => None,
    };
    let mask = m2po.clone().unwrap_or_else(|| input.response_mask.clone());
    let rejection = match &cfg.rejection {
        Some(rc) => Some(rejection_sampling(&prox, &mu, &mask, rc)?),
        None => None,
    };
    let mut out = input;
    out.old_log_prob = prox.clone();
    out.response_mask = mask;
    out.prox_log_prob = Some(prox.clone());
    out.behaviour_log_prob = Some(mu);
    if let Some(r) = &rejection {
        out.rollout_is_weights = Some(match out.rollout_is_weights.take() {
            Some(w) => w * r.weight.clone(),
            None => r.weight.clone(),
        });
    }
    Ok(Decoupled {
        input: out,
        prox_log_prob: prox,
        m2po_mask: m2po,
        rejection,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::t2;

    #[test]
    fn prepare_needs_a_proximal_policy() {
        let lp = t2(vec![0.0; 2], 1, 2);
        let m = t2(vec![1.0; 2], 1, 2);
        let input = PolicyLossInput::new(lp.clone(), lp.clone(), lp.clone(), m);
        let err = prepare_decoupled(input.clone(), &DecoupledConfig::default()).unwrap_err();
        assert!(matches!(
            err,
            AlgoError::MissingInput {
                input: "prox_log_prob",
                ..
            }
        ));
        let cfg = DecoupledConfig {
            current_version: Some(3),
            ..Default::default()
        };
        let d = prepare_decoupled(input.with_versions(t2(vec![1.0, 2.0], 1, 2)), &cfg).unwrap();
        assert_eq!(to_host(&d.prox_log_prob).unwrap(), vec![0.0, 0.0]);
    }

    #[test]
    fn loglinear_interpolates_by_version() {
        let lp = t2(vec![0.0; 5], 1, 5);
        let mu = t2(vec![-1.0; 5], 1, 5);
        let v = t2(vec![10.0, 9.0, 8.0, 6.0, -1.0], 1, 5);
        let m = t2(vec![1.0; 5], 1, 5);
        let p = to_host(&loglinear_prox(&lp, &mu, &v, &m, 10).unwrap()).unwrap();
        let want = [-1.0, -1.0, -0.5, -0.25, -1.0];
        for (p, w) in p.iter().zip(want) {
            assert!((p - w).abs() < 1e-7, "{p} vs {w}");
        }
    }

    #[test]
    fn m2po_drops_the_largest_second_moments() {
        let mu = t2(vec![0.0, 0.0, 0.0, 0.0], 1, 4);
        let prox = t2(vec![1.0, 0.1, 0.1, 0.1], 1, 4);
        let m = t2(vec![1.0; 4], 1, 4);
        let k = to_host(&m2po_mask(&mu, &prox, &m, 0.05).unwrap()).unwrap();
        assert_eq!(k, vec![0.0, 1.0, 1.0, 1.0]);
        assert!(m2po_mask(&mu, &prox, &m, 0.0).is_err());
    }

    #[test]
    fn kpop_rejects_far_tokens_and_keeps_them_in_the_count() {
        let prox = t2(vec![-0.1, -3.0, -1.0, -1.0], 2, 2);
        let mu = t2(vec![-0.1, -0.1, -1.0, -1.0], 2, 2);
        let m = t2(vec![1.0, 1.0, 1.0, 0.0], 2, 2);
        let cfg = RejectionConfig {
            level: RejectionLevel::Token,
            metric: RejectionMetric::BinaryKl,
            agg: RejectionAgg::Mean,
            upper: 0.5,
            lower: None,
        };
        let r = rejection_sampling(&prox, &mu, &m, &cfg).unwrap();
        assert_eq!(to_host(&r.mask).unwrap(), vec![1.0, 0.0, 1.0, 0.0]);
        assert!((r.filtered_fraction - 1.0 / 3.0).abs() < 1e-12);
        let w = to_host(&r.weight).unwrap();
        assert!(w[1] == 0.0 && (w[0] - 1.0).abs() < 1e-6);
    }
}
