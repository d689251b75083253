//! The synchronous RL loop.
//!
//! Per step: sample prompts → G rollouts each (policy version = step) → rewards (+ DAPO overlong
//! shaping) → DAPO dynamic sampling → π_old log-probs where the correction mode needs them
//! ([`crate::correction`]; μ is kept either way) → reference log-probs → advantages → the
//! decoupled correction against μ → `ppo_epochs` × `mini_batches` optimiser steps, each
//! accumulating micro-batch gradients under global token normalisation (bypass corrects each
//! micro-batch) → metrics, eval, checkpoint. Every random choice is a function of
//! `(seed, step)`, so a resumed run repeats an uninterrupted one exactly.

use crate::algorithm::{Extensions, ResolvedAlgorithm, resolve_algorithm};
use crate::checkpoint::{self, TrainerState};
use crate::correction::CorrectionMode;
use crate::learn::{aligned, t2};
use crate::metrics::StepMetrics;
use crate::offpolicy::StepDiagnostics;
use crate::optim::FusedAdamWConfig;
use crate::recipe::{KlPlacement, Recipe};
use crate::staleness::{AsyncMode, Snapshots, staleness_metrics};
use crate::{Result, TrainError, host, io_err};
use burn::module::Module;
use burn::optim::ModuleOptimizer;
use burn::tensor::{DType, Device};
use rlft_algo::advantage::AdvantageInput;
use rlft_algo::kl::{KlEstimator, kl_penalty};
use rlft_algo::loss::LossRegistry;
use rlft_algo::shaping::OverlongPenalty;
use rlft_model::{LoraConfig, Pretrained, Tokenizer, Transformer, TransformerConfig, ValueModel};
use rlft_rollout::{
    DataCursor, DataLoader, Dataset, Environment, Example, Group, RewardSet, RolloutConfig,
    SamplingConfig, Split, Task, TaskKind, Trajectory, rollout,
};
use serde_json::json;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// A number in [0, 1) that depends only on `seed` and `index` (SplitMix64's finaliser).
pub(crate) fn unit_hash(seed: u64, index: u64) -> f64 {
    let mut z = seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) as f64 / 18_446_744_073_709_551_616.0
}

/// The logits one chunk of the learner's output head may hold when
/// `algorithm.logits_chunk_tokens` is 0 (auto).
pub const LOGITS_CHUNK_BYTES: usize = 1 << 30;

/// Skipped (NaN/Inf) steps in a row that stop the run.
pub const MAX_BAD_STEPS_IN_ROW: usize = 3;

/// What one step's rollouts produced.
#[derive(Default)]
struct Collected {
    groups: Vec<Group>,
    /// Zero-spread groups dropped by dynamic sampling.
    filtered: usize,
    /// Trajectories whose reward failed.
    failed: usize,
    /// Of those, rewards past their deadline.
    timeouts: usize,
    /// Prompts skipped: empty, or longer than `rollout.max_prompt_len`.
    skipped_prompts: usize,
    /// Generated tokens.
    tokens: usize,
    generate_secs: f64,
    /// Reward scoring.
    score_secs: f64,
}

/// One trajectory prepared for the learner (host vectors over its response tokens).
pub(crate) struct Row {
    pub(crate) ids: Vec<i64>,
    pub(crate) prompt_len: usize,
    pub(crate) mask: Vec<f32>,
    /// The ratio's anchor: μ, π_old or π_prox (see [`OffPolicy`]).
    pub(crate) old_lp: Vec<f32>,
    /// μ: the behaviour log-probs the sampler recorded.
    pub(crate) behaviour_lp: Vec<f32>,
    /// Decoupled mode: IS weights of π_prox against μ.
    pub(crate) is_w: Option<Vec<f32>>,
    pub(crate) ref_lp: Option<Vec<f32>>,
    pub(crate) adv: Vec<f32>,
    pub(crate) old_values: Option<Vec<f32>>,
    pub(crate) returns: Option<Vec<f32>>,
}

impl Row {
    fn resp_len(&self) -> usize {
        self.mask.len()
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
            is_w: None,
            ref_lp: None,
            adv: vec![0.0; n],
            old_values: None,
            returns: None,
        }
    }
}

/// A trainer built from a recipe.
pub struct Trainer {
    pub(crate) recipe: Recipe,
    pub(crate) device: Device,
    pub(crate) plain: Device,
    /// The policy (on the autodiff device); `None` only while an optimizer step holds it, so
    /// that its parameters are updated in place ([`Trainer::policy`]).
    pub(crate) policy: Option<Transformer>,
    pub(crate) critic: Option<ValueModel>,
    pub(crate) reference: Option<Transformer>,
    /// The tokenizer.
    pub tokenizer: Tokenizer,
    pub(crate) config: TransformerConfig,
    pub(crate) optim: ModuleOptimizer,
    pub(crate) critic_optim: Option<ModuleOptimizer>,
    pub(crate) task: Task,
    pub(crate) env: Arc<dyn Environment>,
    pub(crate) rewards: RewardSet,
    pub(crate) train_set: Dataset,
    pub(crate) eval_set: Vec<Example>,
    pub(crate) loader: DataLoader,
    pub(crate) algo: ResolvedAlgorithm,
    pub(crate) registry: LossRegistry,
    pub(crate) state: TrainerState,
    /// The warm-up's optimiser, while the warm-up runs.
    pub(crate) sft_optim: Option<ModuleOptimizer>,
    /// A checkpoint was loaded (its logs are cut back to it, not started afresh).
    pub(crate) resumed: bool,
    /// Lagged mode: the policies of the last `async.lag + 1` versions.
    pub(crate) snapshots: Option<Snapshots>,
}

/// AdamW with the recipe's settings (gradient clipping is done by the trainer, which also
/// needs the norm for metrics and NaN checks).
pub(crate) fn adamw(o: &crate::recipe::OptimizerSection) -> ModuleOptimizer {
    FusedAdamWConfig::new()
        .with_beta_1(o.beta1 as f32)
        .with_beta_2(o.beta2 as f32)
        .with_epsilon(o.eps as f32)
        .with_weight_decay(o.weight_decay as f32)
        .init()
}

impl Trainer {
    /// The policy (on the autodiff device).
    pub fn policy(&self) -> &Transformer {
        self.policy
            .as_ref()
            .expect("the policy is only moved out during an optimizer step")
    }

    /// The run folder: the recipe's `output_dir`, or the folder a resumed run continues in.
    pub fn output_dir(&self) -> &Path {
        &self.recipe.output_dir
    }

    /// Moves the policy out for an optimizer step, which puts the result back: while nothing else
    /// holds its parameters, [`crate::optim::FusedAdamW`] updates them where they lie.
    pub(crate) fn take_policy(&mut self) -> Transformer {
        self.policy
            .take()
            .expect("the policy is only moved out during an optimizer step")
    }

    /// Builds everything a recipe describes (model, reference, critic, task, data), and loads
    /// the checkpoint at `resume` if given. The recipe was validated when loaded.
    ///
    /// `resume` is a run folder or one of its checkpoints ([`checkpoint::resume_from`]); a run
    /// folder with no checkpoint yet starts again from the beginning. The run goes on writing
    /// into that run folder, and `recipe` must equal the run's stored recipe but for the keys
    /// [`Recipe::check_resume`] allows to change.
    ///
    /// # Errors
    /// A bad recipe, a model that cannot be loaded, an `output_dir` that holds another run (pass
    /// it as `resume`), or a checkpoint that does not fit the recipe.
    pub fn new(recipe: Recipe, resume: Option<&Path>) -> Result<Self> {
        Self::with_extensions(recipe, resume, Extensions::default())
    }

    /// As [`Trainer::new`], with custom losses and reward terms.
    pub fn with_extensions(
        mut recipe: Recipe,
        resume: Option<&Path>,
        ext: Extensions,
    ) -> Result<Self> {
        recipe.validate_with(&ext.registry)?;
        let resume = resume.map(checkpoint::resume_from).transpose()?;
        if let Some(r) = &resume {
            recipe.check_resume(&Recipe::from_stored(&r.stored_recipe()?)?)?;
            recipe.output_dir = r.run_dir();
        }
        let algo = resolve_algorithm(&recipe, &ext.registry)?;
        let plain = rlft_algo::device::resolve(Some(&recipe.device))?;
        let device = plain.clone().autodiff();
        device.seed(recipe.seed);
        let out = &recipe.output_dir;
        if resume.is_none()
            && out.exists()
            && std::fs::read_dir(out)
                .map_err(io_err(out))?
                .next()
                .is_some()
        {
            return Err(TrainError::Recipe(format!(
                "output_dir {} exists and is not empty; choose another output_dir, or continue \
                 that run with --resume {}",
                out.display(),
                out.display()
            )));
        }
        let stored = recipe.to_toml()?;
        let (policy, tokenizer, config) = if recipe.model.path.is_empty() {
            let tokenizer = Tokenizer::byte_level();
            let s = &recipe.model.scratch;
            let config = TransformerConfig::new(
                tokenizer.vocab_size(),
                s.hidden_size,
                s.intermediate_size,
                s.layers,
                s.heads,
                s.kv_heads,
                s.hidden_size / s.heads,
            )
            .with_tie_word_embeddings(true)
            .with_max_position_embeddings(1024);
            (config.init_seeded(&device, recipe.seed), tokenizer, config)
        } else {
            let p = Pretrained::load(Path::new(&recipe.model.path), &device, DType::F32)?;
            (p.model, p.tokenizer, p.config)
        };
        let policy = if recipe.model.lora.rank > 0 {
            let l = &recipe.model.lora;
            policy.with_lora(
                &LoraConfig::new(l.rank, l.alpha).with_target_modules(l.target_modules.clone()),
            )?
        } else {
            policy
        };
        let reference = (recipe.algorithm.kl_coef > 0.0).then(|| policy.reference_copy(&plain));
        let critic = recipe
            .model
            .critic
            .then(|| ValueModel::from_trunk(policy.clone(), &device));
        let mut task = Task::new(TaskKind::parse(&recipe.task.name)?, recipe.task.difficulty)?;
        task.ops = recipe
            .task
            .ops
            .iter()
            .filter_map(|o| o.chars().next())
            .collect();
        task.chat = recipe.task.chat;
        task.seed = recipe.seed;
        if task.chat && tokenizer.chat_template.is_none() {
            return Err(TrainError::Recipe(
                "task.chat = true but the model has no chat template".into(),
            ));
        }
        let train_set = if recipe.task.dataset.is_empty() {
            Dataset {
                examples: task.examples(Split::Train, 4096),
            }
        } else {
            Dataset::from_jsonl(Path::new(&recipe.task.dataset))?
        };
        let eval_set = task.examples(Split::Test, recipe.eval.size);
        // Created once everything it describes has loaded: bad input leaves nothing behind.
        let out = &recipe.output_dir;
        std::fs::create_dir_all(out).map_err(io_err(out))?;
        let mut state = TrainerState {
            step: 0,
            cursor: DataCursor::default(),
            skipped_steps: 0,
            bad_in_row: 0,
            sft_done: false,
            sft_step: 0,
            recipe: stored,
            kl_coef: None,
        };
        let mut trainer = Self {
            env: task.environment(),
            rewards: ext
                .rewards
                .iter()
                .fold(task.rewards(), |set, (w, r)| set.with_arc(*w, r.clone())),
            loader: DataLoader::new(train_set.len(), recipe.seed, DataCursor::default())?,
            optim: adamw(&recipe.optimizer),
            critic_optim: recipe.model.critic.then(|| adamw(&recipe.optimizer)),
            registry: ext.registry,
            recipe,
            device,
            plain,
            policy: Some(policy),
            critic,
            reference,
            tokenizer,
            config,
            task,
            train_set,
            eval_set,
            algo,
            state: state.clone(),
            sft_optim: None,
            resumed: false,
            snapshots: None,
        };
        if trainer.recipe.asynchrony.mode == AsyncMode::Lagged {
            let lag = trainer
                .recipe
                .asynchrony
                .lag()
                .map_err(TrainError::Recipe)?;
            trainer.snapshots = Some(Snapshots::new(lag));
        }
        if let Some(checkpoint::ResumeFrom::Checkpoint(dir)) = &resume {
            state = checkpoint::read_state(dir)?;
            state.recipe = trainer.state.recipe.clone();
            trainer.load_checkpoint(dir, state)?;
            checkpoint::adopt(&trainer.recipe.output_dir, dir)?;
        }
        // The effective recipe, beside the run's checkpoints: a run killed before its first
        // checkpoint resumes from it.
        crate::write_atomic(
            &trainer.recipe.output_dir.join(checkpoint::RECIPE_FILE),
            trainer.state.recipe.as_bytes(),
        )?;
        if trainer.recipe.rollout.top_k > 0
            || trainer.recipe.rollout.top_p < 1.0
            || trainer.recipe.rollout.min_p > 0.0
        {
            eprintln!(
                "warning: top_k/top_p/min_p filter the sampling distribution, so the behaviour \
                 log-probs μ are not the learner's tempered softmax; ratios are biased"
            );
        }
        Ok(trainer)
    }

    fn lr(&self, step: usize) -> f64 {
        self.recipe.schedule.lr(self.recipe.optimizer.lr, step)
    }

    fn sampling(&self) -> SamplingConfig {
        let r = &self.recipe.rollout;
        SamplingConfig::new()
            .with_temperature(r.temperature)
            .with_top_k(r.top_k)
            .with_top_p(r.top_p)
            .with_min_p(r.min_p)
            .with_max_new_tokens(r.max_new_tokens)
    }

    fn rollout_config(&self, group_size: usize, sampling: SamplingConfig) -> RolloutConfig {
        let r = &self.recipe.rollout;
        RolloutConfig::new(sampling)
            .with_group_size(group_size)
            .with_max_prompt_len(r.max_prompt_len)
            .with_max_turns(r.max_turns)
            .with_max_total_tokens(r.max_total_tokens)
    }

    /// Held-out greedy pass@1 and mean accuracy over `k` samples.
    pub(crate) fn evaluate(&self, step: usize) -> Result<(f64, f64)> {
        let model = self.policy().valid();
        let run = |group: usize, sampling: SamplingConfig| -> Result<f64> {
            let mut correct = 0.0;
            let mut n = 0.0;
            for chunk in self.eval_set.chunks(32) {
                let cfg = self.rollout_config(group, sampling.clone());
                let b = rollout(
                    &model,
                    &self.tokenizer,
                    chunk,
                    self.env.as_ref(),
                    &self.rewards,
                    &cfg,
                    step as u64,
                    self.recipe.seed ^ 0xE7A1 ^ (step as u64) << 20,
                )?;
                for t in b.groups.iter().flat_map(|g| &g.trajectories) {
                    n += 1.0;
                    correct += is_correct(t);
                }
            }
            Ok(if n > 0.0 { correct / n } else { 0.0 })
        };
        let greedy = run(1, self.sampling().with_temperature(0.0))?;
        let mean_k = run(self.recipe.eval.k.max(1), self.sampling())?;
        Ok((greedy, mean_k))
    }

    /// Runs one RL step — rollouts, rewards, advantages, the update — without evaluation,
    /// checkpointing or the SFT warm-up, and returns its metrics (the `metrics.jsonl` keys but
    /// `eval/*`). For trainers that drive the loop themselves; [`Trainer::run`] is the whole run.
    pub fn train_step(&mut self) -> Result<StepMetrics> {
        let step = self.state.step + 1;
        let m = self.step(step)?;
        self.state.step = step;
        Ok(m)
    }

    /// Collects one batch of groups: with dynamic sampling, zero-spread groups are dropped and
    /// more prompts are sampled, up to `max_gen_batches` rounds.
    fn collect(&mut self, step: usize) -> Result<Collected> {
        let r = self.recipe.rollout.clone();
        let a = self.recipe.algorithm.clone();
        // The weights that sample this step: the current ones, or in lagged mode those of
        // `async.lag` versions ago.
        let current = self.policy().valid();
        let (version, model) = match self.snapshots.as_mut() {
            Some(s) => {
                let (v, m) = s.sample_with(step as u64, current);
                (v, m.clone())
            }
            None => (step as u64, current),
        };
        let cfg = self.rollout_config(r.group_size, self.sampling());
        let mut c = Collected::default();
        let rounds = if a.dynamic_sampling {
            a.max_gen_batches
        } else {
            1
        };
        for round in 0..rounds {
            let need = r.prompts_per_step - c.groups.len();
            let idx = self.loader.next_indices(need);
            let examples: Vec<Example> = idx
                .iter()
                .map(|&i| self.train_set.examples[i].clone())
                .collect();
            let seed =
                self.recipe.seed.wrapping_mul(0x100_0000_01b3) ^ (step as u64) << 16 ^ round as u64;
            let b = rollout(
                &model,
                &self.tokenizer,
                &examples,
                self.env.as_ref(),
                &self.rewards,
                &cfg,
                version,
                seed,
            )?;
            c.failed += b.failed_rewards;
            c.timeouts += b.timed_out_rewards;
            c.skipped_prompts += b.skipped_prompts;
            c.tokens += b.generated_tokens;
            c.generate_secs += b.generate_seconds;
            c.score_secs += b.score_seconds;
            for g in b.groups {
                let rewards = g.rewards();
                let spread = rewards.iter().copied().fold(f64::NEG_INFINITY, f64::max)
                    - rewards.iter().copied().fold(f64::INFINITY, f64::min);
                if a.dynamic_sampling && (spread.is_nan() || spread <= 1e-9) {
                    c.filtered += 1;
                } else {
                    c.groups.push(g);
                }
            }
            if c.groups.len() >= r.prompts_per_step {
                break;
            }
        }
        Ok(c)
    }

    pub(crate) fn step(&mut self, step: usize) -> Result<StepMetrics> {
        let t0 = Instant::now();
        let Collected {
            groups,
            filtered,
            failed,
            timeouts,
            skipped_prompts,
            tokens: gen_tokens,
            generate_secs: gen_secs,
            score_secs,
        } = self.collect(step)?;
        crate::fault::point(|| format!("rollout:{step}"));
        let a = self.recipe.algorithm.clone();
        let r = self.recipe.rollout.clone();
        // Reward statistics over every scored trajectory (before shaping).
        let trajs: Vec<&Trajectory> = groups.iter().flat_map(|g| &g.trajectories).collect();
        // A group is stale when any of its tokens came from an older policy than the learner's.
        let stale = trajs.iter().any(|t| t.version < step as u64);
        // Each group's oldest policy version, for the staleness metrics.
        let oldest: Vec<u64> = groups
            .iter()
            .map(|g| {
                g.trajectories
                    .iter()
                    .map(|t| t.version)
                    .min()
                    .unwrap_or(step as u64)
            })
            .collect();
        let beta = self.beta();
        if a.kl_placement == KlPlacement::Loss {
            self.algo.config.kl_coef = beta;
        }
        // Clip-Cov's draws: fresh each step, a function of (seed, step) like every random choice.
        self.algo.config.clip_cov_seed =
            self.recipe.seed ^ (step as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mut diag = StepDiagnostics::default();
        let scored: Vec<f64> = trajs.iter().filter_map(|t| t.reward).collect();
        let (mean, std) = mean_std(&scored);
        let acc = if trajs.is_empty() {
            0.0
        } else {
            trajs.iter().map(|t| is_correct(t)).sum::<f64>() / trajs.len() as f64
        };
        let lens: Vec<f64> = trajs.iter().map(|t| t.generated_len() as f64).collect();
        let overlong = (a.overlong_cache_len > 0)
            .then(|| {
                OverlongPenalty::new(r.max_new_tokens, a.overlong_cache_len, a.overlong_factor)
            })
            .transpose()?;
        // Learner rows: scored trajectories only.
        let mut rows = Vec::new();
        let mut group_ids = Vec::new();
        let mut rewards = Vec::new();
        for (gi, g) in groups.iter().enumerate() {
            for t in g.trajectories.iter().filter(|t| t.reward.is_some()) {
                let mut reward = t.reward.unwrap_or(0.0);
                if let Some(p) = &overlong {
                    reward += p.penalty(t.generated_len());
                }
                let filter = a.overlong_filter && t.truncated;
                rows.push(Row {
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
                        .map(|&m| if filter { 0.0 } else { f32::from(m) })
                        .collect(),
                    old_lp: t.behaviour_logprobs.clone(),
                    behaviour_lp: t.behaviour_logprobs.clone(),
                    is_w: None,
                    ref_lp: None,
                    adv: Vec::new(),
                    old_values: None,
                    returns: None,
                });
                group_ids.push(gi as u64);
                rewards.push(reward);
            }
        }
        let mut m = StepMetrics::new();
        m.insert("step".into(), json!(step));
        m.insert("reward/mean".into(), json!(mean));
        m.insert("reward/std".into(), json!(std));
        m.insert("accuracy".into(), json!(acc));
        m.insert("response_len/mean".into(), json!(mean_std(&lens).0));
        m.insert(
            "response_len/max".into(),
            json!(lens.iter().copied().fold(0.0, f64::max)),
        );
        m.insert("groups/filtered".into(), json!(filtered));
        m.insert("reward/failed".into(), json!(failed));
        m.insert("reward/timeouts".into(), json!(timeouts));
        m.insert("prompts/skipped".into(), json!(skipped_prompts));
        let eta = self.snapshots.as_ref().map_or(0, Snapshots::lag);
        for (k, v) in staleness_metrics(step as u64, &oldest, eta) {
            m.insert(k, json!(v));
        }
        let lr = self.lr(step - 1);
        m.insert("lr".into(), json!(lr));
        m.insert(
            "tokens_per_s".into(),
            json!(gen_tokens as f64 / gen_secs.max(1e-9)),
        );
        m.insert("time/generate_s".into(), json!(gen_secs));
        let t_score = Instant::now();
        if !rows.is_empty() {
            self.prepare(&mut rows, &group_ids, &rewards, stale, &mut diag)?;
        }
        m.insert(
            "time/score_s".into(),
            json!(score_secs + t_score.elapsed().as_secs_f64()),
        );
        let t_train = Instant::now();
        let stats = if rows.is_empty() {
            None
        } else {
            Some(self.update(&rows, lr, &mut diag)?)
        };
        let (clip_low, clip_high, kl, entropy, grad_norm, value_loss, bad) =
            stats.unwrap_or((0.0, 0.0, 0.0, 0.0, 0.0, None, false));
        if bad {
            self.state.skipped_steps += 1;
            self.state.bad_in_row += 1;
        } else {
            self.state.bad_in_row = 0;
        }
        diag.write(&mut m);
        if let Some(ctrl) = &mut self.algo.kl_control {
            // β for the next step from this step's KL, over this step's sequences (verl's rule).
            ctrl.value = beta;
            self.state.kl_coef = Some(ctrl.update(kl, rows.len()));
            m.insert("kl_coef".into(), json!(beta));
        }
        m.insert("clip_frac/low".into(), json!(clip_low));
        m.insert("clip_frac/high".into(), json!(clip_high));
        m.insert("kl".into(), json!(kl));
        m.insert("entropy".into(), json!(entropy));
        m.insert("grad_norm".into(), json!(grad_norm));
        if let Some(v) = value_loss {
            m.insert("value_loss".into(), json!(v));
        }
        m.insert("skipped_steps".into(), json!(self.state.skipped_steps));
        m.insert(
            "time/train_s".into(),
            json!(t_train.elapsed().as_secs_f64()),
        );
        m.insert("time/step_s".into(), json!(t0.elapsed().as_secs_f64()));
        Ok(m)
    }

    /// β of the KL term: the adaptive controller's current value, else `algorithm.kl_coef`.
    fn beta(&self) -> f64 {
        match &self.algo.kl_control {
            Some(c) => self.state.kl_coef.unwrap_or(c.value),
            None => self.recipe.algorithm.kl_coef,
        }
    }

    /// Fills π_old, π_ref, values and advantages for every row; corrects the batch against μ
    /// where the recipe asks (decoupled) and measures the gap (whenever π_old was computed).
    fn prepare(
        &mut self,
        rows: &mut [Row],
        group_ids: &[u64],
        rewards: &[f64],
        stale: bool,
        diag: &mut StepDiagnostics,
    ) -> Result<()> {
        let a = &self.recipe.algorithm;
        let temperature = self.recipe.rollout.temperature;
        let on_policy = a.ppo_epochs == 1 && a.mini_batches == 1;
        let old_pass = self.algo.offpolicy.needs_old_pass(on_policy, stale);
        let policy = self.policy().valid();
        let critic = self.critic.as_ref().map(|c| c.valid());
        let mut prox: Vec<Vec<f32>> = vec![Vec::new(); rows.len()];
        let mut prox_secs = 0.0;
        let all: Vec<usize> = (0..rows.len()).collect();
        let logits_chunk = self.logits_chunk();
        for chunk in self.micro_batches(&all, rows) {
            let chunk = &chunk[..];
            let refs: Vec<&Row> = chunk.iter().map(|&i| &rows[i]).collect();
            let ids = self.pack(&refs);
            // Frozen (`valid()`) models live on the plain device.
            let ids_plain = ids.to_device(&self.plain);
            if old_pass {
                let t0 = Instant::now();
                let lp =
                    host(ids_plain.logprobs_chunked(&policy, Some(temperature), logits_chunk)?);
                for (k, &i) in chunk.iter().enumerate() {
                    prox[i] = ids.unpack(&lp, k, rows[i].resp_len());
                }
                prox_secs += t0.elapsed().as_secs_f64();
            }
            if let Some(reference) = &self.reference {
                let lp =
                    host(ids_plain.logprobs_chunked(reference, Some(temperature), logits_chunk)?);
                for (k, &i) in chunk.iter().enumerate() {
                    rows[i].ref_lp = Some(ids.unpack(&lp, k, rows[i].resp_len()));
                }
            }
            if let Some(c) = &critic {
                let v = host(
                    ids_plain
                        .response(c.forward(&ids_plain.input()).unsqueeze_dim::<3>(2))
                        .squeeze_dim::<2>(2),
                );
                for (k, &i) in chunk.iter().enumerate() {
                    let values = ids.unpack(&v, k, rows[i].resp_len());
                    if values.iter().any(|x| !x.is_finite()) {
                        return Err(TrainError::Diverged(
                            "the critic's values are NaN/Inf (its weights diverged); start a new run \
                             with a lower optimizer.lr or algorithm.value_coef (a resumed run \
                             keeps its settings)"
                                .into(),
                        ));
                    }
                    rows[i].old_values = Some(values);
                }
            }
        }
        // The anchor (π_old, or μ for a cumulative ratio against the behaviour policy) is set
        // before the advantages, whose KL-in-reward reads it.
        if old_pass && !self.algo.offpolicy.anchors_at_behaviour() {
            for (row, p) in rows.iter_mut().zip(&prox) {
                row.old_lp.clone_from(p);
            }
        }
        // Advantages in the response-aligned layout [N, R_max].
        let beta = self.beta();
        let a = &self.recipe.algorithm;
        let n = rows.len();
        let rmax = rows.iter().map(Row::resp_len).max().unwrap_or(1).max(1);
        let mut tok_rewards = vec![0.0f32; n * rmax];
        let mut mask = vec![0.0f32; n * rmax];
        let mut values = vec![0.0f32; n * rmax];
        for (i, row) in rows.iter().enumerate() {
            let last = row.mask.iter().rposition(|&m| m > 0.0);
            if let Some(last) = last {
                tok_rewards[i * rmax + last] = rewards[i] as f32;
            }
            for (j, &mv) in row.mask.iter().enumerate() {
                mask[i * rmax + j] = mv;
                if let Some(v) = &row.old_values {
                    values[i * rmax + j] = v[j];
                }
            }
            if a.kl_placement == KlPlacement::Reward
                && beta > 0.0
                && let Some(r) = &row.ref_lp
            {
                let est: KlEstimator = a.kl_estimator.parse()?;
                let k = kl_penalty(
                    t2(&self.plain, row.old_lp.clone(), 1, row.resp_len()),
                    t2(&self.plain, r.clone(), 1, row.resp_len()),
                    est,
                    None,
                )?;
                for (j, kv) in host(k).iter().enumerate() {
                    tok_rewards[i * rmax + j] -= (beta as f32) * kv * row.mask[j];
                }
            }
        }
        let mut input = AdvantageInput::new(
            t2(&self.plain, tok_rewards, n, rmax),
            t2(&self.plain, mask, n, rmax),
        )
        .with_groups(group_ids.to_vec());
        if self.critic.is_some() {
            input = input.with_values(t2(&self.plain, values, n, rmax));
        }
        let out = self.algo.advantage.compute(&input)?;
        let adv = host(out.advantages);
        let ret = host(out.returns);
        for (i, row) in rows.iter_mut().enumerate() {
            let r = row.resp_len();
            row.adv = adv[i * rmax..i * rmax + r].to_vec();
            if self.critic.is_some() {
                row.returns = Some(ret[i * rmax..i * rmax + r].to_vec());
            }
        }
        // After the advantages: rejection masks the loss, it does not move an outcome reward.
        if old_pass {
            diag.prox_secs = Some(prox_secs);
            self.correct_rows(rows, &prox, diag)?;
        }
        Ok(())
    }

    /// With π_old (π_prox) computed for every row: measures its gap to μ over the step, and in
    /// decoupled mode corrects the batch (IS weights of π_prox against μ, rejection mask).
    fn correct_rows(
        &self,
        rows: &mut [Row],
        prox: &[Vec<f32>],
        diag: &mut StepDiagnostics,
    ) -> Result<()> {
        let off = &self.algo.offpolicy;
        let n = rows.len();
        let rmax = rows.iter().map(Row::resp_len).max().unwrap_or(1).max(1);
        let refs: Vec<&Row> = rows.iter().collect();
        let behaviour = aligned(&refs, rmax, |r| &r.behaviour_lp);
        let mask = aligned(&refs, rmax, |r| &r.mask);
        let mut train = vec![0.0f32; n * rmax];
        for (i, p) in prox.iter().enumerate() {
            train[i * rmax..i * rmax + p.len()].copy_from_slice(p);
        }
        let decoupled = off.mode == CorrectionMode::Decoupled;
        let none = Default::default();
        let config = if decoupled { &off.correction } else { &none };
        if mask.iter().any(|m| *m > 0.5) {
            let out = diag.correct(&train, &behaviour, &mask, [n, rmax], config)?;
            if decoupled {
                for (i, row) in rows.iter_mut().enumerate() {
                    let span = i * rmax..i * rmax + row.resp_len();
                    row.mask = out.mask[span.clone()].iter().map(|&m| m as f32).collect();
                    row.is_w = out
                        .weights
                        .as_ref()
                        .map(|w| w[span].iter().map(|&v| v as f32).collect());
                }
            }
        }
        Ok(())
    }
}

fn mean_std(v: &[f64]) -> (f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0);
    }
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
    (mean, var.sqrt())
}

/// 1 when the trajectory's `correct` reward term is 1.
fn is_correct(t: &Trajectory) -> f64 {
    t.reward_terms
        .iter()
        .find(|(n, _)| n == "correct")
        .map_or(0.0, |(_, v)| if *v >= 1.0 { 1.0 } else { 0.0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_hash_is_uniform_and_depends_on_the_seed() {
        let below = |seed| {
            (0..20_000u64)
                .filter(|&i| unit_hash(seed, i) < 0.75)
                .count()
        };
        for seed in [0, 7] {
            let share = below(seed) as f64 / 20_000.0;
            assert!((share - 0.75).abs() < 0.015, "seed {seed}: {share}");
        }
        assert_ne!(unit_hash(0, 5), unit_hash(1, 5));
        assert!((0..1000).all(|i| (0.0..1.0).contains(&unit_hash(3, i))));
    }
}
