//! The learner's batch, one path for the trainer and for loops written by hand: a rollout
//! batch's scored trajectories become [`Rows`] (host vectors over each response: tokens, mask,
//! μ, advantages, and what the trainer adds: π_old, π_ref, values, IS weights); the rows are
//! packed into the learner's layout ([`Packing::pack`], a [`LearnerBatch`]) and their
//! per-token values laid out beside it ([`per_token`]).
//!
//! [`crate::Trainer`] builds every step's batch through these; `examples/custom_loop.rs` shows
//! the same path by hand.

use burn::tensor::{Device, Tensor, TensorData};
use rlft_algo::AlgoError;
use rlft_algo::advantage::{AdvantageInput, AdvantageOutput};
use rlft_algo::kl::{KlEstimator, kl_penalty};
use rlft_algo::shaping::OverlongPenalty;
use rlft_model::TokenRouting;
use rlft_rollout::{Group, LearnerBatch, Trajectory};

/// One trajectory prepared for the learner: host vectors over its response tokens.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Row {
    /// Prompt and response token ids.
    pub ids: Vec<i64>,
    /// Tokens of the prompt.
    pub prompt_len: usize,
    /// 1 on the response tokens that train, 0 on tool observations and masked tokens.
    pub mask: Vec<f32>,
    /// The ratio's anchor: μ until the trainer computes π_old (or π_prox).
    pub old_lp: Vec<f32>,
    /// μ: the behaviour log-probs the sampler recorded.
    pub behaviour_lp: Vec<f32>,
    /// The policy version that sampled each response token (log-linear π_prox).
    pub versions: Vec<f32>,
    /// The row's outcome reward after shaping (losses that weigh rows by score, e.g. TOPR).
    pub score: f32,
    /// Sampling-mask replay: each response token's kept set (empty: scored over the
    /// vocabulary).
    pub kept: Vec<Option<Vec<u32>>>,
    /// A mixture of experts' routing of the row's tokens as the sampler forwarded them.
    pub routing: Option<TokenRouting>,
    /// Decoupled correction: IS weights of π_prox against μ.
    pub is_w: Option<Vec<f32>>,
    /// The reference policy's log-probs.
    pub ref_lp: Option<Vec<f32>>,
    /// Advantages ([`Rows::set_advantages`]).
    pub adv: Vec<f32>,
    /// The critic's values when the batch was prepared.
    pub old_values: Option<Vec<f32>>,
    /// Value targets.
    pub returns: Option<Vec<f32>>,
}

impl Row {
    /// Response tokens.
    pub fn resp_len(&self) -> usize {
        self.mask.len()
    }

    /// A sampled trajectory's row, with μ as its ratio's anchor; `filtered` (overlong
    /// filtering) trains none of its tokens, `current_only` only the tokens of the newest
    /// policy version that sampled in the row.
    pub fn sampled(t: &Trajectory, filtered: bool, current_only: bool) -> Self {
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
    /// was not recorded (it overflowed the sampler's `kept_ids_max`) gets no loss.
    pub fn replay(mut self, t: &Trajectory) -> Self {
        for (j, m) in self.mask.iter_mut().enumerate() {
            if !matches!(t.kept_ids.get(j), Some(Some(_))) {
                *m = 0.0;
            }
        }
        self.kept.clone_from(&t.kept_ids);
        self
    }

    /// A supervised row: `prompt` then the demonstrated `response`, trained where `mask` is 1.
    pub fn demonstration(prompt: &[u32], response: &[u32], mask: Vec<f32>) -> Self {
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

/// How trajectories become rows ([`Rows::from_groups`]); the default takes each reward as it
/// is and trains every model token.
#[derive(Debug, Clone, Copy, Default)]
pub struct RowOptions {
    /// DAPO's soft overlong penalty, added to each reward.
    pub overlong: Option<OverlongPenalty>,
    /// A truncated response trains no token (DAPO's overlong filter).
    pub overlong_filter: bool,
    /// Only the tokens of the newest policy version in a row train.
    pub current_only: bool,
    /// Sampling-mask replay ([`Row::replay`]).
    pub replay: bool,
}

/// The rows of a rollout batch, with each row's group (prompt) and shaped reward.
#[derive(Debug, Clone, Default)]
pub struct Rows {
    /// One row per scored trajectory (those whose reward failed are left out), group by group.
    pub rows: Vec<Row>,
    /// The group of each row: GRPO's baseline is taken within a group.
    pub group_ids: Vec<u64>,
    /// Each row's reward after shaping.
    pub rewards: Vec<f64>,
}

/// The reward's KL term (`algorithm.kl_placement = "reward"`): β and the estimator.
#[derive(Debug, Clone, Copy)]
pub struct KlInReward {
    /// β.
    pub beta: f64,
    /// The per-token estimator.
    pub estimator: KlEstimator,
}

impl Rows {
    /// The scored trajectories of `groups` as rows.
    pub fn from_groups(groups: &[Group], opts: &RowOptions) -> Self {
        let mut out = Self::default();
        for (gi, g) in groups.iter().enumerate() {
            for t in g.trajectories.iter().filter(|t| t.reward.is_some()) {
                let mut reward = t.reward.unwrap_or(0.0);
                if let Some(p) = &opts.overlong {
                    reward += p.penalty(t.generated_len());
                }
                let filtered = opts.overlong_filter && t.truncated;
                let mut row = Row::sampled(t, filtered, opts.current_only);
                if opts.replay {
                    row = row.replay(t);
                }
                row.score = reward as f32;
                out.rows.push(row);
                out.group_ids.push(gi as u64);
                out.rewards.push(reward);
            }
        }
        out
    }

    /// Whether no trajectory was scored.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Every row, by reference (what [`Packing::pack`] and [`per_token`] take).
    pub fn refs(&self) -> Vec<&Row> {
        self.rows.iter().collect()
    }

    /// The longest response (at least 1): the width of the advantage layout.
    pub fn width(&self) -> usize {
        self.rows
            .iter()
            .map(Row::resp_len)
            .max()
            .unwrap_or(1)
            .max(1)
    }

    /// Response tokens that carry a gradient.
    pub fn trained_tokens(&self) -> usize {
        self.rows
            .iter()
            .map(|r| r.mask.iter().filter(|&&x| x > 0.0).count())
            .sum()
    }

    /// The advantage estimators' input `[N, width]` on `device`: each row's reward on its last
    /// trained token, minus β·KL(π_old ‖ π_ref) on every token with `kl` (the rows' `ref_lp`
    /// set), the mask, the groups, and the rows' `old_values` with `values`.
    ///
    /// # Errors
    /// The KL estimator's.
    pub fn advantage_input(
        &self,
        device: &Device,
        kl: Option<KlInReward>,
        values: bool,
    ) -> Result<AdvantageInput, AlgoError> {
        let n = self.rows.len();
        let rmax = self.width();
        let mut tok_rewards = vec![0.0f32; n * rmax];
        let mut mask = vec![0.0f32; n * rmax];
        let mut vals = vec![0.0f32; n * rmax];
        for (i, row) in self.rows.iter().enumerate() {
            if let Some(last) = row.mask.iter().rposition(|&m| m > 0.0) {
                tok_rewards[i * rmax + last] = self.rewards[i] as f32;
            }
            for (j, &mv) in row.mask.iter().enumerate() {
                mask[i * rmax + j] = mv;
                if let Some(v) = &row.old_values {
                    vals[i * rmax + j] = v[j];
                }
            }
            if let (Some(kl), Some(r)) = (kl.filter(|k| k.beta > 0.0), &row.ref_lp) {
                let k = kl_penalty(
                    t2(device, row.old_lp.clone(), 1, row.resp_len()),
                    t2(device, r.clone(), 1, row.resp_len()),
                    kl.estimator,
                    None,
                )?;
                for (j, kv) in crate::host(k).iter().enumerate() {
                    tok_rewards[i * rmax + j] -= (kl.beta as f32) * kv * row.mask[j];
                }
            }
        }
        let mut input =
            AdvantageInput::new(t2(device, tok_rewards, n, rmax), t2(device, mask, n, rmax))
                .with_groups(self.group_ids.clone());
        if values {
            input = input.with_values(t2(device, vals, n, rmax));
        }
        Ok(input)
    }

    /// Each row's advantages (and, with `returns`, value targets) from an estimator's output
    /// over [`Rows::advantage_input`].
    pub fn set_advantages(&mut self, out: AdvantageOutput, returns: bool) {
        let rmax = self.width();
        let adv = crate::host(out.advantages);
        let ret = returns.then(|| crate::host(out.returns));
        for (i, row) in self.rows.iter_mut().enumerate() {
            let r = row.resp_len();
            row.adv = adv[i * rmax..i * rmax + r].to_vec();
            if let Some(ret) = &ret {
                row.returns = Some(ret[i * rmax..i * rmax + r].to_vec());
            }
        }
    }
}

/// How rows are packed into the learner's layout and cut into micro-batches.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Packing {
    /// Fills the layout's padding (the tokenizer's pad or end-of-sequence id).
    pub pad_id: i64,
    /// Rows per micro-batch at most.
    pub micro_batch_size: usize,
    /// Tokens (prompt + response) per micro-batch at most; 0: no limit.
    pub micro_batch_tokens: usize,
    /// Replay the sampler's expert routing in the learner's passes (R3).
    pub router_replay: bool,
    /// The router's load-balancing loss coefficient.
    pub moe_aux_coef: f64,
}

impl Packing {
    /// Every row in one micro-batch, padded with `pad_id`, routing free.
    pub fn new(pad_id: i64) -> Self {
        Self {
            pad_id,
            micro_batch_size: usize::MAX,
            micro_batch_tokens: 0,
            router_replay: false,
            moe_aux_coef: 0.0,
        }
    }

    /// `rows` in the learner's layout on `device` (the sampler's rescoring layout, see
    /// [`LearnerBatch`]), with their kept sets and routing when they carry them.
    pub fn pack(&self, rows: &[&Row], device: &Device) -> LearnerBatch {
        let seqs: Vec<(&[i64], usize)> = rows.iter().map(|r| (&r.ids[..], r.prompt_len)).collect();
        let mut batch = LearnerBatch::new(&seqs, self.pad_id, device);
        if rows.iter().any(|r| !r.kept.is_empty()) {
            let kept: Vec<&[Option<Vec<u32>>]> = rows.iter().map(|r| &r.kept[..]).collect();
            batch = batch.with_kept_sets(&kept);
        }
        if rows.iter().any(|r| r.routing.is_some()) {
            let routing: Vec<_> = rows.iter().map(|r| r.routing.as_ref()).collect();
            batch = batch.with_routing(&routing, self.router_replay, self.moe_aux_coef);
        }
        batch
    }

    /// `indices` split into micro-batches in order: at most `micro_batch_size` rows and, with
    /// `micro_batch_tokens`, at most that many tokens each — a row longer than the budget goes
    /// alone.
    pub fn micro_batches(&self, indices: &[usize], rows: &[Row]) -> Vec<Vec<usize>> {
        let budget = self.micro_batch_tokens;
        let mut out: Vec<Vec<usize>> = Vec::new();
        let mut tokens = 0;
        for &i in indices {
            let t = rows[i].ids.len();
            let full = out.last().is_none_or(|m| {
                m.len() >= self.micro_batch_size || (budget > 0 && tokens + t > budget)
            });
            if full {
                out.push(Vec::new());
                tokens = 0;
            }
            if let Some(m) = out.last_mut() {
                m.push(i);
            }
            tokens += t;
        }
        out
    }
}

/// The per-response-token values `field` of the rows packed as `batch`, as `[n, R]` (`R` the
/// longest response, zeros past each row's values), on the batch's device.
pub fn per_token(batch: &LearnerBatch, rows: &[&Row], field: impl Fn(&Row) -> &[f32]) -> Tensor<2> {
    let r = batch.response_len();
    t2(batch.device(), aligned(rows, r, field), rows.len(), r)
}

/// The per-response-token values `field` of `rows` as a row-major `[rows, width]` host array,
/// zeros past each row's values.
pub(crate) fn aligned(rows: &[&Row], width: usize, field: impl Fn(&Row) -> &[f32]) -> Vec<f32> {
    let mut vals = vec![0.0f32; rows.len() * width];
    for (k, row) in rows.iter().enumerate() {
        let f = field(row);
        vals[k * width..k * width + f.len()].copy_from_slice(f);
    }
    vals
}

/// `v` as a `[b, t]` tensor on `device`.
pub(crate) fn t2(device: &Device, v: Vec<f32>, b: usize, t: usize) -> Tensor<2> {
    Tensor::from_data(TensorData::new(v, [b, t]), device)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use rlft_rollout::{Example, FinishReason, Prompt};

    /// A scored trajectory of reward 1 whose response tokens were sampled by `versions`.
    pub(crate) fn trajectory(versions: Vec<u64>, loss_mask: Vec<u8>) -> Trajectory {
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

    fn group(trajectories: Vec<Trajectory>) -> Group {
        Group {
            example: Example {
                prompt: Prompt::Text(String::new()),
                answer: String::new(),
                alternatives: Vec::new(),
                completion: None,
                metadata: serde_json::Value::Null,
            },
            trajectories,
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

    /// Rows keep their group and shaped reward, leave failed rewards out, and lay out for the
    /// advantages and the learner with the longest response as the width.
    #[test]
    fn groups_become_rows_laid_out_for_advantages_and_the_learner() {
        let mut failed = trajectory(vec![0; 2], vec![1, 1]);
        failed.reward = None;
        let mut long = trajectory(vec![0; 4], vec![1, 1, 1, 1]);
        long.reward = Some(0.0);
        long.truncated = true;
        let groups = [
            group(vec![trajectory(vec![0; 2], vec![1, 1]), failed]),
            group(vec![long]),
        ];
        let opts = RowOptions {
            overlong: Some(OverlongPenalty::new(4, 2, 1.0).unwrap()),
            overlong_filter: true,
            ..RowOptions::default()
        };
        let mut rows = Rows::from_groups(&groups, &opts);
        assert_eq!(rows.group_ids, [0, 1]);
        // 4 generated tokens of at most 4 with a 2-token cache: the full penalty.
        assert_eq!(rows.rewards, [1.0, -1.0]);
        assert_eq!(rows.rows[1].score, -1.0);
        assert_eq!(
            rows.rows[1].mask, [0.0; 4],
            "the truncated row trains nothing"
        );
        assert_eq!((rows.width(), rows.trained_tokens()), (4, 2));
        let device = Device::flex();
        let input = rows.advantage_input(&device, None, false).unwrap();
        assert_eq!(
            crate::host(input.token_rewards),
            [0., 1., 0., 0., 0., 0., 0., 0.]
        );
        assert_eq!(input.group_index, Some(vec![0, 1]));
        let out = AdvantageOutput {
            advantages: t2(&device, (0..8).map(|x| x as f32).collect(), 2, 4),
            returns: t2(&device, vec![0.0; 8], 2, 4),
        };
        rows.set_advantages(out, false);
        assert_eq!(
            (&rows.rows[0].adv[..], &rows.rows[1].adv[..]),
            (&[0., 1.][..], &[4., 5., 6., 7.][..])
        );
        assert!(rows.rows[0].returns.is_none());
        let refs = rows.refs();
        let packing = Packing {
            micro_batch_size: 1,
            ..Packing::new(0)
        };
        assert_eq!(
            packing.micro_batches(&[0, 1], &rows.rows),
            [vec![0], vec![1]]
        );
        let batch = packing.pack(&refs, &device);
        let adv = per_token(&batch, &refs, |r| &r.adv);
        assert_eq!(adv.dims(), [2, 4]);
        assert_eq!(crate::host(adv), [0., 1., 0., 0., 4., 5., 6., 7.]);
    }
}
