//! What one RL step reports ([`StepReport`]): typed fields whose serde names are the
//! `metrics.jsonl` keys, and maps for the key families whose names depend on the run
//! (`reward/<term>`, environment counters, `staleness/hist/<k>`, `offpolicy/…`).

use crate::metrics::StepMetrics;
use crate::{Result, TrainError};
use serde::Serialize;
use std::collections::BTreeMap;

/// One RL step's metrics. [`StepReport::to_metrics`] gives the `metrics.jsonl` line (without
/// `eval/*`, which the run adds on evaluation steps).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct StepReport {
    /// The step (1-based; the policy version after it is `step + 1`).
    pub step: usize,
    /// The rollouts: rewards, lengths, what was filtered or skipped.
    #[serde(flatten)]
    pub rollout: RolloutReport,
    /// `staleness/*`: how many versions behind the learner each group's oldest token was.
    #[serde(flatten)]
    pub staleness: BTreeMap<String, f64>,
    /// The learning rate of the step's update.
    pub lr: f64,
    /// Seconds of each stage.
    #[serde(flatten)]
    pub times: StageTimes,
    /// `async/*`: the asynchronous pipeline (async mode only).
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub asynchrony: Option<AsyncReport>,
    /// `server/*`: the inference servers (with `rollout.servers` only).
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub server: Option<ServerReport>,
    /// `offpolicy/*` and the correction's timings ([`crate::offpolicy::StepDiagnostics`]).
    #[serde(flatten)]
    pub offpolicy: BTreeMap<String, f64>,
    /// The update.
    #[serde(flatten)]
    pub update: UpdateStats,
    /// `kl_coef`: β of this step, with the adaptive KL controller.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kl_coef: Option<f64>,
    /// Updates skipped so far for NaN/Inf losses or gradients.
    pub skipped_steps: usize,
}

/// The rollouts of a step.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RolloutReport {
    /// Mean reward (the weighted total of the terms) over the scored samples.
    #[serde(rename = "reward/mean")]
    pub reward_mean: f64,
    /// The environment's counters (tool calls, errors, …), by key.
    #[serde(flatten)]
    pub environment: BTreeMap<String, f64>,
    /// `reward/<term>`: each reward term's raw (unweighted) mean over the scored samples.
    #[serde(flatten)]
    pub reward_terms: BTreeMap<String, f64>,
    /// Standard deviation of the reward.
    #[serde(rename = "reward/std")]
    pub reward_std: f64,
    /// Fraction of samples the correctness term scored above 0.
    pub accuracy: f64,
    /// Mean generated length (tokens).
    #[serde(rename = "response_len/mean")]
    pub response_len_mean: f64,
    /// Longest generated length.
    #[serde(rename = "response_len/max")]
    pub response_len_max: f64,
    /// Groups dropped by dynamic sampling (all rewards equal).
    #[serde(rename = "groups/filtered")]
    pub groups_filtered: usize,
    /// Samples whose reward failed.
    #[serde(rename = "reward/failed")]
    pub reward_failed: usize,
    /// Samples whose reward timed out.
    #[serde(rename = "reward/timeouts")]
    pub reward_timeouts: usize,
    /// Prompts longer than `rollout.max_prompt_len`, skipped.
    #[serde(rename = "prompts/skipped")]
    pub prompts_skipped: usize,
    /// Generated tokens per second of generation.
    pub tokens_per_s: f64,
    /// With top-k / min-p / top-p on: the mean over sampled tokens of log S, the log of the
    /// probability mass the filters kept (μ is renormalised by it).
    #[serde(
        rename = "rollout/filter_log_mass",
        skip_serializing_if = "Option::is_none"
    )]
    pub filter_log_mass: Option<f64>,
    /// With `algorithm.sampling_mask = "replay"`: model tokens whose kept set was larger than
    /// `rollout.sampling_mask_max_ids` (not recorded, so masked from the loss).
    #[serde(
        rename = "rollout/sampling_mask_overflow",
        skip_serializing_if = "Option::is_none"
    )]
    pub sampling_mask_overflow: Option<f64>,
}

/// Seconds of a step's stages.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct StageTimes {
    /// Sampling.
    #[serde(rename = "time/generate_s")]
    pub generate: f64,
    /// Rewards, then the π_old / π_ref / value passes and advantages.
    #[serde(rename = "time/score_s")]
    pub score: f64,
    /// The update.
    #[serde(rename = "time/train_s")]
    pub train: f64,
    /// The whole step.
    #[serde(rename = "time/step_s")]
    pub step: f64,
}

/// The asynchronous pipeline during a step (async mode).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AsyncReport {
    /// Finished groups waiting after the batch was taken.
    #[serde(rename = "async/queue_len")]
    pub queue_len: f64,
    /// Groups of the batch requeued for staleness.
    #[serde(rename = "async/requeued")]
    pub requeued: f64,
    /// Groups of the batch dropped for staleness.
    #[serde(rename = "async/dropped")]
    pub dropped: f64,
    /// Fraction of the step the learner waited for its batch.
    #[serde(rename = "async/learner_idle")]
    pub learner_idle: f64,
    /// Fraction of the workers' time spent waiting.
    #[serde(rename = "async/rollout_idle")]
    pub rollout_idle: f64,
    /// Tokens the workers generated per second of the step.
    #[serde(rename = "async/rollout_tokens_per_s")]
    pub rollout_tokens_per_s: f64,
    /// Tokens of the learner's batch per second of the step.
    #[serde(rename = "async/learner_tokens_per_s")]
    pub learner_tokens_per_s: f64,
    /// Max − min policy version within each group, mean over groups.
    #[serde(rename = "async/version_spread")]
    pub version_spread: f64,
}

/// The inference servers during a step (`rollout.servers`): what was sent to them and what
/// bringing them new weights cost, since the previous step's line.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ServerReport {
    /// Servers in the fleet.
    #[serde(rename = "server/servers")]
    pub servers: f64,
    /// Completions requests answered (one per sampler call).
    #[serde(rename = "server/requests")]
    pub requests: f64,
    /// Seconds the requests took, summed over requests.
    #[serde(rename = "server/request_s")]
    pub request_s: f64,
    /// Tokens the servers generated.
    #[serde(rename = "server/tokens")]
    pub tokens: f64,
    /// Requests sent again to another server after theirs failed (distinct from
    /// `async/requeued`, the stale groups of `async.on_stale`).
    #[serde(rename = "server/requeued")]
    pub requeued: f64,
    /// Servers up (answering, serving the fleet's version) at the end of the step.
    #[serde(rename = "server/up")]
    pub up: f64,
    /// Seconds bringing the servers new weights: writing them and the servers loading them.
    #[serde(rename = "server/weight_sync_s")]
    pub weight_sync_s: f64,
    /// Of those, seconds writing the weights to `rollout.weights_dir`.
    #[serde(rename = "server/weight_write_s")]
    pub weight_write_s: f64,
    /// Of those, seconds until every server answered its update (they load side by side).
    #[serde(rename = "server/weight_load_s")]
    pub weight_load_s: f64,
    /// The weight version the servers serve at the end of the step.
    #[serde(rename = "server/weight_version")]
    pub weight_version: f64,
}

/// What an update measured, averaged over its micro-batches (zeros when the batch had no row
/// to learn from).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct UpdateStats {
    /// Fraction of tokens clipped at the lower bound.
    #[serde(rename = "clip_frac/low")]
    pub clip_low: f64,
    /// Fraction of tokens clipped at the upper bound.
    #[serde(rename = "clip_frac/high")]
    pub clip_high: f64,
    /// KL to the reference.
    pub kl: f64,
    /// Entropy of the policy.
    pub entropy: f64,
    /// Largest gradient norm of the update's optimiser steps.
    pub grad_norm: f64,
    /// The critic's loss (with a critic).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value_loss: Option<f64>,
    /// Mixtures of experts: the fraction of recorded (token, sparse layer) pairs whose experts
    /// in the update passes differ from the sampler's (0 under router replay).
    #[serde(
        rename = "moe/routing_mismatch",
        skip_serializing_if = "Option::is_none"
    )]
    pub routing_mismatch: Option<f64>,
    /// Mixtures of experts: the same fraction for the learner's own top-k (how far the router
    /// moved since the sampler routed).
    #[serde(rename = "moe/router_drift", skip_serializing_if = "Option::is_none")]
    pub router_drift: Option<f64>,
    /// Mixtures of experts with `algorithm.moe_aux_coef` > 0: the update passes' mean
    /// load-balancing loss (before the coefficient).
    #[serde(rename = "moe/aux_loss", skip_serializing_if = "Option::is_none")]
    pub moe_aux_loss: Option<f64>,
    /// With `algorithm.sampling_mask = "replay"`: the mean probability mass the learner's
    /// policy (its whole-vocabulary softmax, in the update passes) puts outside the kept sets
    /// the sampled tokens were drawn from — the mass the loss over the kept sets neither sees
    /// nor moves (`algorithm.outside_mass_coef` penalises it).
    #[serde(
        rename = "rollout/mass_outside_kept",
        skip_serializing_if = "Option::is_none"
    )]
    pub mass_outside_kept: Option<f64>,
    /// A NaN/Inf loss or gradient left the weights untouched.
    #[serde(skip)]
    pub skipped: bool,
}

impl StepReport {
    /// The `metrics.jsonl` line.
    ///
    /// # Errors
    /// Never for a report the trainer built (every field is a number).
    pub fn to_metrics(&self) -> Result<StepMetrics> {
        match serde_json::to_value(self)? {
            serde_json::Value::Object(m) => Ok(m),
            other => Err(TrainError::Pipeline(format!(
                "a step report serialised to {other}, not an object"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_writes_todays_keys_and_leaves_out_what_a_run_lacks() {
        let mut r = StepReport {
            step: 3,
            ..StepReport::default()
        };
        r.rollout.reward_terms.insert("reward/format".into(), 0.5);
        r.staleness.insert("staleness/hist/0".into(), 1.0);
        let m = r.to_metrics().unwrap();
        for key in [
            "step",
            "reward/mean",
            "reward/std",
            "reward/format",
            "accuracy",
            "staleness/hist/0",
            "clip_frac/low",
            "kl",
            "grad_norm",
            "time/step_s",
            "skipped_steps",
            "tokens_per_s",
        ] {
            assert!(m.contains_key(key), "{key} missing from {m:?}");
        }
        for key in ["kl_coef", "value_loss", "async/queue_len", "skipped"] {
            assert!(!m.contains_key(key), "{key} present without its setting");
        }
        assert_eq!(m["step"], serde_json::json!(3));
        r.asynchrony = Some(AsyncReport::default());
        r.update.value_loss = Some(0.25);
        let m = r.to_metrics().unwrap();
        assert_eq!(m["value_loss"], serde_json::json!(0.25));
        assert!(m.contains_key("async/version_spread"));
    }
}
