//! The rollout engine: G samples per prompt, multi-turn environments, rewards; the
//! [`Trajectory`] and [`Group`] types shared with the trainer.

use crate::dataset::Example;
use crate::env::{EnvStep, Environment};
use crate::generator::{Generated, Generator, InProcess};
use crate::reward::{RewardInput, RewardOutcome, RewardSet};
use crate::sampler::{FinishReason, SamplingConfig, Updates};
use crate::{Result, RolloutError};
use burn::config::Config;
use rlft_algo::seed::spread;
use rlft_model::{Tokenizer, Transformer};
use serde::{Deserialize, Serialize};

/// Rollout settings.
#[derive(Config, Debug, PartialEq)]
pub struct RolloutConfig {
    /// Responses per prompt (G).
    #[config(default = 8)]
    pub group_size: usize,
    /// Prompts longer than this (in tokens) are skipped and counted, never truncated.
    #[config(default = 512)]
    pub max_prompt_len: usize,
    /// Most model turns per episode (multi-turn environments).
    #[config(default = 4)]
    pub max_turns: usize,
    /// Most response tokens per episode, model and observation tokens together.
    #[config(default = 256)]
    pub max_total_tokens: usize,
    /// Sampling settings (`max_new_tokens` is per turn).
    pub sampling: SamplingConfig,
}

/// One episode: the prompt, everything after it, and what the learner needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Trajectory {
    /// Prompt token ids.
    pub prompt_ids: Vec<u32>,
    /// Response token ids: model turns and tool observations in order.
    pub response_ids: Vec<u32>,
    /// 1 for model-generated tokens (trained on), 0 for observation tokens.
    pub loss_mask: Vec<u8>,
    /// `log μ` of each model token (0 for observations): under the distribution it was drawn
    /// from, filtered and renormalised when top-k / min-p / top-p are on.
    pub behaviour_logprobs: Vec<f32>,
    /// Σ over its model tokens of `log S`, the log of the probability mass the sampling filters
    /// kept (0 without filters; [`crate::Draw::log_kept_mass`]), summed in f64.
    #[serde(default)]
    pub filter_log_mass: f64,
    /// With [`SamplingConfig::kept_ids_max`] > 0, the sampling mask of each response token
    /// ([`crate::Draw::kept_ids`]; `None` for observations and overflowed kept sets); empty
    /// otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kept_ids: Vec<Option<Vec<u32>>>,
    /// A mixture of experts' routing of `prompt_ids + response_ids` as the sampler forwarded
    /// them (the last token, never forwarded, has none); `None` for a dense model. Router
    /// replay forces these experts in the learner's passes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing: Option<rlft_model::TokenRouting>,
    /// The oldest policy version among its tokens (the version that sampled it, unless new
    /// weights reached the generation midway: [`Trajectory::token_versions`]).
    pub version: u64,
    /// The policy version that sampled each response token (observation tokens: the version
    /// current when they were appended).
    #[serde(default)]
    pub token_versions: Vec<u64>,
    /// Why the last turn ended.
    pub finish_reason: FinishReason,
    /// Cut off by a length limit.
    pub truncated: bool,
    /// Total reward; `None` when the reward failed (excluded from the loss).
    pub reward: Option<f64>,
    /// Unweighted reward terms.
    pub reward_terms: Vec<(String, f64)>,
    /// Why the reward failed, if it did.
    pub reward_error: Option<String>,
    /// Index of its group in the batch.
    pub group_id: usize,
    /// Decoded response (observations included).
    pub completion: String,
    /// Model turns taken.
    pub turns: usize,
}

impl Trajectory {
    /// Number of model-generated tokens.
    pub fn generated_len(&self) -> usize {
        self.loss_mask.iter().filter(|&&m| m == 1).count()
    }

    /// Model-generated tokens without a recorded sampling mask ([`Trajectory::kept_ids`]): all
    /// of them when none was recorded, else those whose kept set overflowed.
    pub fn sampling_mask_overflow(&self) -> usize {
        self.loss_mask
            .iter()
            .enumerate()
            .filter(|&(j, &m)| m == 1 && !matches!(self.kept_ids.get(j), Some(Some(_))))
            .count()
    }

    /// The policy version that sampled each model-generated token (observations left out).
    pub fn model_versions(&self) -> impl Iterator<Item = u64> + '_ {
        self.token_versions
            .iter()
            .zip(&self.loss_mask)
            .filter(|(_, m)| **m == 1)
            .map(|(v, _)| *v)
    }
}

/// The G trajectories of one prompt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Group {
    /// The example they answer.
    pub example: Example,
    /// The responses.
    pub trajectories: Vec<Trajectory>,
}

impl Group {
    /// Rewards of the scored trajectories.
    pub fn rewards(&self) -> Vec<f64> {
        self.trajectories.iter().filter_map(|t| t.reward).collect()
    }

    /// The oldest policy version among its tokens (`None` for an empty group): what its
    /// staleness is counted from.
    pub fn oldest_version(&self) -> Option<u64> {
        self.trajectories.iter().map(|t| t.version).min()
    }
}

/// A batch of groups and what happened on the way.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RolloutBatch {
    /// One group per kept prompt.
    pub groups: Vec<Group>,
    /// Prompts skipped for exceeding `max_prompt_len`.
    pub skipped_prompts: usize,
    /// Trajectories whose reward failed (timeouts included).
    pub failed_rewards: usize,
    /// Trajectories whose reward ran past its deadline (also in `failed_rewards`).
    #[serde(default)]
    pub timed_out_rewards: usize,
    /// Model tokens generated.
    pub generated_tokens: usize,
    /// Wall time spent generating (model turns and environment steps).
    pub generate_seconds: f64,
    /// Wall time spent scoring the finished trajectories with the reward functions.
    pub score_seconds: f64,
}

struct Episode {
    group: usize,
    context: Vec<u32>,
    prompt_len: usize,
    loss_mask: Vec<u8>,
    logprobs: Vec<f32>,
    /// Σ log S over the model's tokens.
    filter_log_mass: f64,
    /// Each response token's sampling mask, when recorded.
    kept_ids: Vec<Option<Vec<u32>>>,
    /// The routing of the context, from the latest model turn.
    routing: Option<rlft_model::TokenRouting>,
    versions: Vec<u64>,
    finish: FinishReason,
    truncated: bool,
    done: bool,
    turns: usize,
    turn_start: usize,
    /// What the environment keeps across the episode's turns.
    state: serde_json::Value,
}

impl Episode {
    /// A new episode of group `group` on the prompt `ids`.
    fn new(group: usize, ids: &[u32]) -> Self {
        Self {
            group,
            prompt_len: ids.len(),
            context: ids.to_vec(),
            loss_mask: Vec::new(),
            logprobs: Vec::new(),
            filter_log_mass: 0.0,
            kept_ids: Vec::new(),
            routing: None,
            versions: Vec::new(),
            finish: FinishReason::Length,
            truncated: false,
            done: false,
            turns: 0,
            turn_start: ids.len(),
            state: serde_json::Value::Null,
        }
    }

    /// The finished episode as a trajectory with its reward `outcome` (a failed or timed-out
    /// reward counted in `batch`); `version` when no model token has one.
    fn into_trajectory(
        self,
        outcome: RewardOutcome,
        completion: String,
        version: u64,
        batch: &mut RolloutBatch,
    ) -> Trajectory {
        let (reward, reward_terms, reward_error) = match outcome {
            RewardOutcome::Scored { total, terms } => (Some(total), terms, None),
            RewardOutcome::Failed(why) => {
                batch.failed_rewards += 1;
                (None, Vec::new(), Some(why))
            }
            RewardOutcome::TimedOut(why) => {
                batch.failed_rewards += 1;
                batch.timed_out_rewards += 1;
                (None, Vec::new(), Some(why))
            }
        };
        // The oldest version among the model's tokens.
        let oldest = self
            .versions
            .iter()
            .zip(&self.loss_mask)
            .filter(|(_, m)| **m == 1)
            .map(|(v, _)| *v)
            .min()
            .unwrap_or(version);
        Trajectory {
            prompt_ids: self.context[..self.prompt_len].to_vec(),
            response_ids: self.context[self.prompt_len..].to_vec(),
            loss_mask: self.loss_mask,
            behaviour_logprobs: self.logprobs,
            filter_log_mass: self.filter_log_mass,
            kept_ids: self.kept_ids,
            routing: self.routing,
            version: oldest,
            token_versions: self.versions,
            finish_reason: self.finish,
            truncated: self.truncated,
            reward,
            reward_terms,
            reward_error,
            group_id: self.group,
            completion,
            turns: self.turns,
        }
    }
}

/// What a rollout samples with and scores by, besides the policy: the tokenizer, the
/// environment between turns, the reward terms and the settings.
#[derive(Clone, Copy)]
pub struct RolloutSetup<'a> {
    /// The policy's tokenizer.
    pub tokenizer: &'a Tokenizer,
    /// The environment (single-turn, tools, a task's own).
    pub env: &'a dyn Environment,
    /// The reward terms.
    pub rewards: &'a RewardSet,
    /// Group size, turns, token budgets, sampling.
    pub cfg: &'a RolloutConfig,
}

/// Generates G responses for each example, runs the environment between turns and scores the
/// results. `version` stamps the trajectories; `seed` makes the batch reproducible.
///
/// # Errors
///
/// A bad setting or prompt, a tokenizer error, or [`RolloutError::WorkersStuck`] when every
/// reward or tool worker is stuck in a function that never returns.
pub fn rollout(
    model: &Transformer,
    setup: RolloutSetup<'_>,
    examples: &[Example],
    version: u64,
    seed: u64,
) -> Result<RolloutBatch> {
    rollout_updating(model, setup, examples, version, seed, None)
}

/// As [`rollout`], with interruptible generation: `poll` is asked for new weights before every
/// decode step ([`crate::Sampler::generate_updating`]); the episodes go on with the newest weights
/// (later turns too), and each trajectory records the version of every token
/// ([`Trajectory::token_versions`]) with `version` the oldest of them.
///
/// # Errors
/// As [`rollout`].
pub fn rollout_updating(
    model: &Transformer,
    setup: RolloutSetup<'_>,
    examples: &[Example],
    version: u64,
    seed: u64,
    updates: Option<&mut Updates<'_>>,
) -> Result<RolloutBatch> {
    let mut generator = InProcess::new(model, setup.tokenizer, version, updates);
    rollout_with(&mut generator, setup, examples, version, seed)
}

/// As [`rollout`], with every sampler call made by `generator` (in this process or on an
/// inference server): the calls — rows, settings, seeds — are those [`rollout`] makes, so a
/// generator that computes them as the sampler does yields the same batch. Each trajectory
/// records the version of every token the generator reports, with `version` (the weights the
/// batch starts on) for an episode without model tokens.
///
/// # Errors
/// As [`rollout`], and the generator's own errors.
pub fn rollout_with(
    generator: &mut dyn Generator,
    RolloutSetup {
        tokenizer,
        env,
        rewards,
        cfg,
    }: RolloutSetup<'_>,
    examples: &[Example],
    version: u64,
    seed: u64,
) -> Result<RolloutBatch> {
    if cfg.group_size == 0 {
        return Err(RolloutError::Config("group_size must be at least 1".into()));
    }
    let mut batch = RolloutBatch::default();
    let mut run = Episodes::start(tokenizer, cfg, examples, &mut batch)?;
    let mut stop_strings = cfg.sampling.stop_strings.clone();
    stop_strings.extend(env.stop_strings());
    let start = std::time::Instant::now();
    for turn in 0..cfg.max_turns.max(1) {
        if run.list.iter().all(|e| e.done) {
            break;
        }
        let call = ModelTurn {
            cfg,
            stop_strings: &stop_strings,
            seed,
            turn,
        };
        run.sample(generator, &call, &mut batch)?;
        // The environment answers every row that stopped on a stop string.
        run.observe(tokenizer, env, &call, generator.version())?;
    }
    batch.generate_seconds = start.elapsed().as_secs_f64();
    batch.groups = run.score(tokenizer, rewards, version, &mut batch)?;
    Ok(batch)
}

/// One model turn's sampler settings.
struct ModelTurn<'a> {
    cfg: &'a RolloutConfig,
    /// The recipe's stop strings and the environment's.
    stop_strings: &'a [String],
    seed: u64,
    turn: usize,
}

/// A batch's episodes under way, and the examples they answer (one group per example).
struct Episodes {
    kept: Vec<Example>,
    list: Vec<Episode>,
}

impl Episodes {
    /// `group_size` episodes per example whose rendered prompt fits `max_prompt_len` (the
    /// others are counted as skipped in `batch`).
    fn start(
        tokenizer: &Tokenizer,
        cfg: &RolloutConfig,
        examples: &[Example],
        batch: &mut RolloutBatch,
    ) -> Result<Self> {
        let mut kept = Vec::new();
        let mut list = Vec::new();
        for ex in examples {
            let text = ex.prompt.render(tokenizer)?;
            if tokenizer.surely_longer_than(text.len(), cfg.max_prompt_len) {
                batch.skipped_prompts += 1;
                continue;
            }
            let ids = tokenizer.encode(&text)?;
            if ids.is_empty() || ids.len() > cfg.max_prompt_len {
                batch.skipped_prompts += 1;
                continue;
            }
            for _ in 0..cfg.group_size {
                list.push(Episode::new(kept.len(), &ids));
            }
            kept.push(ex.clone());
        }
        Ok(Self { kept, list })
    }

    /// The model's turn: every unfinished episode continued by `generator`, episodes with the
    /// same remaining budget in one call (budgets differ after observations).
    fn sample(
        &mut self,
        generator: &mut dyn Generator,
        call: &ModelTurn<'_>,
        batch: &mut RolloutBatch,
    ) -> Result<()> {
        let (cfg, episodes) = (call.cfg, &mut self.list);
        let record_kept = cfg.sampling.kept_ids_max > 0;
        let mut by_budget: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
        for i in (0..episodes.len()).filter(|&i| !episodes[i].done) {
            let used = episodes[i].context.len() - episodes[i].prompt_len;
            let budget = cfg
                .sampling
                .max_new_tokens
                .min(cfg.max_total_tokens.saturating_sub(used));
            by_budget.entry(budget).or_default().push(i);
        }
        for (budget, rows) in by_budget {
            if budget == 0 {
                for i in rows {
                    episodes[i].done = true;
                    episodes[i].truncated = true;
                    episodes[i].finish = FinishReason::Length;
                }
                continue;
            }
            let prompts: Vec<Vec<u32>> =
                rows.iter().map(|&i| episodes[i].context.clone()).collect();
            let groups: Vec<usize> = rows.iter().map(|&i| episodes[i].group).collect();
            let scfg = cfg
                .sampling
                .clone()
                .with_max_new_tokens(budget)
                .with_stop_strings(call.stop_strings.to_vec())
                .with_seed(spread(call.seed) ^ (call.turn as u64) << 48 ^ budget as u64);
            let Generated {
                completions: out,
                versions,
            } = generator.generate(&prompts, &groups, &scfg)?;
            if out.len() != rows.len() || versions.len() != rows.len() {
                return Err(RolloutError::Input(format!(
                    "the generator answered {} completions with {} version lists for {} rows",
                    out.len(),
                    versions.len(),
                    rows.len()
                )));
            }
            for ((&i, c), v) in rows.iter().zip(out).zip(versions) {
                let e = &mut episodes[i];
                e.versions.extend(v);
                batch.generated_tokens += c.tokens.len();
                e.turn_start = e.context.len();
                e.context.extend(&c.tokens);
                e.loss_mask.extend(std::iter::repeat_n(1u8, c.tokens.len()));
                e.logprobs.extend(&c.logprobs);
                e.filter_log_mass += c.log_kept_mass.iter().map(|&m| f64::from(m)).sum::<f64>();
                if record_kept {
                    e.kept_ids.extend(c.kept_ids);
                    let n = e.context.len() - e.prompt_len;
                    e.kept_ids.resize(n, None);
                }
                if c.routing.is_some() {
                    e.routing = c.routing;
                }
                e.turns += 1;
                e.finish = c.finish_reason;
                e.truncated = c.finish_reason == FinishReason::Length;
                e.done = c.finish_reason != FinishReason::Stop;
            }
        }
        Ok(())
    }

    /// The environment's turn: each episode that stopped on a stop string gets its answer
    /// (an observation, appended untrained with `version`, or the end of the episode).
    fn observe(
        &mut self,
        tokenizer: &Tokenizer,
        env: &dyn Environment,
        call: &ModelTurn<'_>,
        version: u64,
    ) -> Result<()> {
        let cfg = call.cfg;
        let record_kept = cfg.sampling.kept_ids_max > 0;
        for e in self.list.iter_mut().filter(|e| !e.done) {
            let turn_text = tokenizer.decode(&e.context[e.turn_start..], false)?;
            match env.step_in_episode(&self.kept[e.group], &turn_text, &mut e.state)? {
                EnvStep::Done => e.done = true,
                EnvStep::Observation(_) if call.turn + 1 == cfg.max_turns => {
                    // Out of turns: the model wanted to go on.
                    e.done = true;
                    e.truncated = true;
                    e.finish = FinishReason::Length;
                }
                EnvStep::Observation(text) => {
                    let obs = tokenizer.encode(&text)?;
                    let used = e.context.len() - e.prompt_len;
                    let room = cfg.max_total_tokens.saturating_sub(used);
                    let n = obs.len().min(room);
                    e.context.extend(&obs[..n]);
                    e.versions.extend(std::iter::repeat_n(version, n));
                    e.loss_mask.extend(std::iter::repeat_n(0u8, n));
                    e.logprobs.extend(std::iter::repeat_n(0.0f32, n));
                    if record_kept {
                        e.kept_ids.extend(std::iter::repeat_n(None, n));
                    }
                    if n < obs.len() {
                        e.done = true;
                        e.truncated = true;
                        e.finish = FinishReason::Length;
                    }
                }
            }
        }
        Ok(())
    }

    /// The finished episodes scored by `rewards` and grouped by example; an episode without
    /// model tokens is of `version`.
    fn score(
        self,
        tokenizer: &Tokenizer,
        rewards: &RewardSet,
        version: u64,
        batch: &mut RolloutBatch,
    ) -> Result<Vec<Group>> {
        let Self {
            kept,
            list: episodes,
        } = self;
        let start = std::time::Instant::now();
        let inputs = episodes
            .iter()
            .map(|e| {
                let ex = &kept[e.group];
                Ok(RewardInput {
                    prompt: ex.prompt.user_text().to_string(),
                    completion: tokenizer.decode(&e.context[e.prompt_len..], true)?,
                    answer: ex.answer.clone(),
                    alternatives: ex.alternatives.clone(),
                    metadata: ex.metadata.clone(),
                    response_len: e.loss_mask.iter().filter(|&&m| m == 1).count(),
                    truncated: e.truncated,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let completions: Vec<String> = inputs.iter().map(|i| i.completion.clone()).collect();
        let outcomes = rewards.score(inputs)?;
        batch.score_seconds = start.elapsed().as_secs_f64();
        let mut groups: Vec<Group> = kept
            .into_iter()
            .map(|example| Group {
                example,
                trajectories: Vec::new(),
            })
            .collect();
        for ((e, outcome), completion) in episodes.into_iter().zip(outcomes).zip(completions) {
            let group = e.group;
            let trajectory = e.into_trajectory(outcome, completion, version, batch);
            groups[group].trajectories.push(trajectory);
        }
        Ok(groups)
    }
}
