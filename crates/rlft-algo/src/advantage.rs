//! Advantage estimators: group comparison (GRPO, Dr.GRPO, batch-std, pass@k, GPG), RLOO, OPO,
//! REINFORCE++ and its group baseline, ReMax, and GAE with a critic (verl 0.9.1's definitions).
//!
//! Group statistics are computed on the host in f64 (they involve per-group bookkeeping and no
//! gradient); the results come back as tensors on the input's device and dtype.

use crate::logprob::check_bt;
use crate::masked::{from_host, masked_whiten, to_host};
use crate::{AlgoError, Result};
use burn::tensor::Tensor;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// How advantages are computed from rewards.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "name", rename_all = "snake_case")]
pub enum AdvantageEstimator {
    /// Group comparison `(R − mean_g) / (std_g + ε)` (unbiased std), or `R − mean_g` without std
    /// (Dr.GRPO). A singleton group keeps its raw score (mean 0, std 1), as the reference does.
    Grpo {
        /// Divide by the group's std.
        norm_by_std: bool,
        /// ε added to the std.
        epsilon: f64,
    },
    /// `(R − mean_g) / (std_batch + ε)`: group baseline, batch-level scale.
    GroupMeanBatchStd {
        /// ε added to the std.
        epsilon: f64,
    },
    /// Leave-one-out baseline: `R − mean of the other responses` (singleton: raw score).
    Rloo,
    /// REINFORCE++: discounted returns-to-go, whitened over the batch.
    ReinforcePlusPlus {
        /// Discount γ.
        gamma: f64,
    },
    /// REINFORCE++-baseline: `R − mean_g` on every token, whitened over the batch.
    ReinforcePlusPlusBaseline,
    /// OPO: `R − b_g` with the length-weighted group baseline `b_g = Σ |y_j|·R_j / Σ |y_j|`
    /// (singleton: 0).
    Opo,
    /// ReMax: returns-to-go minus the reward of a greedy response to the same prompt
    /// ([`AdvantageInput::with_reward_baselines`]); no whitening.
    Remax,
    /// Pass@k: only each group's best response gets an advantage, `R_max − R_second`, divided by
    /// the group's std (+ε) when `norm_by_std`. Groups need at least two responses.
    GrpoPassk {
        /// Divide by the group's std.
        norm_by_std: bool,
        /// ε added to the std.
        epsilon: f64,
    },
    /// GPG: `α·(R − mean_g) / f_norm` with `α = batch / #(R ≠ 0)` (singleton: mean 0).
    Gpg {
        /// The normaliser `f_norm`.
        f_norm: f64,
    },
    /// MaxRL (prime-rl): `(R − mean_g)/mean_g` over the group's rows that sampled a token, 0
    /// when `mean_g ≤ 0`; rows without tokens get 0 and stay out of the mean. Computed in f32,
    /// as prime-rl builds its rewards tensor.
    MaxRl,
    /// Generalised advantage estimation with a critic's values, whitened over the batch.
    Gae {
        /// Discount γ.
        gamma: f64,
        /// GAE λ.
        lam: f64,
    },
}

/// Names accepted by [`AdvantageEstimator::from_name`].
pub const ESTIMATOR_NAMES: [&str; 12] = [
    "grpo",
    "dr_grpo",
    "batch_std",
    "rloo",
    "opo",
    "grpo_passk",
    "gpg",
    "remax",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "gae",
    "max_rl",
];

impl AdvantageEstimator {
    /// GRPO with std normalisation and ε = 1e-6.
    pub fn grpo() -> Self {
        AdvantageEstimator::Grpo {
            norm_by_std: true,
            epsilon: 1e-6,
        }
    }

    /// An estimator by name with default settings (γ = 1, λ = 0.95 where they apply).
    pub fn from_name(name: &str) -> Result<Self> {
        Ok(match name.trim().to_ascii_lowercase().as_str() {
            "grpo" => Self::grpo(),
            "dr_grpo" | "grpo_no_std" => AdvantageEstimator::Grpo {
                norm_by_std: false,
                epsilon: 1e-6,
            },
            "batch_std" => AdvantageEstimator::GroupMeanBatchStd { epsilon: 1e-6 },
            "rloo" => AdvantageEstimator::Rloo,
            "opo" => AdvantageEstimator::Opo,
            "remax" => AdvantageEstimator::Remax,
            "grpo_passk" | "passk" => AdvantageEstimator::GrpoPassk {
                norm_by_std: true,
                epsilon: 1e-6,
            },
            "gpg" => AdvantageEstimator::Gpg { f_norm: 1.0 },
            "reinforce_plus_plus" | "reinforce++" => {
                AdvantageEstimator::ReinforcePlusPlus { gamma: 1.0 }
            }
            "reinforce_plus_plus_baseline" | "reinforce++_baseline" => {
                AdvantageEstimator::ReinforcePlusPlusBaseline
            }
            "gae" => AdvantageEstimator::Gae {
                gamma: 1.0,
                lam: 0.95,
            },
            "max_rl" | "maxrl" => AdvantageEstimator::MaxRl,
            _ => {
                return Err(AlgoError::unknown(
                    "advantage estimator",
                    name,
                    &ESTIMATOR_NAMES,
                ));
            }
        })
    }

    /// The name [`AdvantageEstimator::from_name`] reads back (settings such as γ are not part
    /// of it).
    pub fn name(&self) -> &'static str {
        match self {
            AdvantageEstimator::Grpo {
                norm_by_std: true, ..
            } => "grpo",
            AdvantageEstimator::Grpo { .. } => "dr_grpo",
            AdvantageEstimator::GroupMeanBatchStd { .. } => "batch_std",
            AdvantageEstimator::Rloo => "rloo",
            AdvantageEstimator::ReinforcePlusPlus { .. } => "reinforce_plus_plus",
            AdvantageEstimator::ReinforcePlusPlusBaseline => "reinforce_plus_plus_baseline",
            AdvantageEstimator::Opo => "opo",
            AdvantageEstimator::Remax => "remax",
            AdvantageEstimator::GrpoPassk { .. } => "grpo_passk",
            AdvantageEstimator::Gpg { .. } => "gpg",
            AdvantageEstimator::Gae { .. } => "gae",
            AdvantageEstimator::MaxRl => "max_rl",
        }
    }

    /// Whether the estimator needs a critic's `values`.
    pub fn needs_values(&self) -> bool {
        matches!(self, AdvantageEstimator::Gae { .. })
    }

    /// Whether the estimator needs group ids.
    pub fn needs_groups(&self) -> bool {
        matches!(
            self,
            AdvantageEstimator::Grpo { .. }
                | AdvantageEstimator::GroupMeanBatchStd { .. }
                | AdvantageEstimator::Rloo
                | AdvantageEstimator::Opo
                | AdvantageEstimator::GrpoPassk { .. }
                | AdvantageEstimator::Gpg { .. }
                | AdvantageEstimator::ReinforcePlusPlusBaseline
                | AdvantageEstimator::MaxRl
        )
    }

    /// Whether the estimator needs the reward of a greedy baseline response per row (ReMax).
    pub fn needs_reward_baselines(&self) -> bool {
        matches!(self, AdvantageEstimator::Remax)
    }

    /// Computes advantages and returns.
    pub fn compute(&self, input: &AdvantageInput) -> Result<AdvantageOutput> {
        let [b, t] = input.token_rewards.dims();
        check_bt("response_mask", &input.response_mask, [b, t])?;
        let rewards = to_host(&input.token_rewards)?;
        let mask = to_host(&input.response_mask)?;
        let like = &input.token_rewards;
        let scores: Vec<f64> = (0..b)
            .map(|i| rewards[i * t..(i + 1) * t].iter().sum())
            .collect();
        let groups = || self.groups(input, &scores);
        let per_row = |values: Vec<f64>| -> Tensor<2> {
            let full: Vec<f64> = (0..b * t).map(|k| values[k / t] * mask[k]).collect();
            from_host(full, [b, t], like)
        };
        let out = match *self {
            AdvantageEstimator::Grpo {
                norm_by_std,
                epsilon,
            } => same(per_row(grpo(&groups()?, &scores, norm_by_std, epsilon))),
            AdvantageEstimator::GroupMeanBatchStd { epsilon } => {
                let g = groups()?;
                let std = unbiased_std(&scores);
                same(per_row(
                    (0..b)
                        .map(|i| (scores[i] - g.mean_std(i).0) / (std + epsilon))
                        .collect(),
                ))
            }
            AdvantageEstimator::MaxRl => {
                let ids = input.group_index.as_deref().unwrap_or_default();
                groups()?;
                let sampled: Vec<bool> = (0..b)
                    .map(|i| mask[i * t..(i + 1) * t].iter().any(|m| *m > 0.5))
                    .collect();
                same(per_row(max_rl(&scores, ids, &sampled)))
            }
            AdvantageEstimator::Rloo => same(per_row(rloo(&groups()?, &scores))),
            AdvantageEstimator::Opo => {
                let g = groups()?;
                let len: Vec<f64> = (0..b)
                    .map(|i| mask[i * t..(i + 1) * t].iter().sum())
                    .collect();
                let baseline = g.weighted_means(&scores, &len);
                same(per_row((0..b).map(|i| scores[i] - baseline[i]).collect()))
            }
            AdvantageEstimator::GrpoPassk {
                norm_by_std,
                epsilon,
            } => {
                let g = groups()?;
                same(per_row(g.pass_at_k(&scores, norm_by_std, epsilon)?))
            }
            AdvantageEstimator::Gpg { f_norm } => {
                let g = groups()?;
                let nonzero = scores.iter().filter(|s| **s != 0.0).count().max(1);
                let alpha = b as f64 / nonzero as f64;
                same(per_row(
                    (0..b)
                        .map(|i| alpha * (scores[i] - g.mean_std(i).0) / f_norm)
                        .collect(),
                ))
            }
            AdvantageEstimator::Remax => remax(input, (&rewards, &mask), [b, t])?,
            AdvantageEstimator::ReinforcePlusPlusBaseline => {
                let g = groups()?;
                let centered = per_row((0..b).map(|i| scores[i] - g.mean_std(i).0).collect());
                check_whitenable(&mask)?;
                same(
                    masked_whiten(centered, &input.response_mask, true)
                        * input.response_mask.clone(),
                )
            }
            AdvantageEstimator::ReinforcePlusPlus { gamma } => {
                let returns = returns_to_go(&rewards, &mask, [b, t], gamma);
                check_whitenable(&mask)?;
                let returns = from_host(returns, [b, t], like);
                let adv = masked_whiten(returns.clone(), &input.response_mask, true)
                    * input.response_mask.clone();
                AdvantageOutput {
                    advantages: adv,
                    returns,
                }
            }
            AdvantageEstimator::Gae { gamma, lam } => {
                gae(input, (&rewards, &mask), [b, t], (gamma, lam))?
            }
        };
        Ok(out)
    }

    /// The groups of `input`'s rows with their outcome `scores`, for the group estimators.
    fn groups(&self, input: &AdvantageInput, scores: &[f64]) -> Result<Groups> {
        let b = scores.len();
        match &input.group_index {
            Some(g) if g.len() == b => Ok(Groups::new(g, scores)),
            Some(g) => Err(AlgoError::GroupIndex {
                got: g.len(),
                batch: b,
            }),
            None => Err(AlgoError::MissingInput {
                loss: format!("{self:?}"),
                input: "group_index",
                hint: "give the prompt/group id of every row with AdvantageInput::with_groups",
            }),
        }
    }
}

/// GRPO's per-row advantages: each score minus its group's mean, divided by the group's std
/// plus `epsilon` when `norm_by_std`.
fn grpo(g: &Groups, scores: &[f64], norm_by_std: bool, epsilon: f64) -> Vec<f64> {
    (0..scores.len())
        .map(|i| {
            let (mean, std) = g.mean_std(i);
            if norm_by_std {
                (scores[i] - mean) / (std + epsilon)
            } else {
                scores[i] - mean
            }
        })
        .collect()
}

/// RLOO's per-row advantages: each score minus the mean of the others in its group (the score
/// itself in a group of one).
fn rloo(g: &Groups, scores: &[f64]) -> Vec<f64> {
    (0..scores.len())
        .map(|i| {
            let n = g.size(i) as f64;
            if n > 1.0 {
                scores[i] * n / (n - 1.0) - g.mean_std(i).0 * n / (n - 1.0)
            } else {
                scores[i]
            }
        })
        .collect()
}

/// ReMax: the returns to go minus each row's greedy-response reward (`reward_baselines`).
fn remax(
    input: &AdvantageInput,
    (rewards, mask): (&[f64], &[f64]),
    [b, t]: [usize; 2],
) -> Result<AdvantageOutput> {
    let like = &input.token_rewards;
    let baselines = input.reward_baselines.as_ref().ok_or(AlgoError::MissingInput {
        loss: "remax".into(),
        input: "reward_baselines",
        hint: "ReMax needs the reward of a greedy response per row: AdvantageInput::with_reward_baselines",
    })?;
    if baselines.len() != b {
        return Err(AlgoError::GroupIndex {
            got: baselines.len(),
            batch: b,
        });
    }
    let returns = returns_to_go(rewards, mask, [b, t], 1.0);
    let adv: Vec<f64> = (0..b * t)
        .map(|k| returns[k] - baselines[k / t] * mask[k])
        .collect();
    Ok(AdvantageOutput {
        advantages: from_host(adv, [b, t], like),
        returns: from_host(returns, [b, t], like),
    })
}

/// GAE(γ, λ) over the critic's values, whitened over the response tokens; the returns are
/// the advantages before whitening plus the values.
fn gae(
    input: &AdvantageInput,
    (rewards, mask): (&[f64], &[f64]),
    [b, t]: [usize; 2],
    (gamma, lam): (f64, f64),
) -> Result<AdvantageOutput> {
    let like = &input.token_rewards;
    let values = input.values.as_ref().ok_or(AlgoError::MissingInput {
        loss: "gae".into(),
        input: "values",
        hint: "GAE needs the critic's values: AdvantageInput::with_values",
    })?;
    check_bt("values", values, [b, t])?;
    let v = to_host(values)?;
    let mut adv = vec![0.0; b * t];
    for i in 0..b {
        let (mut next_value, mut last_gae) = (0.0, 0.0);
        for j in (0..t).rev() {
            let k = i * t + j;
            let delta = rewards[k] + gamma * next_value - v[k];
            let gae = delta + gamma * lam * last_gae;
            next_value = v[k] * mask[k] + (1.0 - mask[k]) * next_value;
            last_gae = gae * mask[k] + (1.0 - mask[k]) * last_gae;
            adv[k] = last_gae;
        }
    }
    check_whitenable(mask)?;
    let adv = from_host(adv, [b, t], like);
    let returns = adv.clone() + values.clone();
    Ok(AdvantageOutput {
        advantages: masked_whiten(adv, &input.response_mask, true),
        returns,
    })
}

/// MaxRL's per-row advantages in f32 arithmetic (group means over sampled rows, in row order).
fn max_rl(scores: &[f64], ids: &[u64], sampled: &[bool]) -> Vec<f64> {
    let mut sums: std::collections::BTreeMap<u64, (f32, f32)> = Default::default();
    for i in 0..scores.len() {
        if sampled[i] {
            let e = sums.entry(ids[i]).or_default();
            e.0 += scores[i] as f32;
            e.1 += 1.0;
        }
    }
    (0..scores.len())
        .map(|i| {
            let (sum, n) = sums.get(&ids[i]).copied().unwrap_or_default();
            let mean = if n > 0.0 { sum / n } else { 0.0 };
            if !sampled[i] || mean <= 0.0 {
                0.0
            } else {
                f64::from((scores[i] as f32 - mean) / mean)
            }
        })
        .collect()
}

/// Discounted returns-to-go per row, skipping unmasked positions (REINFORCE++, ReMax).
fn returns_to_go(rewards: &[f64], mask: &[f64], [b, t]: [usize; 2], gamma: f64) -> Vec<f64> {
    let mut returns = vec![0.0; b * t];
    for i in 0..b {
        let mut running = 0.0;
        for j in (0..t).rev() {
            let k = i * t + j;
            let new = rewards[k] * mask[k] + gamma * running;
            returns[k] = new * mask[k];
            running = new * mask[k] + running * (1.0 - mask[k]);
        }
    }
    returns
}

fn same(adv: Tensor<2>) -> AdvantageOutput {
    AdvantageOutput {
        returns: adv.clone(),
        advantages: adv,
    }
}

fn check_whitenable(mask: &[f64]) -> Result<()> {
    let n = mask.iter().filter(|m| **m > 0.5).count();
    if n < 2 {
        return Err(AlgoError::InvalidSetting {
            name: "response tokens in the batch",
            value: n as f64,
            allowed: "whitening needs at least 2 response tokens; use a larger batch or a group estimator",
        });
    }
    Ok(())
}

fn unbiased_std(x: &[f64]) -> f64 {
    if x.len() < 2 {
        return 1.0;
    }
    let mean = x.iter().sum::<f64>() / x.len() as f64;
    (x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (x.len() - 1) as f64).sqrt()
}

/// Per-row group statistics.
struct Groups {
    row_group: Vec<usize>,
    stats: Vec<(usize, f64, f64)>,
}

impl Groups {
    fn new(index: &[u64], scores: &[f64]) -> Self {
        let mut ids: HashMap<u64, usize> = HashMap::new();
        let mut members: Vec<Vec<f64>> = Vec::new();
        let row_group = index
            .iter()
            .zip(scores)
            .map(|(id, s)| {
                let g = *ids.entry(*id).or_insert_with(|| {
                    members.push(Vec::new());
                    members.len() - 1
                });
                members[g].push(*s);
                g
            })
            .collect();
        let stats = members
            .iter()
            .map(|m| {
                if m.len() == 1 {
                    (1, 0.0, 1.0)
                } else {
                    (
                        m.len(),
                        m.iter().sum::<f64>() / m.len() as f64,
                        unbiased_std(m),
                    )
                }
            })
            .collect();
        Self { row_group, stats }
    }

    /// Per row: its group's `Σ w·x / Σ w` (singleton groups: 0; zero total weight: plain mean).
    fn weighted_means(&self, x: &[f64], w: &[f64]) -> Vec<f64> {
        let n = self.stats.len();
        let (mut num, mut den, mut sum) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
        for (i, g) in self.row_group.iter().enumerate() {
            num[*g] += w[i] * x[i];
            den[*g] += w[i];
            sum[*g] += x[i];
        }
        self.row_group
            .iter()
            .map(|&g| match self.stats[g].0 {
                1 => 0.0,
                size if den[g] == 0.0 => sum[g] / size as f64,
                _ => num[g] / den[g],
            })
            .collect()
    }

    /// Pass@k advantages: each group's best row (first on ties) gets `max − second`, scaled by
    /// `1 / (std + ε)` when `norm`; every other row 0.
    fn pass_at_k(&self, scores: &[f64], norm: bool, epsilon: f64) -> Result<Vec<f64>> {
        let mut adv = vec![0.0; scores.len()];
        for g in 0..self.stats.len() {
            let rows: Vec<usize> = (0..scores.len())
                .filter(|&i| self.row_group[i] == g)
                .collect();
            if rows.len() < 2 {
                return Err(AlgoError::InvalidSetting {
                    name: "grpo_passk group size",
                    value: rows.len() as f64,
                    allowed: "pass@k advantages need at least 2 responses per prompt (rollout.group_size >= 2)",
                });
            }
            let best = rows
                .iter()
                .copied()
                .reduce(|a, c| if scores[c] > scores[a] { c } else { a })
                .unwrap_or(rows[0]);
            let second = rows
                .iter()
                .filter(|&&i| i != best)
                .map(|&i| scores[i])
                .fold(f64::NEG_INFINITY, f64::max);
            let gap = scores[best] - second;
            adv[best] = if norm {
                gap / (self.stats[g].2 + epsilon)
            } else {
                gap
            };
        }
        Ok(adv)
    }

    fn size(&self, row: usize) -> usize {
        self.stats[self.row_group[row]].0
    }

    fn mean_std(&self, row: usize) -> (f64, f64) {
        let (_, m, s) = self.stats[self.row_group[row]];
        (m, s)
    }
}

/// Inputs of an advantage estimator. All tensors `[batch, T]`.
#[derive(Debug, Clone)]
pub struct AdvantageInput {
    /// Rewards per token (an outcome reward sits on the last response token).
    pub token_rewards: Tensor<2>,
    /// Response mask.
    pub response_mask: Tensor<2>,
    /// Group (prompt) id of each row, for group estimators.
    pub group_index: Option<Vec<u64>>,
    /// Critic values, for GAE.
    pub values: Option<Tensor<2>>,
    /// Reward of a greedy baseline response per row, for ReMax.
    pub reward_baselines: Option<Vec<f64>>,
}

impl AdvantageInput {
    /// Rewards and mask.
    pub fn new(token_rewards: Tensor<2>, response_mask: Tensor<2>) -> Self {
        Self {
            token_rewards,
            response_mask,
            group_index: None,
            values: None,
            reward_baselines: None,
        }
    }

    /// Adds the reward of a greedy baseline response per row (ReMax).
    pub fn with_reward_baselines(mut self, baselines: Vec<f64>) -> Self {
        self.reward_baselines = Some(baselines);
        self
    }

    /// Adds group ids (one per row).
    pub fn with_groups(mut self, ids: Vec<u64>) -> Self {
        self.group_index = Some(ids);
        self
    }

    /// Adds critic values.
    pub fn with_values(mut self, v: Tensor<2>) -> Self {
        self.values = Some(v);
        self
    }
}

/// Advantages and returns, `[batch, T]` each.
#[derive(Debug, Clone)]
pub struct AdvantageOutput {
    /// Advantages `A`.
    pub advantages: Tensor<2>,
    /// Returns (value targets for a critic).
    pub returns: Tensor<2>,
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::t2;

    #[test]
    fn grpo_normalises_within_groups() {
        let r = t2(vec![0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 5.0, 0.0], 4, 2);
        let m = t2(vec![1.0; 8], 4, 2);
        let out = AdvantageEstimator::grpo()
            .compute(&AdvantageInput::new(r, m).with_groups(vec![7, 7, 3, 9]))
            .unwrap();
        let a = to_host(&out.advantages).unwrap();
        let std = (0.5f64).sqrt();
        assert!(
            (a[0] - 0.5 / (std + 1e-6)).abs() < 1e-12 && (a[2] + 0.5 / (std + 1e-6)).abs() < 1e-12
        );
        assert!(
            (a[4] - 1.0 / (1.0 + 1e-6)).abs() < 1e-12,
            "singleton keeps its score"
        );
        assert!((a[6] - 5.0 / (1.0 + 1e-6)).abs() < 1e-12);
    }

    #[test]
    fn errors_name_the_missing_piece() {
        let r = t2(vec![1.0; 4], 2, 2);
        let m = t2(vec![1.0; 4], 2, 2);
        let e = AdvantageEstimator::grpo()
            .compute(&AdvantageInput::new(r.clone(), m.clone()))
            .unwrap_err();
        assert!(e.to_string().contains("group_index"), "{e}");
        let e = AdvantageEstimator::grpo()
            .compute(&AdvantageInput::new(r.clone(), m.clone()).with_groups(vec![1]))
            .unwrap_err();
        assert!(
            e.to_string().contains("1 entries but the batch has 2"),
            "{e}"
        );
        let e = AdvantageEstimator::Gae {
            gamma: 1.0,
            lam: 1.0,
        }
        .compute(&AdvantageInput::new(r, m))
        .unwrap_err();
        assert!(e.to_string().contains("values"), "{e}");
        assert!(
            AdvantageEstimator::from_name("ppo")
                .unwrap_err()
                .to_string()
                .contains("rloo")
        );
    }

    #[test]
    fn every_name_reads_back() {
        for name in ESTIMATOR_NAMES {
            let e = AdvantageEstimator::from_name(name).unwrap();
            assert_eq!(e.name(), name);
        }
    }
}
