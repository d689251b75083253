//! Off-policy correction of the gap between the behaviour policy `μ` that sampled a token and a
//! training policy `π` (π_old, π_prox or πθ) that learns from it: importance-sampling weights
//! (truncated or masked), rejection filters on the log-ratio, and off-policy diagnostics.
//!
//! Semantics and metric names are verl 0.9.1's `rollout_corr_helper` (checked case by case by
//! `rlft-parity` on `tests/golden/offpolicy`), plus one level of rlft's own: `geometric`.
//!
//! - **IS weights** `w` of `π` against `μ`, with `log ρ = log π − log μ`:
//!   - `token`: `w_t = exp(clamp(log ρ_t, ±20))`;
//!   - `sequence`: `w_i = exp(clamp(Σ_t log ρ_t·m_t, ±20))` on every token of row `i`;
//!   - `geometric`: `w_i = exp(clamp(Σ_t log ρ_t·m_t / n_i, ±20))` (its metrics are those of
//!     `sequence`, on the row-mean log-ratio).
//!
//!   A single threshold `u` truncates (`min(w, u)`, TIS); a band `"<lower>_<upper>"` zeroes the
//!   weights outside it (IcePop). Batch normalisation divides by the batch's mean weight.
//! - **Rejection filters** on `log ρ` clamped to ±20, with `k1 = −log ρ`, `k2 = ½(log ρ)²`,
//!   `k3 = ρ − 1 − log ρ`: `token_kN` rejects tokens; `seq_sum_kN`, `seq_mean_kN`, `seq_max_kN`
//!   reject whole rows by the sum / mean / max over the row's valid tokens. Chained filters must
//!   all pass. A k1 threshold is a ratio band (`"0.5_2.0"`; one number `u` means `1/u … u`);
//!   k2/k3 thresholds are upper bounds.
//! - **Diagnostics**: mismatch KL (`kl` = k1 of KL(μ‖π), `k3_kl`), perplexities of both
//!   policies and their log difference, χ² at token and sequence level, effective sample size,
//!   and the fractions of weights truncated, masked or out of bounds.
//!
//! The arithmetic runs on the host in f64 with sums in a fixed order, so weights, masks and
//! metrics are bit-identical run to run whatever the backend; only `[batch, T]` log-probs travel.

mod host;
mod position;

pub use host::{HostCorrection, correct_host};
pub use position::{
    BucketQuantiles, POSITION_QUANTILES, PositionQuantiles, bucket_range, position_bucket,
};

use crate::masked::{check_shape, from_host, to_host};
use crate::{AlgoError, Result};
use burn::tensor::Tensor;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// verl's safety bound on log-ratios before exponentiation.
pub const SAFETY_BOUND: f64 = 20.0;

/// How importance-sampling weights are aggregated over a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum IsLevel {
    /// One weight per token (biased, low variance).
    Token,
    /// One weight per response: the product of its token ratios (unbiased, high variance).
    Sequence,
    /// One weight per response: the geometric mean of its token ratios (rlft's own).
    Geometric,
}

impl IsLevel {
    /// All levels with their names.
    pub const ALL: [(IsLevel, &'static str); 3] = [
        (IsLevel::Token, "token"),
        (IsLevel::Sequence, "sequence"),
        (IsLevel::Geometric, "geometric"),
    ];
}

crate::error::impl_names!(IsLevel, IsLevel::ALL, "IS level", |s| s
    .trim()
    .to_ascii_lowercase());

/// What happens to weights outside the threshold.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum IsThreshold {
    /// TIS: `min(w, upper)`.
    Truncate {
        /// The cap.
        upper: f64,
    },
    /// IcePop: weights outside `[lower, upper]` become 0.
    Mask {
        /// Smallest weight kept.
        lower: f64,
        /// Largest weight kept.
        upper: f64,
    },
}

impl IsThreshold {
    /// The upper bound.
    pub fn upper(&self) -> f64 {
        match *self {
            IsThreshold::Truncate { upper } | IsThreshold::Mask { upper, .. } => upper,
        }
    }

    /// The lower bound the metrics use: IcePop's, else `1 / upper`.
    pub fn lower(&self) -> f64 {
        match *self {
            IsThreshold::Truncate { upper } => 1.0 / upper,
            IsThreshold::Mask { lower, .. } => lower,
        }
    }
}

impl std::str::FromStr for IsThreshold {
    type Err = AlgoError;

    /// `"2.0"` (truncate at 2) or `"0.5_5.0"` (zero outside [0.5, 5]).
    fn from_str(s: &str) -> Result<Self> {
        let (lower, upper) = parse_band("is_threshold", s)?;
        Ok(match lower {
            Some(lower) => IsThreshold::Mask { lower, upper },
            None => IsThreshold::Truncate { upper },
        })
    }
}

impl std::fmt::Display for IsThreshold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IsThreshold::Truncate { upper } => write!(f, "{upper}"),
            IsThreshold::Mask { lower, upper } => write!(f, "{lower}_{upper}"),
        }
    }
}

/// Parses `"u"` or `"l_u"` with `0 < l ≤ u`, both finite.
fn parse_band(name: &str, s: &str) -> Result<(Option<f64>, f64)> {
    let bad = |why: &str| AlgoError::InvalidSpec {
        name: name.to_string(),
        value: s.to_string(),
        allowed: format!(
            "{why}; give one positive number (e.g. \"2.0\") or \"<lower>_<upper>\" with 0 < lower <= upper (e.g. \"0.5_5.0\")"
        ),
    };
    let num = |p: &str| -> Result<f64> {
        p.trim()
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite())
            .ok_or_else(|| bad(&format!("'{}' is not a number", p.trim())))
    };
    let (lower, upper) = match s.trim().split_once('_') {
        Some((l, u)) => (Some(num(l)?), num(u)?),
        None => (None, num(s)?),
    };
    if upper <= 0.0 {
        return Err(bad("the upper bound must be > 0"));
    }
    if let Some(l) = lower {
        if l <= 0.0 {
            return Err(bad("the lower bound must be > 0"));
        }
        if l > upper {
            return Err(bad("the lower bound is above the upper bound"));
        }
    }
    Ok((lower, upper))
}

/// Importance-sampling settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IsConfig {
    /// Token, sequence or geometric weights.
    pub level: IsLevel,
    /// Truncation or masking.
    pub threshold: IsThreshold,
    /// Divide the weights by their batch mean (so they average 1).
    pub batch_normalize: bool,
}

/// The per-token divergence a rejection filter measures, from `log ρ` clamped to ±20.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Divergence {
    /// `k1 = −log ρ`; its threshold is a ratio band.
    K1,
    /// `k2 = ½ (log ρ)²`.
    K2,
    /// `k3 = ρ − 1 − log ρ`.
    K3,
}

/// Over what a rejection filter decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FilterScope {
    /// Each token on its own.
    Token,
    /// A whole row, by the sum over its valid tokens.
    SeqSum,
    /// A whole row, by the mean over its valid tokens.
    SeqMean,
    /// A whole row, by the maximum over its valid tokens.
    SeqMax,
}

/// A rejection filter: `token_k1/k2/k3`, `seq_sum_k1/k2/k3`, `seq_mean_k1/k2/k3`,
/// `seq_max_k2/k3`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct RejectionFilter {
    /// Token or row.
    pub scope: FilterScope,
    /// The divergence it measures.
    pub divergence: Divergence,
}

impl RejectionFilter {
    /// Every filter, by name.
    pub const ALL: [(RejectionFilter, &'static str); 11] = {
        use Divergence::*;
        use FilterScope::*;
        const fn f(scope: FilterScope, divergence: Divergence) -> RejectionFilter {
            RejectionFilter { scope, divergence }
        }
        [
            (f(Token, K1), "token_k1"),
            (f(Token, K2), "token_k2"),
            (f(Token, K3), "token_k3"),
            (f(SeqSum, K1), "seq_sum_k1"),
            (f(SeqSum, K2), "seq_sum_k2"),
            (f(SeqSum, K3), "seq_sum_k3"),
            (f(SeqMean, K1), "seq_mean_k1"),
            (f(SeqMean, K2), "seq_mean_k2"),
            (f(SeqMean, K3), "seq_mean_k3"),
            (f(SeqMax, K2), "seq_max_k2"),
            (f(SeqMax, K3), "seq_max_k3"),
        ]
    };

    /// The filter's bounds from a threshold spec: for k1 a ratio band `"l_u"` (or `"u"`, meaning
    /// `l = 1/u`); for k2/k3 one positive upper bound.
    pub fn bounds(&self, spec: &str) -> Result<FilterBounds> {
        let name = format!("rejection_threshold for '{self}'");
        let (lower, upper) = parse_band(&name, spec)?;
        match (self.divergence, lower) {
            (Divergence::K1, lower) => Ok(FilterBounds::RatioBand {
                lower: lower.unwrap_or(1.0 / upper),
                upper,
            }),
            (_, None) => Ok(FilterBounds::Upper(upper)),
            (_, Some(_)) => Err(AlgoError::InvalidSpec {
                name,
                value: spec.to_string(),
                allowed: "k2 and k3 filters take one upper bound, without '_'".into(),
            }),
        }
    }
}

crate::error::impl_names!(
    RejectionFilter,
    RejectionFilter::ALL,
    "rejection filter",
    |s| s.trim().to_ascii_lowercase()
);

/// Text conversions for serde (`"token"`, `"seq_mean_k3"`): unknown names are errors listing
/// the known ones.
macro_rules! string_serde {
    ($($ty:ty),*) => {$(
        impl TryFrom<String> for $ty {
            type Error = AlgoError;
            fn try_from(s: String) -> Result<Self> {
                s.parse()
            }
        }

        impl From<$ty> for String {
            fn from(v: $ty) -> String {
                v.to_string()
            }
        }
    )*};
}

string_serde!(IsLevel, RejectionFilter);

/// A rejection filter's thresholds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FilterBounds {
    /// k1: keep `log(lower) ≤ k1 ≤ log(upper)`.
    RatioBand {
        /// Ratio lower bound.
        lower: f64,
        /// Ratio upper bound.
        upper: f64,
    },
    /// k2/k3: keep `value ≤ upper`.
    Upper(f64),
}

/// One rejection filter with its bounds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rejection {
    /// What it measures and over what.
    pub filter: RejectionFilter,
    /// Its thresholds.
    pub bounds: FilterBounds,
}

/// IS weights and rejection filters to apply; both optional. Diagnostics are always computed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CorrectionConfig {
    /// IS weights (None: no weights).
    pub is: Option<IsConfig>,
    /// Rejection filters, all of which must pass (empty: none).
    pub rejection: Vec<Rejection>,
}

impl CorrectionConfig {
    /// Builds the rejection filters from names and threshold specs the way verl does: repeated
    /// filters count once, then one spec serves every filter or there is one per filter.
    pub fn with_rejection(self, filters: &[&str], thresholds: &[&str]) -> Result<Self> {
        let parsed = filters
            .iter()
            .map(|f| f.parse())
            .collect::<Result<Vec<RejectionFilter>>>()?;
        self.with_rejection_filters(&parsed, thresholds)
    }

    /// As [`with_rejection`](Self::with_rejection), with the filters already parsed.
    pub fn with_rejection_filters(
        mut self,
        filters: &[RejectionFilter],
        thresholds: &[&str],
    ) -> Result<Self> {
        let mut names: Vec<RejectionFilter> = Vec::new();
        for f in filters {
            if !names.contains(f) {
                names.push(*f);
            }
        }
        if names.is_empty() {
            self.rejection.clear();
            return Ok(self);
        }
        if thresholds.len() != 1 && thresholds.len() != names.len() {
            return Err(AlgoError::InvalidSpec {
                name: "rejection_threshold".into(),
                value: format!("{thresholds:?}"),
                allowed: format!(
                    "give one threshold for all filters or exactly {} (one per filter in `rejection`)",
                    names.len()
                ),
            });
        }
        self.rejection = names
            .into_iter()
            .zip(thresholds.iter().cycle())
            .map(|(filter, spec)| {
                filter
                    .bounds(spec)
                    .map(|bounds| Rejection { filter, bounds })
            })
            .collect::<Result<_>>()?;
        Ok(self)
    }
}

/// IS weights, the mask after rejection, and the metrics.
#[derive(Debug, Clone)]
pub struct Correction {
    /// `[batch, T]` detached IS weights (0 at padding), when IS is configured.
    pub weights: Option<Tensor<2>>,
    /// `[batch, T]` response mask with rejected tokens set to 0.
    pub mask: Tensor<2>,
    /// verl's metric keys without the `rollout_corr/` prefix.
    pub metrics: BTreeMap<String, f64>,
}

/// IS weights of `train_log_prob` against `behaviour_log_prob`, the rejection mask and the
/// off-policy diagnostics (verl's `compute_rollout_correction_and_rejection_mask`).
///
/// The result carries no gradient. Batch normalisation uses this call's whole batch: pass the
/// whole step's batch, not a micro-batch.
///
/// # Shapes
/// - `train_log_prob`, `behaviour_log_prob`, `mask`: `[batch, T]`
/// - weights and mask: `[batch, T]` (dtype and device of `mask`)
pub fn rollout_correction(
    train_log_prob: &Tensor<2>,
    behaviour_log_prob: &Tensor<2>,
    mask: &Tensor<2>,
    config: &CorrectionConfig,
) -> Result<Correction> {
    let dims = mask.dims();
    check_shape("train_log_prob", train_log_prob, dims, "response_mask")?;
    check_shape(
        "behaviour_log_prob",
        behaviour_log_prob,
        dims,
        "response_mask",
    )?;
    let h = correct_host(
        &to_host(train_log_prob)?,
        &to_host(behaviour_log_prob)?,
        &to_host(mask)?,
        dims,
        config,
    )?;
    Ok(Correction {
        weights: h.weights.map(|w| from_host(w, dims, mask)),
        mask: from_host(h.mask, dims, mask),
        metrics: h.metrics,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(level: IsLevel, threshold: &str) -> CorrectionConfig {
        CorrectionConfig {
            is: Some(IsConfig {
                level,
                threshold: threshold.parse().unwrap(),
                batch_normalize: false,
            }),
            rejection: Vec::new(),
        }
    }

    /// Token weights exactly at the thresholds are kept (truncation: `min`, IcePop: inclusive).
    #[test]
    fn weights_at_the_thresholds() {
        let train = [2f64.ln(), 0.5f64.ln(), 3f64.ln(), 0.25f64.ln()];
        let mu = [0.0; 4];
        let mask = [1.0; 4];
        let w = |c: &CorrectionConfig| correct_host(&train, &mu, &mask, [1, 4], c).unwrap();
        let tis = w(&cfg(IsLevel::Token, "2.0")).weights.unwrap();
        let want = [2.0, 0.5, 2.0, 0.25];
        for (g, e) in tis.iter().zip(want) {
            assert!((g - e).abs() < 1e-12, "{tis:?}");
        }
        let ice = w(&cfg(IsLevel::Token, "0.5_2.0"));
        let weights = ice.weights.unwrap();
        // 2.0 and 0.5 sit on the bounds: kept; 3 and 0.25 lie outside: zeroed.
        assert!((weights[0] - 2.0).abs() < 1e-12 && (weights[1] - 0.5).abs() < 1e-12);
        assert_eq!(&weights[2..], &[0.0, 0.0]);
        assert!((ice.metrics["rollout_is_oob_ratio"] - 0.5).abs() < 1e-8);
    }

    /// Rejection keeps a statistic equal to its threshold; chained filters must all pass.
    #[test]
    fn rejection_at_the_thresholds_and_chained() {
        // log ρ = ±1: k2 = 0.5 exactly.
        let train = [1.0, -1.0, 0.1, 0.0];
        let mu = [0.0; 4];
        let mask = [1.0, 1.0, 1.0, 0.0];
        let run = |f: &[&str], t: &[&str]| {
            let c = CorrectionConfig::default().with_rejection(f, t).unwrap();
            correct_host(&train, &mu, &mask, [2, 2], &c).unwrap()
        };
        assert_eq!(run(&["token_k2"], &["0.5"]).mask, vec![1.0, 1.0, 1.0, 0.0]);
        assert_eq!(run(&["token_k2"], &["0.49"]).mask, vec![0.0, 0.0, 1.0, 0.0]);
        // Row 0 has max k2 0.5: rejected by seq_max_k2 at 0.4 while token_k1 alone keeps it.
        let both = run(&["token_k1", "seq_max_k2"], &["3.0", "0.4"]);
        assert_eq!(both.mask, vec![0.0, 0.0, 1.0, 0.0]);
        assert!((both.metrics["rollout_rs_seq_masked_fraction"] - 0.5).abs() < 1e-12);
        assert_eq!(run(&["token_k1"], &["3.0"]).mask, vec![1.0, 1.0, 1.0, 0.0]);
    }

    #[test]
    fn geometric_weights_use_the_row_mean() {
        let train = [0.2, 0.4, 9.0];
        let mu = [0.0, 0.0, 0.0];
        let mask = [1.0, 1.0, 0.0];
        let h = correct_host(&train, &mu, &mask, [1, 3], &cfg(IsLevel::Geometric, "5.0")).unwrap();
        let w = h.weights.unwrap();
        assert!((w[0] - 0.3f64.exp()).abs() < 1e-12 && (w[1] - 0.3f64.exp()).abs() < 1e-12);
        assert_eq!(w[2], 0.0);
        let seq = correct_host(&train, &mu, &mask, [1, 3], &cfg(IsLevel::Sequence, "5.0")).unwrap();
        assert!((seq.weights.unwrap()[0] - 0.6f64.exp()).abs() < 1e-12);
    }

    #[test]
    fn bad_specs_are_errors_that_say_what_to_give() {
        for bad in ["0", "-1", "2_1", "a_2", "nan", ""] {
            let e = bad.parse::<IsThreshold>().unwrap_err().to_string();
            assert!(
                e.contains("is_threshold") && e.contains("<lower>_<upper>"),
                "{e}"
            );
        }
        let e = CorrectionConfig::default()
            .with_rejection(&["token_k4"], &["1"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("token_k4") && e.contains("seq_max_k3"), "{e}");
        let e = CorrectionConfig::default()
            .with_rejection(&["token_k2", "seq_sum_k3"], &["1", "2", "3"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("exactly 2"), "{e}");
        assert!(
            CorrectionConfig::default()
                .with_rejection(&["token_k2"], &["0.5_2"])
                .is_err()
        );
        assert!(
            correct_host(&[0.0], &[0.0], &[0.0], [1, 1], &CorrectionConfig::default()).is_err()
        );
    }
}
