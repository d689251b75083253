//! `[algorithm.correction]`: which policy anchors the PPO ratio, and how the learner corrects
//! for the gap between the behaviour policy μ that sampled a token and the policy it trains.
//!
//! | mode | π_old pass | the ratio's anchor | IS weights / rejection of |
//! |---|---|---|---|
//! | `auto` (default) | when the batch is used more than once or a group is stale | μ or π_old | — |
//! | `recompute` | always | π_old | — |
//! | `decoupled` (AReaL) | always (π_prox) | π_prox | π_prox against μ, once per step |
//! | `bypass` (verl) | never | μ | πθ against μ, per micro-batch |

use crate::{Result, TrainError};
use rlft_algo::correction::{CorrectionConfig, IsConfig, IsLevel, IsThreshold, RejectionFilter};
use serde::{Deserialize, Serialize};

/// Which policy anchors the PPO ratio, and whether the batch is corrected against μ.
#[derive(
    schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum CorrectionMode {
    /// μ is reused as π_old when the batch is used for one update and no group is stale;
    /// otherwise π_old is recomputed. No correction.
    #[default]
    Auto,
    /// π_old is always recomputed by a forward pass. No correction.
    Recompute,
    /// AReaL's decoupled PPO: the π_old pass gives π_prox, PPO clips πθ/π_prox, and the loss is
    /// weighted by the IS weights of π_prox against μ (with the rejection mask).
    Decoupled,
    /// verl's bypass mode: no π_old pass, μ anchors the ratio; IS weights and rejection of πθ
    /// against μ, computed per micro-batch (weights multiply the loss only for losses without an
    /// importance ratio, such as `reinforce_is`: a ratio against μ already carries them).
    Bypass,
}

/// What the cumulative ratio of a cumulative-ratio loss (CTPO) is taken against.
#[derive(
    schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum RatioReference {
    /// π_old (μ where μ is reused): the default.
    #[default]
    Proximal,
    /// μ, the policy that sampled the tokens: the ratio measures the whole gap since sampling.
    Behaviour,
}

/// How decoupled mode gets π_prox, the policy that anchors the ratio.
#[derive(
    schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum ProxMethod {
    /// A forward pass of the learner's policy over the batch when it is consumed.
    #[default]
    Forward,
    /// AReaL's log-linear approximation, no forward pass: `log π_prox = log μ + α (log πθ −
    /// log μ)` per token, α from the token's policy version
    /// ([`rlft_algo::decoupled::loglinear_prox`]); computed per micro-batch.
    Loglinear,
}

/// Off-policy sequence masking: negative-advantage sequences that drifted too far from the
/// policy are left out of the loss (its normalisers unchanged), as each anchor computes it.
#[derive(
    schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Opsm {
    /// No masking.
    #[default]
    Off,
    /// TRL 1.16's `get_off_policy_mask`: drop row `i` when its advantage is negative and
    /// `mean_t (log μ − sg log πθ) > opsm_delta` ([`rlft_algo::filters::opsm_trl`]).
    Trl,
    /// slime's `compute_opsm_mask`: drop the negative-advantage tokens of rows whose
    /// `mean_t (log π_old − log πθ) > opsm_delta`, π_old the ratio's anchor
    /// ([`rlft_algo::filters::opsm_slime`]).
    Slime,
}

/// Where KPop's binary-KL bound applies.
#[derive(
    schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum KpopLevel {
    /// Each token against the bound.
    #[default]
    Token,
    /// A row's mean over its tokens.
    SeqMean,
    /// A row's largest token value.
    SeqMax,
    /// A row's sum.
    SeqSum,
}

/// Which of a row's tokens get loss when new weights reached its generation midway
/// (interruptible generation: one row, tokens of several versions).
#[derive(
    schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum TrainVersions {
    /// Every sampled token.
    #[default]
    All,
    /// Only the tokens sampled by the newest version in the row (slime's
    /// `mask-offpolicy-in-partial-rollout`); needs `async.interruptible = true`.
    Current,
}

/// Whether the learner replays the sampler's filters (`algorithm.sampling_mask`).
#[derive(
    schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum SamplingMask {
    /// Log-probs over the whole vocabulary.
    #[default]
    Off,
    /// Log-probs and entropies over each token's kept set (needs top-k, min-p or top-p).
    Replay,
}

/// A threshold as a number (`2.0`) or text (`"0.5_5.0"`).
#[derive(schemars::JsonSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ThresholdSpec {
    /// One number.
    Number(f64),
    /// A number or a band `"<lower>_<upper>"`, as text.
    Text(String),
}

impl ThresholdSpec {
    fn text(&self) -> String {
        match self {
            ThresholdSpec::Number(v) => v.to_string(),
            ThresholdSpec::Text(s) => s.clone(),
        }
    }
}

/// One threshold for every rejection filter, or one per filter.
#[derive(schemars::JsonSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Thresholds {
    /// Shared by all filters.
    One(ThresholdSpec),
    /// Aligned with `rejection`.
    Many(Vec<ThresholdSpec>),
}

/// `[algorithm.correction]`.
#[derive(schemars::JsonSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CorrectionSection {
    /// `auto`, `recompute`, `decoupled` or `bypass`.
    pub mode: CorrectionMode,
    /// IS weights: `token`, `sequence` or `geometric` (unset: none).
    pub is_level: Option<IsLevel>,
    /// One number truncates the weights (TIS); `"<lower>_<upper>"` zeroes those outside (IcePop).
    pub is_threshold: ThresholdSpec,
    /// Divide the weights by their mean over the step's batch (decoupled only).
    pub is_batch_normalize: bool,
    /// Rejection filters, all of which must pass (`token_k1`, `seq_mean_k3`, ...).
    pub rejection: Vec<RejectionFilter>,
    /// One threshold for all filters, or a list aligned with `rejection`.
    pub rejection_threshold: Thresholds,
    /// `all`, or `current`: in a row that new weights reached midway, only the tokens of the
    /// newest version get loss (async mode with `async.interruptible = true`).
    pub train_versions: TrainVersions,
    /// Decoupled mode's π_prox: `forward` (a forward pass) or `loglinear` (AReaL's
    /// approximation from μ, πθ and the token versions, no pass).
    pub prox: ProxMethod,
    /// Off-policy sequence masking: `off`, `trl` or `slime` (any mode; needs `opsm_delta`).
    pub opsm: Opsm,
    /// OPSM's bound δ on a sequence's mean log-ratio.
    pub opsm_delta: Option<f64>,
    /// M2PO (AReaL's `m2_threshold`, decoupled mode with `prox = "forward"`): over the step's
    /// tokens, drop those with the largest `(log μ − log π_prox)²` until the rest's mean is
    /// below it.
    pub m2po_threshold: Option<f64>,
    /// KPop (AReaL's binary-KL rejection, decoupled mode with `prox = "forward"`): mask tokens
    /// (or rows, `kpop_level`) whose `max(KLb(π_prox‖μ), KLb(μ‖π_prox))` of the sampled token
    /// exceeds it.
    pub kpop_threshold: Option<f64>,
    /// Where KPop's bound applies: `token`, `seq_mean`, `seq_max` or `seq_sum`.
    pub kpop_level: KpopLevel,
    /// slime's veto (decoupled mode with `prox = "forward"`): a row with any token whose
    /// `π_prox/μ` is below it gets no loss.
    pub veto_threshold: Option<f64>,
}

impl Default for CorrectionSection {
    fn default() -> Self {
        Self {
            mode: CorrectionMode::Auto,
            is_level: None,
            is_threshold: ThresholdSpec::Number(2.0),
            is_batch_normalize: false,
            rejection: Vec::new(),
            rejection_threshold: Thresholds::Many(Vec::new()),
            train_versions: TrainVersions::All,
            prox: ProxMethod::Forward,
            opsm: Opsm::Off,
            opsm_delta: None,
            m2po_threshold: None,
            kpop_threshold: None,
            kpop_level: KpopLevel::Token,
            veto_threshold: None,
        }
    }
}

fn bad(key: &str, msg: impl Into<String>) -> TrainError {
    TrainError::Recipe(format!("algorithm.correction.{key}: {}", msg.into()))
}

impl CorrectionSection {
    /// The IS / rejection settings, checked: every error names its key and the fix.
    pub fn resolve(&self) -> Result<CorrectionConfig> {
        self.check_against_mode()?;
        self.check_masks()?;
        self.check_prox()?;
        self.build()
    }

    /// IS weights and rejection filters need a mode that corrects against μ, and a threshold
    /// needs what it bounds.
    fn check_against_mode(&self) -> Result<()> {
        let corrects = matches!(
            self.mode,
            CorrectionMode::Decoupled | CorrectionMode::Bypass
        );
        let wants =
            self.is_level.is_some() || !self.rejection.is_empty() || self.is_batch_normalize;
        if wants && !corrects {
            return Err(bad(
                if self.is_level.is_some() {
                    "is_level"
                } else if self.rejection.is_empty() {
                    "is_batch_normalize"
                } else {
                    "rejection"
                },
                format!(
                    "IS weights and rejection filters correct against the behaviour policy, which \
                     mode = \"{}\" does not do; set mode = \"decoupled\" or \"bypass\", or remove them",
                    serde_json::to_value(self.mode)
                        .ok()
                        .and_then(|v| v.as_str().map(String::from))
                        .unwrap_or_default()
                ),
            ));
        }
        // A threshold without what it bounds does nothing: refused, as the filters above.
        if self.is_level.is_none() && self.is_threshold != Self::default().is_threshold {
            return Err(bad(
                "is_threshold",
                "bounds the IS weights, and is_level is unset (no weights); set is_level or \
                 remove is_threshold",
            ));
        }
        if self.rejection.is_empty()
            && self.rejection_threshold != Self::default().rejection_threshold
        {
            return Err(bad(
                "rejection_threshold",
                "applies to the rejection filters, and rejection is empty; list the filters \
                 (e.g. rejection = [\"token_k1\"]) or remove rejection_threshold",
            ));
        }
        Ok(())
    }

    /// Off-policy sequence masking and the step-wide token masks (M2PO, KPop, veto).
    fn check_masks(&self) -> Result<()> {
        match (self.opsm, self.opsm_delta) {
            (Opsm::Off, Some(_)) => {
                return Err(bad(
                    "opsm_delta",
                    "applies with opsm = \"trl\" or \"slime\"; set one or remove it",
                ));
            }
            (Opsm::Trl | Opsm::Slime, None) => {
                return Err(bad(
                    "opsm",
                    "needs opsm_delta, the largest mean log-ratio a negative-advantage sequence \
                     may have (e.g. 0.5)",
                ));
            }
            (_, Some(d)) if d < 0.0 => {
                return Err(bad("opsm_delta", format!("must be ≥ 0, got {d}")));
            }
            _ => {}
        }
        let step_masks = [
            ("m2po_threshold", self.m2po_threshold),
            ("kpop_threshold", self.kpop_threshold),
            ("veto_threshold", self.veto_threshold),
        ];
        for (key, value) in step_masks {
            let Some(t) = value else { continue };
            if t <= 0.0 {
                return Err(bad(key, format!("must be > 0, got {t}")));
            }
            if self.mode != CorrectionMode::Decoupled || self.prox != ProxMethod::Forward {
                return Err(bad(
                    key,
                    "masks tokens by the gap between μ and the π_prox of the whole step, which \
                     mode = \"decoupled\" with prox = \"forward\" computes; set those or remove \
                     it",
                ));
            }
        }
        if self.kpop_level != KpopLevel::Token && self.kpop_threshold.is_none() {
            return Err(bad(
                "kpop_level",
                "applies with kpop_threshold; set it or remove this",
            ));
        }
        Ok(())
    }

    /// The log-linear π_prox and batch normalisation of the IS weights.
    fn check_prox(&self) -> Result<()> {
        if self.prox == ProxMethod::Loglinear {
            if self.mode != CorrectionMode::Decoupled {
                return Err(bad(
                    "prox",
                    "\"loglinear\" approximates π_prox, which only mode = \"decoupled\" uses; \
                     set mode = \"decoupled\" or prox = \"forward\"",
                ));
            }
            if self.is_batch_normalize {
                return Err(bad(
                    "is_batch_normalize",
                    "with prox = \"loglinear\" the weights are computed per micro-batch, so \
                     there is no step batch to normalise over; set it to false or use prox = \
                     \"forward\"",
                ));
            }
        }
        if self.is_batch_normalize && self.mode == CorrectionMode::Bypass {
            return Err(bad(
                "is_batch_normalize",
                "bypass computes its weights per micro-batch, so there is no step batch to \
                 normalise over; use mode = \"decoupled\" or set it to false",
            ));
        }
        if self.is_batch_normalize && self.is_level.is_none() {
            return Err(bad(
                "is_batch_normalize",
                "normalises IS weights: set is_level too, or set it to false",
            ));
        }
        Ok(())
    }

    /// The checked settings as a [`CorrectionConfig`] (threshold specs parsed, rejection
    /// filters built).
    fn build(&self) -> Result<CorrectionConfig> {
        let mut config = CorrectionConfig::default();
        // Checked even without is_level: a typo must not wait for the day it is used.
        let threshold: IsThreshold = self
            .is_threshold
            .text()
            .parse()
            .map_err(|e| bad("is_threshold", format!("{e}")))?;
        if let Some(level) = self.is_level {
            config.is = Some(IsConfig {
                level,
                threshold,
                batch_normalize: self.is_batch_normalize,
            });
        }
        if !self.rejection.is_empty() {
            let specs: Vec<String> = match &self.rejection_threshold {
                Thresholds::One(t) => vec![t.text()],
                Thresholds::Many(v) => v.iter().map(ThresholdSpec::text).collect(),
            };
            if specs.is_empty() {
                return Err(bad(
                    "rejection_threshold",
                    "the rejection filters need thresholds: one for all (e.g. 2.0 or \"0.5_2.0\") \
                     or a list aligned with `rejection`",
                ));
            }
            for (k, filter) in self.rejection.iter().enumerate() {
                if self.rejection[..k].contains(filter) {
                    return Err(bad(
                        "rejection",
                        format!("'{filter}' is listed twice; list each filter once"),
                    ));
                }
            }
            let specs: Vec<&str> = specs.iter().map(String::as_str).collect();
            config = config
                .with_rejection_filters(&self.rejection, &specs)
                .map_err(|e| bad("rejection_threshold", format!("{e}")))?;
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(toml_text: &str) -> std::result::Result<CorrectionSection, String> {
        let v: toml::Value = toml::from_str(toml_text).map_err(|e| e.to_string())?;
        let json = serde_json::to_value(v).map_err(|e| e.to_string())?;
        serde_json::from_value(json).map_err(|e| e.to_string())
    }

    #[test]
    fn settings_resolve_to_the_correction() {
        let s = section(
            r#"
            mode = "decoupled"
            is_level = "sequence"
            is_threshold = "0.5_5.0"
            rejection = ["token_k1", "seq_mean_k3"]
            rejection_threshold = ["0.5_2.0", 0.1]
            "#,
        )
        .unwrap();
        let c = s.resolve().unwrap();
        let is = c.is.unwrap();
        assert_eq!(is.level, IsLevel::Sequence);
        assert_eq!(
            is.threshold,
            IsThreshold::Mask {
                lower: 0.5,
                upper: 5.0
            }
        );
        assert_eq!(c.rejection.len(), 2);
        assert_eq!(c.rejection[1].filter.to_string(), "seq_mean_k3");
    }

    #[test]
    fn bad_settings_name_the_key_and_the_fix() {
        let err = |t: &str| {
            section(t)
                .map_err(TrainError::Recipe)
                .and_then(|s| s.resolve())
                .unwrap_err()
                .to_string()
        };
        let e = err(r#"is_level = "token""#);
        assert!(
            e.contains("algorithm.correction.is_level") && e.contains("decoupled"),
            "{e}"
        );
        let e = err(r#"mode = "recompute"
rejection = ["token_k2"]
rejection_threshold = 1.0"#);
        assert!(
            e.contains("algorithm.correction.rejection") && e.contains("bypass"),
            "{e}"
        );
        let e = err(r#"mode = "bypass"
is_level = "token"
is_batch_normalize = true"#);
        assert!(
            e.contains("is_batch_normalize") && e.contains("decoupled"),
            "{e}"
        );
        let e = err(r#"mode = "decoupled"
is_level = "token"
is_threshold = 0"#);
        assert!(e.contains("is_threshold") && e.contains("> 0"), "{e}");
        let e = err(r#"mode = "decoupled"
is_level = "token"
is_threshold = "5_0.5""#);
        assert!(
            e.contains("is_threshold") && e.contains("lower bound is above"),
            "{e}"
        );
        let e = err(r#"mode = "decoupled"
rejection = ["token_k2", "seq_sum_k3"]
rejection_threshold = [1.0, 2.0, 3.0]"#);
        assert!(
            e.contains("rejection_threshold") && e.contains("exactly 2"),
            "{e}"
        );
        let e = err(r#"mode = "decoupled"
rejection = ["token_k2"]"#);
        assert!(e.contains("rejection_threshold"), "{e}");
        let e = err(r#"mode = "decoupled"
rejection = ["token_k9"]
rejection_threshold = 1.0"#);
        assert!(e.contains("token_k9") && e.contains("seq_mean_k3"), "{e}");
        let e = err(r#"mode = "sometimes""#);
        assert!(e.contains("sometimes") && e.contains("decoupled"), "{e}");
    }
}
