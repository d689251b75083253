//! The learner's off-policy correction and its metrics for one step: the anchor of the ratio
//! (see [`crate::correction`]), the correction of response-aligned host batches against μ, and
//! the `offpolicy/*` metrics (verl's keys, token-weighted over the step, and the
//! position-resolved quantiles).

use crate::Result;
use crate::correction::{CorrectionMode, Opsm, RatioReference};
use rlft_algo::correction::{CorrectionConfig, HostCorrection, PositionQuantiles, correct_host};
use std::collections::BTreeMap;
use std::time::Instant;

/// What the recipe asks of the learner for stale samples, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct OffPolicy {
    /// Which policy anchors the ratio.
    pub mode: CorrectionMode,
    /// IS weights and rejection (decoupled and bypass only).
    pub correction: CorrectionConfig,
    /// What a cumulative ratio is taken against.
    pub ratio_reference: RatioReference,
    /// In bypass: whether IS weights multiply the loss (losses without an importance ratio).
    pub bypass_applies_weights: bool,
    /// Tokens are drawn through top-k / min-p / top-p: μ is the filtered, renormalised
    /// log-prob, which the learner's full softmax does not reproduce (`π_θ/μ` starts at `S`).
    pub filtered_sampling: bool,
    /// Decoupled mode with `prox = "loglinear"`: π_prox approximated per micro-batch, no pass.
    pub loglinear_prox: bool,
    /// Off-policy sequence masking and its δ.
    pub opsm: Option<(Opsm, f64)>,
    /// M2PO's second-moment threshold (decoupled mode, forward π_prox).
    pub m2po_threshold: Option<f64>,
    /// KPop's binary-KL rejection (decoupled mode, forward π_prox).
    pub kpop: Option<rlft_algo::decoupled::RejectionConfig>,
    /// slime's veto threshold on `π_prox/μ` (decoupled mode, forward π_prox).
    pub veto_threshold: Option<f64>,
}

impl OffPolicy {
    /// Whether the step needs a π_old (π_prox) forward pass: `on_policy` when the batch is used
    /// for one update, `off_policy` when some group was sampled by an older policy (staleness
    /// above 0, [`crate::rollout_side::admission::staleness`]). In auto mode μ stands in for
    /// π_old only when it is the learner's own distribution: on-policy, and no sampling filter.
    pub fn needs_old_pass(&self, on_policy: bool, off_policy: bool) -> bool {
        match self.mode {
            CorrectionMode::Bypass => false,
            CorrectionMode::Recompute => true,
            CorrectionMode::Decoupled => !self.loglinear_prox,
            // Against μ the cumulative ratio needs no π_old.
            CorrectionMode::Auto => {
                self.ratio_reference == RatioReference::Proximal
                    && (!on_policy || off_policy || self.filtered_sampling)
            }
        }
    }

    /// Whether the loss anchors its ratio at μ (bypass, or a cumulative ratio against μ).
    pub fn anchors_at_behaviour(&self) -> bool {
        self.mode == CorrectionMode::Bypass || self.ratio_reference == RatioReference::Behaviour
    }
}

/// The step's off-policy metrics, accumulated over the batches they come from.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct StepDiagnostics {
    sums: BTreeMap<String, f64>,
    tokens: f64,
    /// The largest |log π_train − log μ| over valid tokens.
    max_abs_log_ratio: f64,
    positions: PositionQuantiles,
    /// Seconds spent correcting and measuring.
    pub correction_secs: f64,
    /// Seconds of the π_old / π_prox forward pass.
    pub prox_secs: Option<f64>,
}

impl StepDiagnostics {
    /// Corrects a row-major `[rows, cols]` response-aligned batch of `train` log-probs against
    /// `behaviour`, and adds its metrics (weighted by its valid tokens) and log-ratios by
    /// position to the step's.
    pub fn correct(
        &mut self,
        train: &[f32],
        behaviour: &[f32],
        mask: &[f32],
        dims: [usize; 2],
        config: &CorrectionConfig,
    ) -> Result<HostCorrection> {
        let t0 = Instant::now();
        let f = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<f64>>();
        let (train, behaviour, mask) = (f(train), f(behaviour), f(mask));
        let out = correct_host(&train, &behaviour, &mask, dims, config)?;
        let tokens: f64 = mask.iter().filter(|m| **m > 0.5).sum();
        for (k, v) in &out.metrics {
            *self.sums.entry(k.clone()).or_insert(0.0) += v * tokens;
        }
        self.tokens += tokens;
        let log_ratio: Vec<f64> = train.iter().zip(&behaviour).map(|(t, b)| t - b).collect();
        for (r, m) in log_ratio.iter().zip(&mask) {
            if *m > 0.5 {
                self.max_abs_log_ratio = self.max_abs_log_ratio.max(r.abs());
            }
        }
        self.positions.add(&log_ratio, &mask, dims);
        self.correction_secs += t0.elapsed().as_secs_f64();
        Ok(out)
    }

    /// Adds `other`'s sums, counts and log-ratios (a learner rank's, merged in rank order).
    pub fn merge(&mut self, other: StepDiagnostics) {
        for (k, v) in other.sums {
            *self.sums.entry(k).or_insert(0.0) += v;
        }
        self.tokens += other.tokens;
        self.max_abs_log_ratio = self.max_abs_log_ratio.max(other.max_abs_log_ratio);
        self.positions.merge(other.positions);
        self.correction_secs += other.correction_secs;
        if let Some(p) = other.prox_secs {
            *self.prox_secs.get_or_insert(0.0) += p;
        }
    }

    /// `offpolicy/<key>` (token-weighted means over the step), `offpolicy/max_abs_log_ratio`
    /// (the largest per-token |log π − log μ|), the position quantiles `offpolicy/pos/...`,
    /// `time/correction_s` and `time/prox_s`.
    pub fn metrics(&self) -> BTreeMap<String, f64> {
        let t0 = Instant::now();
        let mut m = BTreeMap::new();
        if self.tokens > 0.0 {
            for (k, v) in &self.sums {
                m.insert(format!("offpolicy/{k}"), v / self.tokens);
            }
            m.insert("offpolicy/max_abs_log_ratio".into(), self.max_abs_log_ratio);
        }
        for (k, v) in self.positions.metrics() {
            m.insert(format!("offpolicy/{k}"), v);
        }
        let secs = self.correction_secs + t0.elapsed().as_secs_f64();
        m.insert("time/correction_s".into(), secs);
        if let Some(p) = self.prox_secs {
            m.insert("time/prox_s".into(), p);
        }
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlft_algo::correction::{IsConfig, IsLevel, IsThreshold};

    fn plan(mode: CorrectionMode) -> OffPolicy {
        OffPolicy {
            mode,
            correction: CorrectionConfig::default(),
            ratio_reference: RatioReference::Proximal,
            bypass_applies_weights: false,
            filtered_sampling: false,
            loglinear_prox: false,
            opsm: None,
            m2po_threshold: None,
            kpop: None,
            veto_threshold: None,
        }
    }

    #[test]
    fn which_modes_run_the_old_pass() {
        let auto = plan(CorrectionMode::Auto);
        assert!(!auto.needs_old_pass(true, false));
        assert!(auto.needs_old_pass(false, false) && auto.needs_old_pass(true, true));
        assert!(plan(CorrectionMode::Recompute).needs_old_pass(true, false));
        assert!(plan(CorrectionMode::Decoupled).needs_old_pass(true, false));
        assert!(!plan(CorrectionMode::Bypass).needs_old_pass(false, true));
        let behaviour = OffPolicy {
            ratio_reference: RatioReference::Behaviour,
            ..auto
        };
        assert!(!behaviour.needs_old_pass(false, true) && behaviour.anchors_at_behaviour());
        // μ from a filtered draw is not the learner's distribution: auto computes π_old.
        let filtered = OffPolicy {
            filtered_sampling: true,
            ..plan(CorrectionMode::Auto)
        };
        assert!(filtered.needs_old_pass(true, false));
        let loglinear = OffPolicy {
            loglinear_prox: true,
            ..plan(CorrectionMode::Decoupled)
        };
        assert!(!loglinear.needs_old_pass(false, true));
    }

    /// Metrics are token-weighted over the batches of a step.
    #[test]
    fn step_metrics_weigh_batches_by_tokens() {
        let config = CorrectionConfig {
            is: Some(IsConfig {
                level: IsLevel::Token,
                threshold: IsThreshold::Truncate { upper: 2.0 },
                batch_normalize: false,
            }),
            rejection: Vec::new(),
        };
        let mut d = StepDiagnostics::default();
        // Batch 1: one token with log-ratio 0.2; batch 2: three tokens with 0.
        d.correct(&[0.2], &[0.0], &[1.0], [1, 1], &config).unwrap();
        d.correct(&[0.0; 3], &[0.0; 3], &[1.0; 3], [1, 3], &config)
            .unwrap();
        let m = d.metrics();
        let kl = m["offpolicy/kl"];
        assert!((kl - (-0.2f32 as f64) / 4.0).abs() < 1e-7, "{kl}");
        assert_eq!(m["offpolicy/max_abs_log_ratio"], 0.2f32 as f64);
        assert!(m.contains_key("offpolicy/rollout_is_mean"));
        assert!(m.contains_key("offpolicy/pos/cum/1-8/p50"));
        assert!(m.contains_key("time/correction_s") && !m.contains_key("time/prox_s"));
    }
}
