//! The prepare stage: a collected batch (its rewards scored on the rollout side) becomes the
//! learner's [`Rows`] — overlong shaping and filtering on the rewards, then π_old (π_prox),
//! π_ref, critic values, advantages and the correction against μ (`passes.rs`) — with what the
//! step reports about its rewards and staleness.

use crate::Result;
use crate::batch::{RowOptions, Rows};
use crate::correction::{SamplingMask, TrainVersions};
use crate::learner::Learner;
use crate::models::Models;
use crate::offpolicy::StepDiagnostics;
use crate::recipe::Recipe;
use crate::report::RolloutReport;
use crate::rollout_side::admission::{staleness, staleness_metrics};
use crate::rollout_side::collect::{Collected, RolloutSide};
use rlft_algo::shaping::OverlongPenalty;
use rlft_rollout::Trajectory;
use std::collections::BTreeMap;

/// What preparing a batch reads: the frozen passes run on the models, the advantages on the
/// learner's plain device.
pub(crate) struct Prepare<'a> {
    pub(crate) recipe: &'a Recipe,
    pub(crate) models: &'a Models,
    pub(crate) learner: &'a Learner,
    /// The rewards and the correctness term.
    pub(crate) side: &'a RolloutSide,
    /// β of the KL term this step.
    pub(crate) beta: f64,
}

/// A step's batch, prepared: the learner's rows with everything the loss needs, and what the
/// step reports about the rollouts.
pub(crate) struct PreparedBatch {
    /// One row per scored trajectory.
    pub(crate) rows: Rows,
    /// Rewards, lengths, filtered and skipped counts.
    pub(crate) rollout: RolloutReport,
    /// `staleness/*`.
    pub(crate) staleness: BTreeMap<String, f64>,
    /// Max − min policy version within each group, mean over groups.
    pub(crate) version_spread: f64,
}

impl Prepare<'_> {
    /// Prepares the batch of step `step`: rows from the scored trajectories, then π_old, π_ref,
    /// values and advantages (the off-policy measurements go to `diag`).
    pub(crate) fn batch(
        &self,
        step: usize,
        batch: &Collected,
        diag: &mut StepDiagnostics,
    ) -> Result<PreparedBatch> {
        let groups = &batch.groups;
        let trajs: Vec<&Trajectory> = groups.iter().flat_map(|g| &g.trajectories).collect();
        let version = step as u64;
        // Off-policy: some token came from an older policy than the learner's.
        let off_policy = trajs.iter().any(|t| staleness(version, t.version) > 0);
        let oldest: Vec<u64> = groups
            .iter()
            .map(|g| g.oldest_version().unwrap_or(version))
            .collect();
        let version_spread = groups
            .iter()
            .map(|g| {
                let v = g.trajectories.iter().flat_map(|t| {
                    t.token_versions
                        .iter()
                        .copied()
                        .chain(std::iter::once(t.version))
                });
                (v.clone().max().unwrap_or(0) - v.min().unwrap_or(0)) as f64
            })
            .sum::<f64>()
            / groups.len().max(1) as f64;
        let a = &self.recipe.algorithm;
        let overlong = (a.overlong_cache_len > 0)
            .then(|| {
                OverlongPenalty::new(
                    self.recipe.rollout.max_new_tokens,
                    a.overlong_cache_len,
                    a.overlong_factor,
                )
            })
            .transpose()?;
        let options = RowOptions {
            overlong,
            overlong_filter: a.overlong_filter,
            current_only: a.correction.train_versions == TrainVersions::Current,
            replay: a.sampling_mask == SamplingMask::Replay,
        };
        let mut rows = Rows::from_groups(groups, &options);
        let rollout = self.rollout_report(&trajs, batch);
        if !rows.is_empty() {
            self.fill(&mut rows, off_policy, diag)?;
        }
        let mut staleness = staleness_metrics(version, &oldest, self.recipe.asynchrony.eta());
        staleness.insert(
            "staleness/token_age_mean".into(),
            token_age_mean(version, &trajs),
        );
        Ok(PreparedBatch {
            rows,
            rollout,
            staleness,
            version_spread,
        })
    }

    /// Reward statistics over every scored trajectory (before shaping), lengths and counts.
    fn rollout_report(&self, trajs: &[&Trajectory], batch: &Collected) -> RolloutReport {
        let scored: Vec<f64> = trajs.iter().filter_map(|t| t.reward).collect();
        let (reward_mean, reward_std) = mean_std(&scored);
        let accuracy = if trajs.is_empty() {
            0.0
        } else {
            trajs
                .iter()
                .map(|t| is_correct(t, &self.side.correctness))
                .sum::<f64>()
                / trajs.len() as f64
        };
        let lens: Vec<f64> = trajs.iter().map(|t| t.generated_len() as f64).collect();
        // Each term's raw (unweighted) mean over the scored samples.
        let reward_terms = self
            .side
            .rewards
            .names()
            .into_iter()
            .map(|name| {
                let v: Vec<f64> = trajs
                    .iter()
                    .filter_map(|t| t.reward_terms.iter().find(|(n, _)| *n == name))
                    .map(|(_, v)| *v)
                    .collect();
                (format!("reward/{name}"), mean_std(&v).0)
            })
            .collect();
        RolloutReport {
            reward_mean,
            environment: self.side.env.take_metrics(),
            reward_terms,
            reward_std,
            accuracy,
            response_len_mean: mean_std(&lens).0,
            response_len_max: lens.iter().copied().fold(0.0, f64::max),
            groups_filtered: batch.filtered,
            reward_failed: batch.failed,
            reward_timeouts: batch.timeouts,
            prompts_skipped: batch.skipped_prompts,
            tokens_per_s: batch.tokens as f64 / batch.generate_secs.max(1e-9),
            filter_log_mass: self.recipe.rollout.filtered().then(|| {
                let sum: f64 = trajs.iter().map(|t| t.filter_log_mass).sum();
                sum / lens.iter().sum::<f64>().max(1.0)
            }),
            sampling_mask_overflow: (self.recipe.algorithm.sampling_mask == SamplingMask::Replay)
                .then(|| {
                    trajs
                        .iter()
                        .map(|t| t.sampling_mask_overflow())
                        .sum::<usize>() as f64
                }),
        }
    }
}

/// The token-weighted policy age of a batch: the mean over its model tokens of the learner's
/// `version` minus the version that sampled the token.
fn token_age_mean(version: u64, trajs: &[&Trajectory]) -> f64 {
    let (mut sum, mut n) = (0u64, 0u64);
    for v in trajs.iter().flat_map(|t| t.model_versions()) {
        sum += staleness(version, v);
        n += 1;
    }
    sum as f64 / n.max(1) as f64
}

pub(crate) fn mean_std(v: &[f64]) -> (f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0);
    }
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
    (mean, var.sqrt())
}

/// 1 when the trajectory's correctness term (`term`: the task's `correct`, or the recipe's
/// `correctness` term) scored above 0.
pub(crate) fn is_correct(t: &Trajectory, term: &str) -> f64 {
    t.reward_terms
        .iter()
        .find(|(n, _)| n == term)
        .map_or(0.0, |(_, v)| if *v > 0.0 { 1.0 } else { 0.0 })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::tests::trajectory;

    /// The token age counts model tokens only, each by the version that sampled it.
    #[test]
    fn token_age_is_token_weighted() {
        let a = trajectory(vec![8, 9, 9], vec![1, 1, 1]);
        let b = trajectory(vec![10, 7], vec![1, 0]);
        // Ages at version 10: 2, 1, 1 and 0 (the observation is left out).
        assert_eq!(token_age_mean(10, &[&a, &b]), 1.0);
        assert_eq!(token_age_mean(10, &[]), 0.0);
    }
}
