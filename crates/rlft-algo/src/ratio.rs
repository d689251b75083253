//! Importance ratios `ρ = πθ/μ` at token, sequence (GSPO) and cumulative (CTPO) level, and
//! truncated importance-sampling weights.

use crate::masked::{valid, zero_padding};
use crate::{AlgoError, Result};
use burn::tensor::{Int, Tensor};
use serde::{Deserialize, Serialize};

/// Bound on `|log ρ|` at token and cumulative level (verl clamps `log πθ − log μ` to ±20).
pub const LOG_RATIO_CLAMP: f64 = 20.0;
/// Upper bound on the sequence-level log-ratio (verl's GSPO clamps it at 10).
pub const SEQ_LOG_RATIO_MAX: f64 = 10.0;

/// Which actions an importance ratio covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RatioLevel {
    /// `ρ_t = exp(log πθ(a_t) − log μ(a_t))`: each token on its own (PPO, GRPO, DAPO, CISPO).
    Token,
    /// GSPO: `s_i = exp(mean_t log ρ_t)` for the whole response, applied to every token with the
    /// stop-gradient trick `log πθ − sg(log πθ) + sg(log s_i)` (value `s_i`, gradient `s_i·∇log πθ`).
    Sequence,
    /// CTPO: the prefix product `log ρ_t^cum = Σ_{k≤t} log ρ_k` (or its geometric mean, divided by
    /// the number of tokens so far), which sees how likely the history itself was.
    Cumulative,
    /// TRL's sequence level (LUSPO, GSPO in TRL): `s_i = exp(mean_t log ρ_t)` on every token,
    /// unclamped, with the gradient through the whole mean (each valid token of row `i` gets
    /// `s_i/n_i` per broadcast copy), unlike [`RatioLevel::Sequence`].
    SequenceMean,
}

impl RatioLevel {
    /// All levels with their names.
    pub const ALL: [(RatioLevel, &'static str); 4] = [
        (RatioLevel::Token, "token"),
        (RatioLevel::Sequence, "sequence"),
        (RatioLevel::Cumulative, "cumulative"),
        (RatioLevel::SequenceMean, "sequence_mean"),
    ];
}

crate::error::impl_names!(RatioLevel, RatioLevel::ALL, "ratio level", |s| s
    .trim()
    .to_ascii_lowercase());

/// `log πθ − log μ` per token, exactly 0 (with zero gradient) at unmasked positions.
///
/// # Shapes
/// - all inputs `[batch, T]` → `[batch, T]`
pub fn token_log_ratio(
    log_prob: Tensor<2>,
    old_log_prob: Tensor<2>,
    mask: &Tensor<2>,
) -> Tensor<2> {
    zero_padding(log_prob - old_log_prob, mask)
}

/// Cap on the cumulative log-ratio (the CTPO authors' `min(log r_t, 10)`).
pub const CUM_LOG_RATIO_MAX: f64 = 10.0;

/// Where the gradient of a cumulative ratio flows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CumulativeGradient {
    /// The CTPO authors' form: `log r_t = sg(cum_t) + log πθ_t − sg(log πθ_t)`. The value is the
    /// cumulative ratio, the gradient that of token `t` alone (as GSPO does for sequences).
    #[default]
    CurrentToken,
    /// `log r_t = cum_t` differentiated as it is: token `t`'s loss also moves every earlier
    /// token of its prefix.
    FullPrefix,
}

impl CumulativeGradient {
    /// Both forms with their names.
    pub const ALL: [(CumulativeGradient, &'static str); 2] = [
        (CumulativeGradient::CurrentToken, "current_token"),
        (CumulativeGradient::FullPrefix, "full_prefix"),
    ];
}

crate::error::impl_names!(
    CumulativeGradient,
    CumulativeGradient::ALL,
    "cumulative gradient",
    |s| s.trim().to_ascii_lowercase()
);

/// Log importance ratio at the given level.
///
/// - token: `clamp(log πθ − log μ, ±20)`;
/// - sequence (GSPO): `min(sg(mean_t d) + log πθ − sg(log πθ), 10)`;
/// - sequence mean (TRL): `sum_t d·m / max(n, 1)` broadcast, unclamped, differentiated as it is;
/// - cumulative (CTPO, as its authors compute it): with `d_k = clamp(log πθ_k − log μ_k, ±20)`,
///   `cum_t = Σ_{k≤t} d_k·m_k`, divided by the number of valid tokens so far when
///   `geometric_mean`; then `min(cum_t, 10)` with the gradient of `gradient`.
///
/// # Shapes
/// - all inputs `[batch, T]` → `[batch, T]` (0 at unmasked positions for token/cumulative)
pub fn log_ratio(
    log_prob: Tensor<2>,
    old_log_prob: Tensor<2>,
    mask: &Tensor<2>,
    level: RatioLevel,
    geometric_mean: bool,
    gradient: CumulativeGradient,
) -> Tensor<2> {
    let d = token_log_ratio(log_prob.clone(), old_log_prob, mask);
    match level {
        RatioLevel::Token => d.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP),
        RatioLevel::Sequence => {
            let n = mask.clone().sum_dim(1).clamp_min(1.0);
            let seq = (d.sum_dim(1) / n).detach();
            let lp = zero_padding(log_prob, mask);
            (lp.clone() - lp.detach() + seq).clamp_max(SEQ_LOG_RATIO_MAX)
        }
        RatioLevel::SequenceMean => {
            let n = mask.clone().sum_dim(1).clamp_min(1.0);
            zero_padding(d.sum_dim(1) / n + mask.zeros_like(), mask)
        }
        RatioLevel::Cumulative => {
            let cum = d.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).cumsum(1);
            let cum = if geometric_mean {
                cum / valid_count_so_far(mask).clamp_min(1.0)
            } else {
                cum
            };
            let log_r = match gradient {
                CumulativeGradient::FullPrefix => cum,
                CumulativeGradient::CurrentToken => {
                    let lp = zero_padding(log_prob, mask);
                    cum.detach() + lp.clone() - lp.detach()
                }
            };
            zero_padding(log_r.clamp_max(CUM_LOG_RATIO_MAX), mask)
        }
    }
}

/// `Σ_{k≤t} m_k`: the 1-based position of each valid token among its row's valid tokens
/// (observation tokens and padding are not counted).
///
/// # Shapes
/// - `mask`: `[batch, T]` → `[batch, T]`
pub fn valid_count_so_far(mask: &Tensor<2>) -> Tensor<2> {
    zero_padding(mask.clone(), mask).cumsum(1)
}

/// 1-based token positions `t = 1..=T` as a float `[1, T]` row, in the dtype of `like`.
pub fn positions(like: &Tensor<2>) -> Tensor<2> {
    let [_, t] = like.dims();
    Tensor::<1, Int>::arange(1..(t as i64 + 1), &like.device())
        .float()
        .cast(like.dtype())
        .unsqueeze::<2>()
}

/// Truncated importance-sampling weights `min(exp(log π_old − log μ), cap)`, detached: the
/// correction for tokens whose behaviour policy `μ` (e.g. the rollout engine) differs from the
/// learner's `π_old`. Pass them as `rollout_is_weights`.
///
/// # Shapes
/// - all inputs `[batch, T]` → `[batch, T]` (1 at unmasked positions)
pub fn truncated_is_weights(
    old_log_prob: Tensor<2>,
    behaviour_log_prob: Tensor<2>,
    mask: &Tensor<2>,
    cap: f64,
) -> Result<Tensor<2>> {
    if !(cap.is_finite() && cap >= 1.0) {
        return Err(AlgoError::InvalidSetting {
            name: "truncated IS cap",
            value: cap,
            allowed: "must be finite and >= 1 (typical: 2.0)",
        });
    }
    let d = token_log_ratio(old_log_prob, behaviour_log_prob, mask)
        .clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP);
    Ok(d.exp()
        .clamp_max(cap)
        .mask_fill(valid(mask).bool_not(), 1.0)
        .detach())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::masked::to_host;

    use crate::testing::t2;

    /// The stale-samples lecture's numbers (docs/stale-samples.md, "The lecture"): 0.70/0.40 = 1.75
    /// and 0.20/0.40 = 0.50.
    #[test]
    fn seed_token_ratios() {
        let lp = t2(vec![0.70f64.ln(), 0.20f64.ln()], 1, 2);
        let mu = t2(vec![0.40f64.ln(), 0.40f64.ln()], 1, 2);
        let m = t2(vec![1.0, 1.0], 1, 2);
        let r = to_host(&log_ratio(lp, mu, &m, RatioLevel::Token, false, Default::default()).exp())
            .unwrap();
        assert!(
            (r[0] - 1.75).abs() < 1e-12 && (r[1] - 0.50).abs() < 1e-12,
            "{r:?}"
        );
    }

    /// Structural blindness: the next step has token ratio exactly 1, but the history that led
    /// there had probability ratio 0.10/0.40 = 0.25; only the cumulative ratio sees it.
    #[test]
    fn cumulative_ratio_sees_the_history() {
        let lp = t2(vec![0.10f64.ln(), 0.5f64.ln()], 1, 2);
        let mu = t2(vec![0.40f64.ln(), 0.5f64.ln()], 1, 2);
        let m = t2(vec![1.0, 1.0], 1, 2);
        let tok = to_host(
            &log_ratio(
                lp.clone(),
                mu.clone(),
                &m,
                RatioLevel::Token,
                false,
                Default::default(),
            )
            .exp(),
        )
        .unwrap();
        let cum = to_host(
            &log_ratio(
                lp,
                mu,
                &m,
                RatioLevel::Cumulative,
                false,
                Default::default(),
            )
            .exp(),
        )
        .unwrap();
        assert_eq!(tok[1], 1.0);
        assert!((cum[1] - 0.25).abs() < 1e-12, "{cum:?}");
    }

    /// 1.05 per step over 100 steps multiplies to ≈ 131.5; the geometric mean stays at 1.05.
    #[test]
    fn gentle_drift_explodes_cumulatively() {
        let lp = t2(vec![1.05f64.ln(); 100], 1, 100);
        let mu = t2(vec![0.0; 100], 1, 100);
        let m = t2(vec![1.0; 100], 1, 100);
        let cum = to_host(
            &log_ratio(
                lp.clone(),
                mu.clone(),
                &m,
                RatioLevel::Cumulative,
                false,
                Default::default(),
            )
            .exp(),
        )
        .unwrap();
        assert!((cum[99] - 131.5).abs() < 0.05, "{}", cum[99]);
        let geo =
            to_host(&log_ratio(lp, mu, &m, RatioLevel::Cumulative, true, Default::default()).exp())
                .unwrap();
        assert!((geo[99] - 1.05).abs() < 1e-12);
    }

    #[test]
    fn sequence_ratio_is_length_normalised() {
        let lp = t2(vec![0.2, 0.4, 9.0], 1, 3);
        let mu = t2(vec![0.0, 0.0, -5.0], 1, 3);
        let m = t2(vec![1.0, 1.0, 0.0], 1, 3);
        let s = to_host(&log_ratio(
            lp,
            mu,
            &m,
            RatioLevel::Sequence,
            false,
            Default::default(),
        ))
        .unwrap();
        assert!((s[0] - 0.3).abs() < 1e-12 && (s[1] - 0.3).abs() < 1e-12);
    }

    #[test]
    fn truncated_weights_are_capped() {
        let old = t2(vec![0.0, 2.0, 7.0], 1, 3);
        let mu = t2(vec![0.0, 0.0, 0.0], 1, 3);
        let m = t2(vec![1.0, 1.0, 0.0], 1, 3);
        let w = to_host(&truncated_is_weights(old, mu, &m, 2.0).unwrap()).unwrap();
        assert_eq!(w, vec![1.0, 2.0, 1.0]);
        assert!("tok".parse::<RatioLevel>().is_err());
    }
}
