//! The trainer: setup from a recipe, and one RL step through the stages.
//!
//! A step takes its batch from the feed (`feed.rs`: collected inline by
//! [`crate::rollout_side::collect`] in sync and lagged modes, or by the rollout workers of
//! [`crate::rollout_side::workers`] in async mode, under [`crate::rollout_side::admission`]'s staleness bound), shapes the
//! rewards (DAPO overlong penalty and filter), prepares the rows on the learner
//! (`prepare.rs`: π_old where the correction mode needs it, reference log-probs, values,
//! advantages, the decoupled correction against μ), runs `ppo_epochs` × `mini_batches`
//! optimiser steps (`learn.rs`), publishes the new weights to the rollout workers and
//! reports its metrics. [`crate::run`] adds the warm-up, evaluation (`eval.rs`) and
//! checkpoints. Every random choice is a function of `(seed, step)`, so a resumed run repeats
//! an uninterrupted one exactly (in async mode, with η = 0).

use crate::algorithm::{Extensions, ResolvedAlgorithm, resolve_algorithm};
use crate::checkpoint::{self, TrainerState};
use crate::events::{EventKind, Timeline};
use crate::metrics::StepMetrics;
use crate::offpolicy::StepDiagnostics;
use crate::optim::FusedAdamWConfig;
use crate::recipe::AsyncMode;
use crate::recipe::{KlPlacement, Recipe};
use crate::rollout_side::admission::PipelineState;
use crate::rollout_side::admission::{staleness, staleness_metrics};
use crate::rollout_side::collect::{Collected, RolloutSide};
use crate::rollout_side::feed::Feed;
use crate::sources::Sources;
use crate::{Result, TrainError, io_err};
use burn::optim::ModuleOptimizer;
use burn::tensor::{DType, Device};
use rlft_algo::loss::LossRegistry;
use rlft_algo::seed::spread;
use rlft_algo::shaping::OverlongPenalty;
use rlft_model::{LoraConfig, Pretrained, Tokenizer, Transformer, TransformerConfig, ValueModel};
use rlft_rollout::{DataCursor, Dataset, Example, Task, Trajectory};
use serde_json::json;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// The logits one chunk of the learner's output head may hold when
/// `algorithm.logits_chunk_tokens` is 0 (auto).
pub const LOGITS_CHUNK_BYTES: usize = 1 << 30;

/// Skipped (NaN/Inf) steps in a row that stop the run.
pub const MAX_BAD_STEPS_IN_ROW: usize = 3;

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
    pub(crate) fn resp_len(&self) -> usize {
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

/// The frozen reference policy and the device it lives on (`model.reference_device`, default
/// the learner's plain device).
pub(crate) struct Reference {
    pub(crate) model: Transformer,
    pub(crate) device: Device,
}

/// A trainer built from a recipe.
pub struct Trainer {
    pub(crate) recipe: Recipe,
    pub(crate) device: Device,
    pub(crate) plain: Device,
    /// `[distributed] devices` past the first (autodiff devices): the learner's other ranks.
    pub(crate) ranks: Vec<Device>,
    /// The policy (on the autodiff device); `None` only while an optimizer step holds it, so
    /// that its parameters are updated in place ([`Trainer::policy`]).
    pub(crate) policy: Option<Transformer>,
    pub(crate) critic: Option<ValueModel>,
    pub(crate) reference: Option<Reference>,
    /// The tokenizer.
    pub tokenizer: Tokenizer,
    pub(crate) config: TransformerConfig,
    pub(crate) optim: ModuleOptimizer,
    pub(crate) critic_optim: Option<ModuleOptimizer>,
    pub(crate) task: Task,
    pub(crate) train_set: Arc<Dataset>,
    pub(crate) eval_set: Vec<Example>,
    /// `data.sft`: the warm-up's demonstrations (else the task's reference completions).
    pub(crate) sft_set: Option<Dataset>,
    /// The rollout stage's settings and data (shared with rollout workers).
    pub(crate) side: RolloutSide,
    /// How batches arrive: admission, lagged snapshots, rollout workers.
    pub(crate) feed: Feed,
    /// The run's timeline (`events.jsonl`).
    pub(crate) timeline: Arc<Timeline>,
    /// `async.learner_threads`: the learner's compute pool.
    pub(crate) learner_pool: Option<Arc<rayon::ThreadPool>>,
    /// When the last RL step ended (timeline seconds), for the async fractions.
    pub(crate) last_step_end: Option<f64>,
    pub(crate) algo: ResolvedAlgorithm,
    pub(crate) registry: LossRegistry,
    pub(crate) state: TrainerState,
    /// The warm-up's optimiser, while the warm-up runs.
    pub(crate) sft_optim: Option<ModuleOptimizer>,
    /// A checkpoint was loaded (its logs are cut back to it, not started afresh).
    pub(crate) resumed: bool,
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
        // What `Recipe::validate_with` checks, resolving `[algorithm]` once.
        recipe.check_values()?;
        let algo = resolve_algorithm(&recipe, &ext.registry)?;
        let resume = resume.map(checkpoint::resume_from).transpose()?;
        if let Some(r) = &resume {
            recipe.check_resume(&Recipe::from_stored(&r.stored_recipe()?)?)?;
            recipe.output_dir = r.run_dir();
        }
        // With data parallelism the first rank's device is the run's.
        let devices = &recipe.distributed.devices;
        let run_device = devices.first().copied().unwrap_or(recipe.device);
        let plain = run_device.device()?;
        let device = plain.clone().autodiff();
        let ranks = devices
            .iter()
            .skip(1)
            .map(|d| d.device().map(|d| d.autodiff()))
            .collect::<std::result::Result<Vec<_>, _>>()?;
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
        // Half-precision passes where every device of the run has them.
        let dtype = recipe.model.dtype;
        dtype.check(&plain, "device", run_device)?;
        for (d, &spec) in ranks.iter().zip(devices.iter().skip(1)) {
            dtype.check(d, "distributed.devices entry", spec)?;
        }
        if let Some(spec) = recipe.rollout.device {
            dtype.check(&spec.device()?, "rollout.device", spec)?;
        }
        let policy = policy.with_compute_dtype(dtype.float_dtype());
        let policy = if recipe.model.lora.rank > 0 {
            let l = &recipe.model.lora;
            policy.with_lora(
                &LoraConfig::new(l.rank, l.alpha).with_target_modules(l.target_modules.clone()),
            )?
        } else {
            policy
        };
        let reference = if recipe.algorithm.kl_coef > 0.0 {
            let device = match recipe.model.reference_device {
                Some(d) => d.device()?,
                None => plain.clone(),
            };
            if let Some(spec) = recipe.model.reference_device {
                dtype.check(&device, "model.reference_device", spec)?;
            }
            // Frozen: stored in the compute type.
            Some(Reference {
                model: policy.reference_copy(&device).cast_to_compute_dtype(),
                device,
            })
        } else {
            None
        };
        let critic = recipe
            .model
            .critic
            .then(|| ValueModel::from_trunk(policy.clone(), &device));
        let mut task = Task::new(recipe.task.name, recipe.task.difficulty)?;
        task.ops = recipe.task.ops.iter().map(|o| o.symbol()).collect();
        task.chat = recipe.task.chat;
        task.seed = recipe.seed;
        if task.chat && tokenizer.chat_template.is_none() {
            return Err(TrainError::Recipe(
                "task.chat = true but the model has no chat template".into(),
            ));
        }
        let mut sources = Sources::load(&recipe, &task, &tokenizer)?;
        if let Some(env) = &ext.environment {
            sources.env = env.clone();
        }
        if let Some(eval) = &ext.eval_set {
            sources.eval = eval.clone();
        }
        let (rewards, correctness) = crate::sources::rewards(&recipe, &task, &ext.rewards)?;
        let learner_pool = recipe
            .asynchrony
            .learner_threads
            .map(|n| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(n)
                    .thread_name(|k| format!("rlft-learner-{k}"))
                    .build()
                    .map(Arc::new)
            })
            .transpose()
            .map_err(|e| TrainError::Usage(format!("learner compute threads: {e}")))?;
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
            pipeline: Default::default(),
            snapshots: Vec::new(),
        };
        let train_set = sources.train.clone();
        let mut side = RolloutSide::new(
            &recipe,
            tokenizer.clone(),
            sources.env.clone(),
            rewards,
            train_set.clone(),
        );
        side.correctness = correctness;
        let mut trainer = Self {
            side,
            feed: Feed::Switching,
            timeline: Arc::new(Timeline::open(None, false)?),
            learner_pool,
            last_step_end: None,
            optim: adamw(&recipe.optimizer),
            critic_optim: recipe.model.critic.then(|| adamw(&recipe.optimizer)),
            registry: ext.registry,
            recipe,
            device,
            plain,
            ranks,
            policy: Some(policy),
            critic,
            reference,
            tokenizer,
            config,
            task,
            train_set,
            eval_set: sources.eval,
            sft_set: sources.sft,
            algo,
            state: state.clone(),
            sft_optim: None,
            resumed: false,
        };
        let a = &trainer.recipe.asynchrony;
        let lag = match a.mode {
            AsyncMode::Lagged => a.lag().map_err(TrainError::Recipe)?,
            _ => 0,
        };
        let admission = trainer.admission(DataCursor::default(), 0, PipelineState::default())?;
        trainer.feed = Feed::new(a.mode, admission, lag);
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

    /// Runs one RL step — rollouts, rewards, advantages, the update — without evaluation,
    /// checkpointing or the SFT warm-up, and returns its metrics (the `metrics.jsonl` keys but
    /// `eval/*`). For trainers that drive the loop themselves; [`Trainer::run`] is the whole run.
    pub fn train_step(&mut self) -> Result<StepMetrics> {
        let step = self.state.step + 1;
        let m = self.step(step)?;
        self.state.step = step;
        Ok(m)
    }

    /// Step `step` on the learner's compute pool (`async.learner_threads`), else the shared one.
    pub(crate) fn step(&mut self, step: usize) -> Result<StepMetrics> {
        match self.learner_pool.clone() {
            Some(pool) => pool.install(|| self.step_here(step)),
            None => self.step_here(step),
        }
    }

    fn step_here(&mut self, step: usize) -> Result<StepMetrics> {
        let t0 = Instant::now();
        let interval_start = self.last_step_end.unwrap_or(0.0);
        let (
            Collected {
                groups,
                filtered,
                failed,
                timeouts,
                skipped_prompts,
                tokens: gen_tokens,
                generate_secs: gen_secs,
                score_secs,
                ..
            },
            feed,
        ) = self.next_batch(step)?;
        crate::fault::point(|| format!("rollout:{step}"));
        let a = self.recipe.algorithm.clone();
        let r = self.recipe.rollout.clone();
        // Reward statistics over every scored trajectory (before shaping).
        let trajs: Vec<&Trajectory> = groups.iter().flat_map(|g| &g.trajectories).collect();
        // Off-policy: some token came from an older policy than the learner's (staleness > 0).
        let off_policy = trajs.iter().any(|t| staleness(step as u64, t.version) > 0);
        // Each group's oldest policy version, for the staleness metrics.
        let oldest: Vec<u64> = groups
            .iter()
            .map(|g| g.oldest_version().unwrap_or(step as u64))
            .collect();
        // Max − min policy version within each group, mean over groups.
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
        let beta = self.beta();
        if a.kl_placement == KlPlacement::Loss {
            self.algo.config.kl_coef = beta;
        }
        // Clip-Cov's draws: fresh each step, a function of (seed, step) like every random choice.
        self.algo.config.clip_cov_seed = self.recipe.seed ^ spread(step as u64);
        let mut diag = StepDiagnostics::default();
        let scored: Vec<f64> = trajs.iter().filter_map(|t| t.reward).collect();
        let (mean, std) = mean_std(&scored);
        let acc = if trajs.is_empty() {
            0.0
        } else {
            trajs
                .iter()
                .map(|t| is_correct(t, &self.side.correctness))
                .sum::<f64>()
                / trajs.len() as f64
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
        m.insert("reward/total".into(), json!(mean));
        for (k, v) in self.side.env.take_metrics() {
            m.insert(k, json!(v));
        }
        // Each term's raw (unweighted) mean over the scored samples.
        for name in self.side.rewards.names() {
            let v: Vec<f64> = trajs
                .iter()
                .filter_map(|t| t.reward_terms.iter().find(|(n, _)| *n == name))
                .map(|(_, v)| *v)
                .collect();
            m.insert(format!("reward/{name}"), json!(mean_std(&v).0));
        }
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
        let eta = self.recipe.asynchrony.eta();
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
        let learn_start = self.timeline.now();
        if !rows.is_empty() {
            self.prepare(&mut rows, &group_ids, &rewards, off_policy, &mut diag)?;
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
        let trained: usize = rows
            .iter()
            .map(|r| r.mask.iter().filter(|&&x| x > 0.0).count())
            .sum();
        self.timeline.record(
            "learner",
            EventKind::Learn,
            learn_start,
            self.timeline.now(),
            step as u64,
            trained,
        );
        self.publish(step);
        let now = self.timeline.now();
        if self.recipe.asynchrony.mode == AsyncMode::Async {
            let wall = (now - interval_start).max(1e-9);
            let workers = self.recipe.asynchrony.rollout_workers.unwrap_or(1) as f64;
            for (k, v) in [
                ("async/queue_len", feed.queue_groups as f64),
                ("async/requeued", feed.requeued as f64),
                ("async/dropped", feed.dropped as f64),
                ("async/learner_idle", (feed.waited_secs / wall).min(1.0)),
                (
                    "async/rollout_idle",
                    (feed.rollout_wait_secs / (wall * workers)).min(1.0),
                ),
                (
                    "async/rollout_tokens_per_s",
                    feed.rollout_tokens as f64 / wall,
                ),
                ("async/learner_tokens_per_s", gen_tokens as f64 / wall),
                ("async/version_spread", version_spread),
            ] {
                m.insert(k.into(), json!(v));
            }
        }
        self.last_step_end = Some(now);
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
    pub(crate) fn beta(&self) -> f64 {
        match &self.algo.kl_control {
            Some(c) => self.state.kl_coef.unwrap_or(c.value),
            None => self.recipe.algorithm.kl_coef,
        }
    }
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
