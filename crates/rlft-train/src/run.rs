//! A run's life: the SFT warm-up, the RL loop with evaluation, checkpoints and Ctrl-C, the
//! final export. Checkpoints are written every `checkpoint.every` steps of the warm-up and of
//! RL, when the warm-up ends, at the end, and when asked to stop; every point of a run can be
//! killed and resumed to the same weights and metrics ([`crate::fault`] names the points the
//! crash test kills at).

use crate::checkpoint::{self, TrainerState};
use crate::demos::Demo;
use crate::events::{EVENTS_FILE, Timeline};
use crate::metrics::{MetricsLog, StepMetrics};
use crate::optim::{adamw, clip_grads};
use crate::score::Row;
use crate::trainer::{MAX_BAD_STEPS_IN_ROW, Trainer};
use crate::{Result, TrainError};
use burn::module::Module;
use burn::optim::{GradientsParams, ModuleOptimizer};
use rlft_algo::seed::unit_hash;
use rlft_rollout::Split;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// What a finished (or interrupted) run reports.
#[derive(Debug, Clone)]
pub struct RunSummary {
    /// RL steps completed.
    pub steps: usize,
    /// SFT warm-up steps completed, when the run stopped during the warm-up.
    pub warmup_steps: Option<usize>,
    /// Steps skipped for NaN/Inf.
    pub skipped_steps: usize,
    /// Stopped by Ctrl-C (a checkpoint was written).
    pub interrupted: bool,
    /// Held-out accuracy at RL step 0 and at the end.
    pub eval_first_last: Option<(f64, f64)>,
    /// The metrics summary table.
    pub table: String,
    /// The exported HF checkpoint, if any.
    pub exported: Option<PathBuf>,
}

fn stopping(stop: Option<&Arc<AtomicBool>>) -> bool {
    stop.is_some_and(|s| s.load(Ordering::SeqCst))
}

impl Trainer {
    /// The warm-up's AdamW (its learning rate and weight decay, the recipe's betas).
    fn sft_adamw(&self) -> ModuleOptimizer {
        let s = &self.recipe.sft;
        adamw(&crate::recipe::OptimizerSection {
            lr: s.lr,
            weight_decay: s.weight_decay,
            ..self.recipe.optimizer.clone()
        })
    }

    pub(crate) fn load_checkpoint(&mut self, dir: &Path, state: TrainerState) -> Result<()> {
        let err = |what: &str, e: String| TrainError::Checkpoint {
            path: dir.into(),
            msg: format!(
                "{what} cannot be read ({e}); the checkpoint is damaged or from another model: \
                 resume from another checkpoint folder of the run (--resume {}/step-N)",
                dir.parent().unwrap_or(dir).display()
            ),
        };
        let policy = self
            .policy()
            .clone()
            .try_load_file(dir.join(checkpoint::POLICY_FILE))
            .map_err(|e| err("the policy weights", format!("{e:?}")))?;
        self.models.policy = Some(policy);
        // A warm-up checkpoint holds the warm-up's optimiser; RL's starts fresh after it.
        let optim = if state.sft_done {
            adamw(&self.recipe.optimizer)
        } else {
            self.sft_adamw()
        }
        .load(dir.join(checkpoint::OPTIM_FILE))
        .map_err(|e| err("the optimizer state", format!("{e:?}")))?;
        if state.sft_done {
            self.learner.optim = optim;
        } else {
            self.learner.sft_optim = Some(optim);
        }
        if let Some(c) = self.models.critic.take() {
            self.models.critic = Some(
                c.try_load_file(dir.join(checkpoint::CRITIC_FILE))
                    .map_err(|e| err("the critic weights", format!("{e:?}")))?,
            );
            self.learner.critic_optim = Some(
                adamw(&self.recipe.optimizer)
                    .load(dir.join(checkpoint::CRITIC_OPTIM_FILE))
                    .map_err(|e| err("the critic optimizer state", format!("{e:?}")))?,
            );
        }
        if self.feed.snapshots().is_some() {
            // Lagged mode: the policies of the kept versions, oldest first. Every version the
            // checkpoint lists must be there: without one, the run would sample with a policy
            // one version too new and say nothing.
            let found = checkpoint::snapshot_versions(dir)?;
            let listed: Vec<u64> = if state.snapshots.is_empty() {
                // Written before checkpoints listed their snapshots: the versions kept are
                // consecutive, so a gap is a missing file.
                let first = found.first().copied().unwrap_or(0);
                (first..first + found.len() as u64).collect()
            } else {
                state.snapshots.clone()
            };
            if let Some(v) = listed.iter().find(|v| !found.contains(v)) {
                return Err(err(
                    "a lagged-mode snapshot",
                    format!(
                        "{} is missing (the checkpoint holds versions {listed:?})",
                        checkpoint::snapshot_file(*v)
                    ),
                ));
            }
            for v in listed {
                let m = self
                    .models
                    .policy
                    .as_ref()
                    .map(|p| p.valid())
                    .ok_or_else(|| err("the policy", "moved out".into()))?
                    .try_load_file(dir.join(checkpoint::snapshot_file(v)))
                    .map_err(|e| err("a lagged-mode snapshot", format!("{e:?}")))?;
                if let Some(snapshots) = self.feed.snapshots_mut() {
                    snapshots.restore(v, m);
                }
            }
        }
        let admission = self.admission(state.cursor, state.step, state.pipeline.clone())?;
        self.feed.set_admission(admission)?;
        self.state = state;
        self.resumed = true;
        Ok(())
    }

    /// Writes a checkpoint of the run as it stands (policy, optimizer, critic, lagged-mode
    /// snapshots, the data cursor and the trainer state) into `output_dir`, keeping the newest
    /// `checkpoint.keep`; returns its folder. [`Trainer::run`] calls it every `checkpoint.every`
    /// steps; a trainer that drives [`Trainer::train_step`] itself calls it when it likes, and
    /// `--resume` continues from it.
    ///
    /// # Errors
    /// A file that cannot be written (nothing of the checkpoint is then adopted).
    pub fn save_checkpoint(&mut self) -> Result<PathBuf> {
        (self.state.pipeline, self.state.cursor) = self.feed.checkpoint_state();
        self.state.snapshots = self
            .feed
            .snapshots()
            .iter()
            .flat_map(|s| s.iter().map(|(v, _)| *v))
            .collect();
        let policy = self.policy().clone();
        let optim = match (&self.learner.sft_optim, self.state.sft_done) {
            (Some(o), false) => o,
            _ => &self.learner.optim,
        };
        let critic = self.models.critic.clone();
        let critic_optim = &self.learner.critic_optim;
        let snapshots: Vec<(u64, rlft_model::Transformer)> = self
            .feed
            .snapshots()
            .iter()
            .flat_map(|s| s.iter().cloned())
            .collect();
        checkpoint::save(
            &self.recipe.output_dir,
            &self.state,
            self.recipe.checkpoint.keep,
            |dir| {
                let e = |what: &str, m: String| TrainError::Checkpoint {
                    path: dir.into(),
                    msg: format!("cannot write {what}: {m}; check the disk's free space"),
                };
                policy
                    .save_file(dir.join(checkpoint::POLICY_FILE))
                    .map_err(|x| e("policy", format!("{x:?}")))?;
                optim
                    .save(dir.join(checkpoint::OPTIM_FILE))
                    .map_err(|x| e("optimizer", format!("{x:?}")))?;
                if let (Some(c), Some(o)) = (critic, critic_optim) {
                    c.save_file(dir.join(checkpoint::CRITIC_FILE))
                        .map_err(|x| e("critic", format!("{x:?}")))?;
                    o.save(dir.join(checkpoint::CRITIC_OPTIM_FILE))
                        .map_err(|x| e("critic optimizer", format!("{x:?}")))?;
                }
                for (v, m) in snapshots {
                    m.save_file(dir.join(checkpoint::snapshot_file(v)))
                        .map_err(|x| e("lagged-mode snapshot", format!("{x:?}")))?;
                }
                Ok(())
            },
        )
    }

    /// Stops what runs beside the learner: the async rollout workers (their admitted samples
    /// and data cursor are kept, so a checkpoint after it, or a further step, loses nothing) and
    /// the `"local:N"` rollout servers. A further [`Trainer::train_step`] starts them again.
    /// [`Trainer::run`] calls it at the end; dropping the trainer does the same.
    ///
    /// # Errors
    /// A rollout worker that failed.
    pub fn shutdown(&mut self) -> Result<()> {
        self.stop_workers()?;
        if let Some(fleet) = &self.side.fleet {
            fleet.stop_local();
        }
        Ok(())
    }

    /// Supervised warm-up on `data.sft`'s demonstrations or the task's reference completions
    /// (`sft.steps` steps), logged to
    /// `output_dir/sft_metrics.jsonl`, checkpointed every `checkpoint.every` steps. Returns
    /// whether it ran to its end (false: stopped by `stop`, after a checkpoint).
    fn sft(&mut self, stop: Option<&Arc<AtomicBool>>) -> Result<bool> {
        let s = self.recipe.sft.clone();
        if s.steps == 0 || self.state.sft_done {
            self.state.sft_done = true;
            return Ok(true);
        }
        let path = self.recipe.output_dir.join("sft_metrics.jsonl");
        let mut log = MetricsLog::open(&path, self.resumed.then_some(self.state.sft_step))?;
        if log.torn_lines > 0 {
            eprintln!(
                "note: {}: dropped a torn last line (a write cut short); the warm-up steps after \
                 the checkpoint are recomputed",
                path.display()
            );
        }
        if self.learner.sft_optim.is_none() {
            self.learner.sft_optim = Some(self.sft_adamw());
        }
        let eos = crate::demos::eos(&self.tokenizer);
        let schedule = s.lr_schedule();
        let every = self.recipe.checkpoint.every;
        let skipped = self.sft_set.as_ref().map_or(0, |d| d.skipped);
        for step in self.state.sft_step..s.steps {
            let start = Instant::now();
            let mut rows = Vec::with_capacity(s.batch_size);
            for i in 0..s.batch_size {
                let n = step * s.batch_size + i;
                // `data.sft`'s demonstrations in file order, cycling; else the task's reference
                // completions (observation turns masked out).
                let demo = match &self.sft_set {
                    Some(set) => set.rows[n % set.rows.len()].clone(),
                    None => {
                        let index = 1_000_000 + n as u64;
                        let mut ex = self.task.example(Split::Train, index);
                        if unit_hash(self.recipe.seed, index) < s.teacher_error {
                            ex = self.task.off_by_one(ex);
                        }
                        let turns = self.task.reference_turns(&ex);
                        let prompt = ex.prompt.render(&self.tokenizer)?;
                        Demo::encode(&self.tokenizer, &prompt, &turns, eos, self.sft_max_len)?
                            .ok_or_else(|| {
                                TrainError::Recipe(format!(
                                    "sft.max_len: the task's reference demonstration for {:?} is \
                                     longer than {} tokens; raise sft.max_len",
                                    ex.prompt.user_text(),
                                    self.sft_max_len
                                ))
                            })?
                    }
                };
                rows.push(Row::demonstration(&demo.prompt, &demo.response, demo.mask));
            }
            let refs: Vec<&Row> = rows.iter().collect();
            let ids = self.pack(&refs);
            let mask = self.per_token(&ids, &refs, |r| &r.mask);
            let lp = ids.logprobs(self.policy(), None)?;
            let tokens: f32 = rows.iter().map(|r| r.mask.iter().sum::<f32>()).sum();
            let loss = (lp * mask).sum().neg() * (1.0 / tokens.max(1.0));
            let loss_v: f32 = loss.clone().into_scalar();
            let grads = GradientsParams::from_grads(loss.backward(), self.policy());
            let (grads, norm) = clip_grads(grads, self.policy(), s.grad_clip);
            // Linear warm-up over the first tenth of the steps (from-scratch models diverge at
            // full learning rate on their first updates), then the recipe's schedule.
            let lr = schedule.lr(s.lr, step);
            if norm.is_finite() && loss_v.is_finite() {
                let policy = self.take_policy();
                if let Some(o) = self.learner.sft_optim.as_mut() {
                    self.models.policy = Some(o.step(lr, policy, grads));
                }
            }
            let mut m = StepMetrics::new();
            m.insert("step".into(), json!(step + 1));
            m.insert("loss".into(), json!(loss_v));
            m.insert("grad_norm".into(), json!(norm));
            m.insert("lr".into(), json!(lr));
            m.insert("sft/skipped".into(), json!(skipped));
            m.insert("time/step_s".into(), json!(start.elapsed().as_secs_f64()));
            log.write(m)?;
            self.state.sft_step = step + 1;
            crate::fault::point(|| format!("warmup:{}", step + 1));
            // The flag is read once: a Ctrl-C between two reads must not skip the checkpoint.
            // At the last warm-up step the warm-up's end (`step-0`) is the checkpoint.
            let stop_now = stopping(stop);
            let last = step + 1 == s.steps;
            if !last && (stop_now || (every > 0 && (step + 1).is_multiple_of(every))) {
                self.save_checkpoint()?;
            }
            if !last && stop_now {
                return Ok(false);
            }
        }
        self.state.sft_done = true;
        self.learner.sft_optim = None;
        Ok(true)
    }

    /// Runs the recipe to its last step (or until `stop` is set: then a checkpoint is written
    /// and the summary says `interrupted`).
    ///
    /// # Errors
    /// A file that cannot be written, a model error, or a run that diverged (NaN/Inf in
    /// [`MAX_BAD_STEPS_IN_ROW`] steps in a row; a checkpoint is written first).
    pub fn run(&mut self, stop: Option<Arc<AtomicBool>>) -> Result<RunSummary> {
        let out = self.recipe.output_dir.clone();
        let warmed_up = self.state.sft_done;
        if !self.sft(stop.as_ref())? {
            return Ok(RunSummary {
                steps: 0,
                warmup_steps: Some(self.state.sft_step),
                skipped_steps: 0,
                interrupted: true,
                eval_first_last: None,
                table: String::new(),
                exported: None,
            });
        }
        let mut log = self.open_run_log(&out, warmed_up)?;
        let bar = self.progress_bar();
        if self.state.step == 0 && log.history.is_empty() {
            let mut m = StepMetrics::new();
            m.insert("step".into(), json!(0));
            m.extend(self.evaluate_at(0)?);
            log.write(m)?;
            // The warm-up's end is a checkpoint (its line 0 written first, so that a resume
            // from it keeps that line).
            if self.recipe.sft.steps > 0 {
                self.save_checkpoint()?;
            }
        }
        // Asked to stop during the warm-up's last step or the step-0 evaluation: `step-0`
        // (after a warm-up), the loaded checkpoint, or the run's start is where it resumes.
        let interrupted = (self.state.step < self.recipe.schedule.steps && stopping(stop.as_ref()))
            || self.rl_steps(&mut log, &bar, stop.as_ref())?;
        bar.finish_and_clear();
        self.shutdown()?;
        self.timeline.flush()?;
        let exported = if self.recipe.checkpoint.export_final && !interrupted {
            let dir = out.join("final");
            self.policy()
                .save_hf(&self.models.config, Some(&self.tokenizer), &dir)?;
            Some(dir)
        } else {
            None
        };
        let evals: Vec<f64> = log
            .history
            .iter()
            .filter_map(|m| m.get("eval/accuracy")?.as_f64())
            .collect();
        Ok(RunSummary {
            steps: self.state.step,
            warmup_steps: None,
            skipped_steps: self.state.skipped_steps,
            interrupted,
            eval_first_last: evals.first().zip(evals.last()).map(|(a, b)| (*a, *b)),
            table: log.summary(),
            exported,
        })
    }

    /// The RL metrics log (a run resumed from a warm-up checkpoint starts it afresh; one
    /// resumed from an RL checkpoint keeps its lines up to that step), TensorBoard beside it,
    /// and the timeline of `events.jsonl`.
    fn open_run_log(&mut self, out: &Path, warmed_up: bool) -> Result<MetricsLog> {
        let keep = (self.resumed && warmed_up).then_some(self.state.step);
        let mut log = MetricsLog::open(&out.join("metrics.jsonl"), keep)?;
        if self.recipe.logging.tensorboard {
            log = log.with_tensorboard(out, keep)?;
        }
        self.timeline = Arc::new(Timeline::open(
            Some(&out.join(EVENTS_FILE)),
            keep.is_some(),
        )?);
        if let Some(fleet) = &self.side.fleet {
            fleet.set_timeline(self.timeline.clone());
        }
        if log.torn_lines > 0 {
            eprintln!(
                "note: {}: dropped a torn last line (a write cut short); the steps after the \
                 checkpoint are recomputed",
                out.join("metrics.jsonl").display()
            );
        }
        Ok(log)
    }

    /// The console's progress bar (hidden with `logging.progress = false`).
    fn progress_bar(&self) -> indicatif::ProgressBar {
        if !self.recipe.logging.progress {
            return indicatif::ProgressBar::hidden();
        }
        let b = indicatif::ProgressBar::new(self.recipe.schedule.steps as u64);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{elapsed_precise} [{bar:30}] {pos}/{len} {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        b.set_position(self.state.step as u64);
        b
    }

    /// The RL steps from the current one to `schedule.steps`, each logged, evaluated every
    /// `eval.every` steps and checkpointed every `checkpoint.every`; returns whether `stop`
    /// ended them early (after a checkpoint).
    ///
    /// # Errors
    /// As [`Trainer::run`].
    fn rl_steps(
        &mut self,
        log: &mut MetricsLog,
        bar: &indicatif::ProgressBar,
        stop: Option<&Arc<AtomicBool>>,
    ) -> Result<bool> {
        let steps = self.recipe.schedule.steps;
        while self.state.step < steps {
            let step = self.state.step + 1;
            let report = self.step(step)?;
            self.state.step = step;
            let mut m = report.to_metrics()?;
            crate::fault::point(|| format!("update:{step}"));
            let eval_every = self.recipe.eval.every;
            if step == steps || (eval_every > 0 && step.is_multiple_of(eval_every)) {
                m.extend(self.evaluate_at(step)?);
            }
            bar.set_message(format!(
                "reward {:.3} kl {:.4} {:.0} tok/s",
                report.rollout.reward_mean, report.update.kl, report.rollout.tokens_per_s
            ));
            bar.set_position(step as u64);
            log.write(m)?;
            self.timeline.flush()?;
            let every = self.recipe.checkpoint.every;
            let stopping = stopping(stop);
            if self.state.bad_in_row >= MAX_BAD_STEPS_IN_ROW {
                let dir = self.save_checkpoint()?;
                bar.abandon();
                return Err(TrainError::Diverged(format!(
                    "{} steps in a row had NaN/Inf loss or gradients (weights left untouched); \
                     checkpoint {}; start a new run with a lower optimizer.lr, or a lower \
                     optimizer.grad_clip (a tighter bound on the gradient norm; 0 turns clipping \
                     off) (a resumed run keeps its optimizer settings)",
                    self.state.bad_in_row,
                    dir.display()
                )));
            }
            if step == steps || stopping || (every > 0 && step.is_multiple_of(every)) {
                self.save_checkpoint()?;
            }
            if stopping && step < steps {
                return Ok(true);
            }
        }
        Ok(false)
    }
}
