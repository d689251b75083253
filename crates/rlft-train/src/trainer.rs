//! The trainer: setup from a recipe, and one RL step through the stages of `step/`, each a
//! function over the parts it needs.
//!
//! A step takes its batch from the feed (`step/collect.rs`: collected inline by
//! [`crate::rollout_side::collect`] in sync and lagged modes, or by the rollout workers of
//! [`crate::rollout_side::workers`] in async mode, under [`crate::rollout_side::admission`]'s
//! staleness bound), prepares the learner's rows (`step/prepare.rs`: the DAPO overlong penalty
//! and filter, then π_old where the correction mode needs it, reference log-probs, values,
//! advantages, the decoupled correction against μ), runs `ppo_epochs` × `mini_batches`
//! optimiser steps (`step/learn.rs`), publishes the new weights to the rollout workers and
//! reports its metrics. The run (`trainer/run.rs`) adds the warm-up (`trainer/warmup.rs`),
//! evaluation (`eval.rs`) and checkpoints (`trainer/saving.rs`). Every random choice is a
//! function of `(seed, step)`, so a resumed run repeats an uninterrupted one exactly (in async
//! mode, with η = 0).

use crate::algorithm::{Extensions, resolve_algorithm};
use crate::batch::Row;
use crate::checkpoint::{self, TrainerState};
use crate::demos::Demos;
use crate::distributed::group::Update;
use crate::eval::Evaluate;
use crate::events::{EventKind, Timeline};
use crate::follower;
use crate::learner::{Learner, Placement};
use crate::metrics::StepMetrics;
use crate::models::Models;
use crate::offpolicy::StepDiagnostics;
use crate::recipe::AsyncMode;
use crate::recipe::{KlPlacement, Recipe};
use crate::report::{AsyncReport, ServerReport, StageTimes, StepReport, UpdateStats};
use crate::rollout_side::admission::PipelineState;
use crate::rollout_side::collect::{Collected, RolloutSide};
use crate::rollout_side::feed::{Feed, FeedStats};
use crate::rollout_side::servers::Fleet;
use crate::sources::Sources;
use crate::step::collect::{Collect, admission, stop_workers};
use crate::step::learn::Learn;
use crate::step::prepare::Prepare;
use crate::{Result, TrainError, io_err};
use rlft_algo::seed::spread;
use rlft_model::{Tokenizer, Transformer};
use rlft_rollout::{DataCursor, Dataset, Example, Task};
pub use run::RunSummary;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

mod run;
mod saving;
mod warmup;

/// Skipped (NaN/Inf) steps in a row that stop the run.
pub const MAX_BAD_STEPS_IN_ROW: usize = 3;

/// A trainer built from a recipe: the models, the learner, the data and the feed of batches,
/// and the run's state.
pub struct Trainer {
    pub(crate) recipe: Recipe,
    pub(crate) models: Models,
    /// The tokenizer.
    pub tokenizer: Tokenizer,
    pub(crate) learner: Learner,
    pub(crate) task: Task,
    pub(crate) train_set: Arc<Dataset>,
    pub(crate) eval_set: Vec<Example>,
    /// `data.sft`: the warm-up's demonstrations (else the task's reference completions).
    pub(crate) sft_set: Option<Demos>,
    /// `sft.max_len` as it applies (the model's context length when unset).
    pub(crate) sft_max_len: usize,
    /// The rollout stage's settings and data (shared with rollout workers).
    pub(crate) side: RolloutSide,
    /// How batches arrive: admission, lagged snapshots, rollout workers.
    pub(crate) feed: Feed,
    /// The run's timeline (`events.jsonl`).
    pub(crate) timeline: Arc<Timeline>,
    /// When the last RL step ended (timeline seconds), for the async fractions.
    pub(crate) last_step_end: Option<f64>,
    pub(crate) state: TrainerState,
    /// A checkpoint was loaded (its logs are cut back to it, not started afresh).
    pub(crate) resumed: bool,
}

/// What the servers did since the last step's line.
fn server_report(fleet: &Fleet) -> ServerReport {
    let st = fleet.take_stats();
    ServerReport {
        servers: fleet.len() as f64,
        requests: st.requests as f64,
        request_s: st.request_secs,
        tokens: st.tokens as f64,
        requeued: st.requeued as f64,
        up: fleet.up() as f64,
        weight_sync_s: st.write_secs + st.load_secs,
        weight_write_s: st.write_secs,
        weight_load_s: st.load_secs,
        weight_version: fleet.serving().unwrap_or_default() as f64,
    }
}

/// The built-in task of `[task]`, seeded by the run.
fn task(recipe: &Recipe, tokenizer: &Tokenizer) -> Result<Task> {
    let mut task = Task::new(recipe.task.name, recipe.task.difficulty)?;
    task.ops = recipe.task.ops.iter().map(|o| o.symbol()).collect();
    task.chat = recipe.task.chat;
    task.seed = recipe.seed;
    if task.chat && tokenizer.chat_template.is_none() {
        return Err(TrainError::Recipe(
            "task.chat = true but the model has no chat template".into(),
        ));
    }
    Ok(task)
}

/// Refuses an `output_dir` that holds anything (a fresh run must not mix with another's files).
fn check_fresh_output_dir(out: &Path) -> Result<()> {
    if out.exists()
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
    Ok(())
}

impl Trainer {
    /// The policy (on the autodiff device).
    pub fn policy(&self) -> &Transformer {
        self.models.policy()
    }

    /// The run folder: the recipe's `output_dir`, or the folder a resumed run continues in.
    pub fn output_dir(&self) -> &Path {
        &self.recipe.output_dir
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
        let place = Placement::new(&recipe, ext.group.clone())?;
        let device = place.plain.clone().autodiff();
        device.seed(recipe.seed);
        if resume.is_none() {
            check_fresh_output_dir(&recipe.output_dir)?;
        }
        let stored = recipe.to_toml()?;
        let (models, tokenizer) = Models::build(&recipe, (&device, &place.plain), &place.ranks)?;
        let task = task(&recipe, &tokenizer)?;
        let mut sources = Sources::load(&recipe, &task, &tokenizer)?;
        if let Some(env) = &ext.environment {
            sources.env = env.clone();
        }
        if let Some(eval) = &ext.eval_set {
            sources.eval = eval.clone();
        }
        let (rewards, correctness) = crate::sources::rewards(&recipe, &task, &ext.rewards)?;
        let sft_max_len =
            crate::demos::max_len(recipe.sft.max_len, models.config.max_position_embeddings)?;
        // Tokenised only when the warm-up runs.
        let sft_set = match (&sources.sft, &recipe.data.sft) {
            (Some(set), Some(path)) if recipe.sft.steps > 0 => {
                Some(Demos::new(set, path, &tokenizer, sft_max_len)?)
            }
            _ => None,
        };
        // Created once everything it describes has loaded: bad input leaves nothing behind.
        let out = &recipe.output_dir;
        std::fs::create_dir_all(out).map_err(io_err(out))?;
        let train_set = sources.train.clone();
        let mut side = RolloutSide::new(
            &recipe,
            tokenizer.clone(),
            sources.env.clone(),
            rewards,
            train_set.clone(),
        );
        side.correctness = correctness;
        side.fleet = Fleet::new(&recipe, &tokenizer, &models.config)?.map(Arc::new);
        let pad_id = i64::from(tokenizer.pad_id.unwrap_or(0));
        let learner = Learner::new(&recipe, algo, place, pad_id, models.config.vocab_size);
        let trainer = Self {
            side,
            feed: Feed::Switching,
            timeline: Arc::new(Timeline::open(None, false)?),
            last_step_end: None,
            learner,
            recipe,
            models,
            tokenizer,
            task,
            train_set,
            eval_set: sources.eval,
            sft_set,
            sft_max_len,
            state: TrainerState::new(stored),
            resumed: false,
        };
        trainer.start(resume)
    }

    /// The feed of batches, the checkpoint to resume from, the effective recipe beside the
    /// run's checkpoints, and a warning where the sampler's filter makes μ differ from the
    /// learner's distribution: the last of [`Trainer::with_extensions`].
    fn start(mut self, resume: Option<checkpoint::ResumeFrom>) -> Result<Self> {
        let a = &self.recipe.asynchrony;
        let lag = match a.mode {
            AsyncMode::Lagged => a.lag().map_err(TrainError::Recipe)?,
            _ => 0,
        };
        let admission = admission(
            &self.recipe,
            self.train_set.len(),
            DataCursor::default(),
            0,
            PipelineState::default(),
        )?;
        self.feed = Feed::new(a.mode, admission, lag);
        if let Some(checkpoint::ResumeFrom::Checkpoint(dir)) = &resume {
            let mut state = checkpoint::read_state(dir)?;
            state.recipe = self.state.recipe.clone();
            saving::load_checkpoint(&mut self, dir, state)?;
            checkpoint::adopt(&self.recipe.output_dir, dir)?;
        }
        // The effective recipe, beside the run's checkpoints: a run killed before its first
        // checkpoint resumes from it.
        crate::write_atomic(
            &self.recipe.output_dir.join(checkpoint::RECIPE_FILE),
            self.state.recipe.as_bytes(),
        )?;
        if self.learner.algo.offpolicy.filtered_sampling
            && self.learner.algo.offpolicy.anchors_at_behaviour()
        {
            eprintln!(
                "warning: top_k/top_p/min_p filter the sampling distribution: μ is its \
                 renormalised log-prob and the learner's is the full softmax, so a ratio against \
                 μ starts at S, the kept mass (rollout/filter_log_mass), not 1; \
                 algorithm.sampling_mask = \"replay\" takes the learner's over the kept set"
            );
        }
        Ok(self)
    }

    /// Runs the recipe to its last step (or until `stop` is set: then a checkpoint is written
    /// and the summary says `interrupted`). The binary sets `stop` on Ctrl-C.
    ///
    /// # Errors
    /// A file that cannot be written, a model error, or a run that diverged (NaN/Inf in
    /// [`MAX_BAD_STEPS_IN_ROW`] steps in a row; a checkpoint is written first).
    pub fn run(&mut self, stop: Option<Arc<AtomicBool>>) -> Result<RunSummary> {
        run::run(self, stop)
    }

    /// Held-out evaluation of the policy as it stands, at the current RL step: what
    /// [`Trainer::run`] logs every `eval.every` steps: `eval/accuracy` (greedy),
    /// `eval/<data_source>/accuracy`, `eval/pass@<k>` and `eval/mean@<k>`; empty without eval
    /// problems. For trainers that drive [`Trainer::train_step`] themselves.
    ///
    /// # Errors
    /// A failed generation or reward.
    pub fn evaluate(&self) -> Result<StepMetrics> {
        self.evaluation().at(self.state.step)
    }

    /// What an evaluation reads.
    pub(crate) fn evaluation(&self) -> Evaluate<'_> {
        Evaluate {
            recipe: &self.recipe,
            policy: self.models.policy(),
            tokenizer: &self.tokenizer,
            side: &self.side,
            eval_set: &self.eval_set,
        }
    }

    /// Writes a checkpoint of the run as it stands (policy, optimizer, critic, lagged-mode
    /// snapshots, the data cursor and the trainer state) into `output_dir`, keeping the newest
    /// `checkpoint.keep`; returns its folder. [`Trainer::run`] calls it every
    /// `checkpoint.every` steps; a trainer that drives [`Trainer::train_step`] itself calls it
    /// when it likes, and `--resume` continues from it.
    ///
    /// # Errors
    /// A file that cannot be written (nothing of the checkpoint is then adopted).
    pub fn save_checkpoint(&mut self) -> Result<PathBuf> {
        saving::save_checkpoint(self)
    }

    /// Stops what runs beside the learner: the async rollout workers (their admitted samples
    /// and data cursor are kept, so a checkpoint after it, or a further step, loses nothing) and
    /// the `"local:N"` rollout servers. A further [`Trainer::train_step`] starts them again.
    /// [`Trainer::run`] calls it at the end; dropping the trainer does the same.
    ///
    /// # Errors
    /// A rollout worker that failed.
    pub fn shutdown(&mut self) -> Result<()> {
        stop_workers(
            &mut self.feed,
            &self.recipe,
            self.train_set.len(),
            self.state.step,
        )?;
        if let Some(fleet) = &self.side.fleet {
            fleet.stop_local();
        }
        Ok(())
    }

    /// Under `[distributed] backend = "mpi"`: tells the other learner ranks that the run is over
    /// (they return) and returns each rank's optimiser state and traffic in bytes; empty
    /// without process ranks.
    ///
    /// # Errors
    /// The ranks cannot be reached.
    pub fn stop_ranks(&mut self) -> Result<follower::RankTotals> {
        follower::stop_ranks(&self.learner)
    }

    fn lr(&self, step: usize) -> f64 {
        self.recipe.schedule.lr(self.recipe.optimizer.lr, step)
    }

    /// Runs one RL step — rollouts, rewards, advantages, the update — without evaluation,
    /// checkpointing or the SFT warm-up, and returns its report ([`StepReport::to_metrics`]
    /// gives the `metrics.jsonl` keys but `eval/*`). For trainers that drive the loop
    /// themselves; [`Trainer::run`] is the whole run.
    pub fn train_step(&mut self) -> Result<StepReport> {
        let step = self.state.step + 1;
        let report = self.step(step)?;
        self.state.step = step;
        Ok(report)
    }

    /// Step `step` on the learner's compute pool (`async.learner_threads`), else the shared one.
    pub(crate) fn step(&mut self, step: usize) -> Result<StepReport> {
        match self.learner.pool.clone() {
            Some(pool) => pool.install(|| self.step_here(step)),
            None => self.step_here(step),
        }
    }

    /// The stale-samples lecture's pipeline: collect → score → learn → publish.
    fn step_here(&mut self, step: usize) -> Result<StepReport> {
        let t0 = Instant::now();
        let interval_start = self.last_step_end.unwrap_or(0.0);
        let (batch, feed) = Collect {
            recipe: &self.recipe,
            side: &self.side,
            feed: &mut self.feed,
            timeline: &self.timeline,
            policy: self.models.policy(),
        }
        .next_batch(step)?;
        crate::fault::point(|| format!("rollout:{step}"));
        let beta = self.set_step_coefficients(step);
        let mut diag = StepDiagnostics::default();
        let t_score = Instant::now();
        let learn_start = self.timeline.now();
        let prepared = Prepare {
            recipe: &self.recipe,
            models: &self.models,
            learner: &self.learner,
            side: &self.side,
            beta,
        }
        .batch(step, &batch, &mut diag)?;
        let score_secs = batch.score_secs + t_score.elapsed().as_secs_f64();
        let lr = self.lr(step - 1);
        let t_train = Instant::now();
        let update = match prepared.rows.is_empty() {
            true => UpdateStats::default(),
            false => self.learn(&prepared.rows.rows, lr, &mut diag)?,
        };
        let (tokens, now) = (prepared.rows.trained_tokens(), self.timeline.now());
        let version = step as u64;
        self.timeline.record(
            "learner",
            EventKind::Learn,
            learn_start,
            now,
            version,
            tokens,
        );
        crate::step::publish(&self.feed, self.models.policy(), step)?;
        let now = self.timeline.now();
        let asynchrony = (self.recipe.asynchrony.mode == AsyncMode::Async).then(|| {
            self.async_report(&feed, &batch, prepared.version_spread, now - interval_start)
        });
        self.last_step_end = Some(now);
        let kl_coef = self.after_update(&update, beta, prepared.rows.rows.len());
        Ok(StepReport {
            step,
            rollout: prepared.rollout,
            staleness: prepared.staleness,
            lr,
            times: StageTimes {
                generate: batch.generate_secs,
                score: score_secs,
                train: t_train.elapsed().as_secs_f64(),
                step: t0.elapsed().as_secs_f64(),
            },
            asynchrony,
            server: self.side.fleet.as_deref().map(server_report),
            offpolicy: diag.metrics(),
            update,
            kl_coef,
            skipped_steps: self.state.skipped_steps,
        })
    }

    /// The learn stage over `rows` at learning rate `lr`; with process ranks, they run it too
    /// (rank 0 sends them the rows first).
    fn learn(&mut self, rows: &[Row], lr: f64, diag: &mut StepDiagnostics) -> Result<UpdateStats> {
        if let Some(group) = self.learner.group.clone() {
            follower::start_ranks(&self.recipe, &self.models, &mut self.learner)?;
            let update = Update {
                step: self.state.step,
                lr,
                loss_seed: self.learner.loss_seed,
                kl_coef: self.learner.algo.config.kl_coef,
                rows: rows.to_vec(),
            };
            follower::lead_update(group.as_ref(), update)?;
        }
        Learn {
            recipe: &self.recipe,
            models: &mut self.models,
            learner: &mut self.learner,
            step: self.state.step,
        }
        .update(rows, lr, diag)
    }

    /// β of step `step` into the loss (where the recipe places KL there) and Clip-Cov's draws
    /// (fresh each step, a function of (seed, step) like every random choice); returns β.
    fn set_step_coefficients(&mut self, step: usize) -> f64 {
        let beta = self.beta();
        if self.recipe.algorithm.kl_placement == KlPlacement::Loss {
            self.learner.algo.config.kl_coef = beta;
        }
        self.learner.loss_seed = self.recipe.seed ^ spread(step as u64);
        beta
    }

    /// Counts a skipped update and moves the adaptive KL controller (β for the next step from
    /// this step's KL over its `sequences`, verl's rule); returns this step's β when the
    /// controller runs.
    fn after_update(&mut self, update: &UpdateStats, beta: f64, sequences: usize) -> Option<f64> {
        if update.skipped {
            self.state.skipped_steps += 1;
            self.state.bad_in_row += 1;
        } else {
            self.state.bad_in_row = 0;
        }
        let ctrl = self.learner.algo.kl_control.as_mut()?;
        ctrl.value = beta;
        self.state.kl_coef = Some(ctrl.update(update.kl, sequences));
        Some(beta)
    }

    /// The async pipeline over the `wall` seconds since the last step ended.
    fn async_report(
        &self,
        feed: &FeedStats,
        batch: &Collected,
        version_spread: f64,
        wall: f64,
    ) -> AsyncReport {
        let wall = wall.max(1e-9);
        let workers = self.recipe.asynchrony.rollout_workers.unwrap_or(1) as f64;
        AsyncReport {
            queue_len: feed.queue_groups as f64,
            requeued: feed.requeued as f64,
            dropped: feed.dropped as f64,
            learner_idle: (feed.waited_secs / wall).min(1.0),
            rollout_idle: (feed.rollout_wait_secs / (wall * workers)).min(1.0),
            rollout_tokens_per_s: feed.rollout_tokens as f64 / wall,
            learner_tokens_per_s: batch.tokens as f64 / wall,
            version_spread,
        }
    }

    /// β of the KL term: the adaptive controller's current value, else `algorithm.kl_coef`.
    pub(crate) fn beta(&self) -> f64 {
        match &self.learner.algo.kl_control {
            Some(c) => self.state.kl_coef.unwrap_or(c.value),
            None => self.recipe.algorithm.kl_coef,
        }
    }
}
