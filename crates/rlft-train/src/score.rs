//! The score stage: a collected batch becomes the learner's rows — overlong shaping and
//! filtering on the rewards, then π_old (π_prox), π_ref, critic values and advantages
//! ([`Trainer::prepare`]) — with what the step reports about its rewards and staleness.

use crate::Result;
use crate::correction::{SamplingMask, TrainVersions};
use crate::offpolicy::StepDiagnostics;
use crate::report::RolloutReport;
use crate::rollout_side::admission::{staleness, staleness_metrics};
use crate::rollout_side::collect::Collected;
use crate::trainer::Trainer;
use rlft_algo::shaping::OverlongPenalty;
use rlft_rollout::Trajectory;
use std::collections::BTreeMap;

/// One trajectory prepared for the learner (host vectors over its response tokens).
pub(crate) struct Row {
    pub(crate) ids: Vec<i64>,
    pub(crate) prompt_len: usize,
    pub(crate) mask: Vec<f32>,
    /// The ratio's anchor: μ, π_old or π_prox (see [`OffPolicy`]).
    pub(crate) old_lp: Vec<f32>,
    /// μ: the behaviour log-probs the sampler recorded.
    pub(crate) behaviour_lp: Vec<f32>,
    /// The policy version that sampled each response token (log-linear π_prox).
    pub(crate) versions: Vec<f32>,
    /// The row's outcome reward after shaping (losses that weigh rows by score, e.g. TOPR).
    pub(crate) score: f32,
    /// Sampling-mask replay: each response token's kept set (empty: scored over the
    /// vocabulary).
    pub(crate) kept: Vec<Option<Vec<u32>>>,
    /// A mixture of experts' routing of the row's tokens as the sampler forwarded them.
    pub(crate) routing: Option<rlft_model::TokenRouting>,
    /// Decoupled mode: IS weights of π_prox against μ.
    pub(crate) is_w: Option<Vec<f32>>,
    pub(crate) ref_lp: Option<Vec<f32>>,
    pub(crate) adv: Vec<f32>,
    pub(crate) old_values: Option<Vec<f32>>,
    pub(crate) returns: Option<Vec<f32>>,
}

impl Row {
    pub(crate) fn resp_len(&self) -> usize {
        self.mask.len()
    }

    /// A sampled trajectory's row, with μ as its ratio's anchor until π_old is computed;
    /// `filtered` (overlong filtering) trains none of its tokens, `current_only` only the
    /// tokens of the newest policy version that sampled in the row.
    pub(crate) fn sampled(t: &Trajectory, filtered: bool, current_only: bool) -> Self {
        let newest = current_only.then(|| t.model_versions().max()).flatten();
        let trained = |i: usize, m: u8| {
            // `newest` is only known with `current_only`.
            let old = matches!((t.token_versions.get(i), newest), (Some(&v), Some(n)) if v < n);
            m == 1 && !filtered && !old
        };
        Self {
            ids: t
                .prompt_ids
                .iter()
                .chain(&t.response_ids)
                .map(|&x| x as i64)
                .collect(),
            prompt_len: t.prompt_ids.len(),
            mask: t
                .loss_mask
                .iter()
                .enumerate()
                .map(|(i, &m)| if trained(i, m) { 1.0 } else { 0.0 })
                .collect(),
            old_lp: t.behaviour_logprobs.clone(),
            behaviour_lp: t.behaviour_logprobs.clone(),
            versions: (0..t.response_ids.len())
                .map(|i| t.token_versions.get(i).copied().unwrap_or(t.version) as f32)
                .collect(),
            score: t.reward.unwrap_or(0.0) as f32,
            kept: Vec::new(),
            routing: t.routing.clone(),
            is_w: None,
            ref_lp: None,
            adv: Vec::new(),
            old_values: None,
            returns: None,
        }
    }

    /// Sampling-mask replay: the row carries its tokens' kept sets, and a model token whose set
    /// was not recorded (it overflowed `rollout.sampling_mask_max_ids`) gets no loss.
    pub(crate) fn replay(mut self, t: &Trajectory) -> Self {
        for (j, m) in self.mask.iter_mut().enumerate() {
            if !matches!(t.kept_ids.get(j), Some(Some(_))) {
                *m = 0.0;
            }
        }
        self.kept.clone_from(&t.kept_ids);
        self
    }

    /// A supervised row: `prompt` then the demonstrated `response`, trained where `mask` is 1.
    pub(crate) fn demonstration(prompt: &[u32], response: &[u32], mask: Vec<f32>) -> Self {
        let n = response.len();
        Self {
            ids: prompt.iter().chain(response).map(|&t| t as i64).collect(),
            prompt_len: prompt.len(),
            mask,
            old_lp: vec![0.0; n],
            behaviour_lp: vec![0.0; n],
            versions: vec![0.0; n],
            score: 0.0,
            kept: Vec::new(),
            routing: None,
            is_w: None,
            ref_lp: None,
            adv: vec![0.0; n],
            old_values: None,
            returns: None,
        }
    }
}

/// A step's batch, scored: the learner's rows with everything the loss needs, and what the
/// step reports about the rollouts.
pub(crate) struct ScoredBatch {
    /// One row per scored trajectory.
    pub(crate) rows: Vec<Row>,
    /// Rewards, lengths, filtered and skipped counts.
    pub(crate) rollout: RolloutReport,
    /// `staleness/*`.
    pub(crate) staleness: BTreeMap<String, f64>,
    /// Max − min policy version within each group, mean over groups.
    pub(crate) version_spread: f64,
}

impl ScoredBatch {
    /// Response tokens that carry a gradient.
    pub(crate) fn trained_tokens(&self) -> usize {
        self.rows
            .iter()
            .map(|r| r.mask.iter().filter(|&&x| x > 0.0).count())
            .sum()
    }
}

impl Trainer {
    /// Scores the batch of step `step`: rows from the scored trajectories, then π_old, π_ref,
    /// values and advantages (the off-policy measurements go to `diag`).
    pub(crate) fn score(
        &mut self,
        step: usize,
        batch: &Collected,
        diag: &mut StepDiagnostics,
    ) -> Result<ScoredBatch> {
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
        let current_only = a.correction.train_versions == TrainVersions::Current;
        let replay = a.sampling_mask == SamplingMask::Replay;
        let mut rows = Vec::new();
        let mut group_ids = Vec::new();
        let mut rewards = Vec::new();
        for (gi, g) in groups.iter().enumerate() {
            for t in g.trajectories.iter().filter(|t| t.reward.is_some()) {
                let mut reward = t.reward.unwrap_or(0.0);
                if let Some(p) = &overlong {
                    reward += p.penalty(t.generated_len());
                }
                let mut row = Row::sampled(t, a.overlong_filter && t.truncated, current_only);
                if replay {
                    row = row.replay(t);
                }
                row.score = reward as f32;
                rows.push(row);
                group_ids.push(gi as u64);
                rewards.push(reward);
            }
        }
        let rollout = self.rollout_report(&trajs, batch);
        if !rows.is_empty() {
            self.prepare(&mut rows, &group_ids, &rewards, off_policy, diag)?;
        }
        let mut staleness = staleness_metrics(version, &oldest, self.recipe.asynchrony.eta());
        staleness.insert(
            "staleness/token_age_mean".into(),
            token_age_mean(version, &trajs),
        );
        Ok(ScoredBatch {
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
    use rlft_rollout::FinishReason;

    fn trajectory(versions: Vec<u64>, loss_mask: Vec<u8>) -> Trajectory {
        let n = versions.len();
        Trajectory {
            prompt_ids: vec![1, 2],
            response_ids: vec![5; n],
            loss_mask,
            behaviour_logprobs: vec![-0.5; n],
            filter_log_mass: 0.0,
            kept_ids: Vec::new(),
            routing: None,
            version: versions.iter().copied().min().unwrap_or(0),
            token_versions: versions,
            finish_reason: FinishReason::Eos,
            truncated: false,
            reward: Some(1.0),
            reward_terms: Vec::new(),
            reward_error: None,
            group_id: 0,
            completion: String::new(),
            turns: 1,
        }
    }

    /// `train_versions = "current"` keeps loss only on the newest version's model tokens; the
    /// overlong filter drops every token; observations never train.
    #[test]
    fn rows_train_the_tokens_their_settings_allow() {
        let t = trajectory(vec![3, 3, 4, 4, 5, 5], vec![1, 1, 0, 1, 1, 0]);
        assert_eq!(
            Row::sampled(&t, false, false).mask,
            [1., 1., 0., 1., 1., 0.]
        );
        // Version 5 is the newest among model tokens (the last, an observation, is ignored).
        assert_eq!(Row::sampled(&t, false, true).mask, [0., 0., 0., 0., 1., 0.]);
        assert_eq!(Row::sampled(&t, true, false).mask, [0.; 6]);
        let row = Row::sampled(&t, false, false);
        assert_eq!((row.prompt_len, row.ids.len()), (2, 8));
        assert_eq!(row.old_lp, t.behaviour_logprobs);
    }

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
