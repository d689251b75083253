//! A run's life: the SFT warm-up, the RL loop with evaluation, checkpoints and Ctrl-C, the
//! final export. Checkpoints are written every `checkpoint.every` steps of the warm-up and of
//! RL, when the warm-up ends, at the end, and when asked to stop; every point of a run can be
//! killed and resumed to the same weights and metrics ([`crate::fault`] names the points the
//! crash test kills at).

use super::saving::save_checkpoint;
use super::warmup;
use super::{MAX_BAD_STEPS_IN_ROW, Trainer};
use crate::events::{EVENTS_FILE, Timeline};
use crate::metrics::{MetricsLog, StepMetrics};
use crate::{Result, TrainError};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

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

/// Whether `stop` is set.
pub(crate) fn stopping(stop: Option<&Arc<AtomicBool>>) -> bool {
    stop.is_some_and(|s| s.load(Ordering::SeqCst))
}

/// Runs the recipe to its last step (or until `stop` is set: then a checkpoint is written
/// and the summary says `interrupted`).
///
/// # Errors
/// A file that cannot be written, a model error, or a run that diverged (NaN/Inf in
/// [`MAX_BAD_STEPS_IN_ROW`] steps in a row; a checkpoint is written first).
pub(crate) fn run(t: &mut Trainer, stop: Option<Arc<AtomicBool>>) -> Result<RunSummary> {
    let out = t.recipe.output_dir.clone();
    let warmed_up = t.state.sft_done;
    if !warmup::sft(t, stop.as_ref())? {
        return Ok(RunSummary {
            steps: 0,
            warmup_steps: Some(t.state.sft_step),
            skipped_steps: 0,
            interrupted: true,
            eval_first_last: None,
            table: String::new(),
            exported: None,
        });
    }
    let mut log = open_run_log(t, &out, warmed_up)?;
    let bar = progress_bar(t);
    if t.state.step == 0 && log.history.is_empty() {
        let mut m = StepMetrics::new();
        m.insert("step".into(), json!(0));
        m.extend(t.evaluation().at(0)?);
        log.write(m)?;
        // The warm-up's end is a checkpoint (its line 0 written first, so that a resume
        // from it keeps that line).
        if t.recipe.sft.steps > 0 {
            save_checkpoint(t)?;
        }
    }
    // Asked to stop during the warm-up's last step or the step-0 evaluation: `step-0`
    // (after a warm-up), the loaded checkpoint, or the run's start is where it resumes.
    let interrupted = (t.state.step < t.recipe.schedule.steps && stopping(stop.as_ref()))
        || rl_steps(t, &mut log, &bar, stop.as_ref())?;
    bar.finish_and_clear();
    t.shutdown()?;
    t.timeline.flush()?;
    let exported = if t.recipe.checkpoint.export_final && !interrupted {
        let dir = out.join("final");
        t.models
            .policy()
            .save_hf(&t.models.config, Some(&t.tokenizer), &dir)?;
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
        steps: t.state.step,
        warmup_steps: None,
        skipped_steps: t.state.skipped_steps,
        interrupted,
        eval_first_last: evals.first().zip(evals.last()).map(|(a, b)| (*a, *b)),
        table: log.summary(),
        exported,
    })
}

/// The RL metrics log (a run resumed from a warm-up checkpoint starts it afresh; one
/// resumed from an RL checkpoint keeps its lines up to that step), TensorBoard beside it,
/// and the timeline of `events.jsonl`.
pub(crate) fn open_run_log(t: &mut Trainer, out: &Path, warmed_up: bool) -> Result<MetricsLog> {
    let keep = (t.resumed && warmed_up).then_some(t.state.step);
    let mut log = MetricsLog::open(&out.join("metrics.jsonl"), keep)?;
    if t.recipe.logging.tensorboard {
        log = log.with_tensorboard(out, keep)?;
    }
    t.timeline = Arc::new(Timeline::open(
        Some(&out.join(EVENTS_FILE)),
        keep.is_some(),
    )?);
    if let Some(fleet) = &t.side.fleet {
        fleet.set_timeline(t.timeline.clone());
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
pub(crate) fn progress_bar(t: &Trainer) -> indicatif::ProgressBar {
    if !t.recipe.logging.progress {
        return indicatif::ProgressBar::hidden();
    }
    let b = indicatif::ProgressBar::new(t.recipe.schedule.steps as u64);
    b.set_style(
        indicatif::ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    b.set_position(t.state.step as u64);
    b
}

/// The RL steps from the current one to `schedule.steps`, each logged, evaluated every
/// `eval.every` steps and checkpointed every `checkpoint.every`; returns whether `stop`
/// ended them early (after a checkpoint).
///
/// # Errors
/// As [`Trainer::run`].
pub(crate) fn rl_steps(
    t: &mut Trainer,
    log: &mut MetricsLog,
    bar: &indicatif::ProgressBar,
    stop: Option<&Arc<AtomicBool>>,
) -> Result<bool> {
    let steps = t.recipe.schedule.steps;
    while t.state.step < steps {
        let step = t.state.step + 1;
        let report = t.step(step)?;
        t.state.step = step;
        let mut m = report.to_metrics()?;
        crate::fault::point(|| format!("update:{step}"));
        let eval_every = t.recipe.eval.every;
        if step == steps || (eval_every > 0 && step.is_multiple_of(eval_every)) {
            m.extend(t.evaluation().at(step)?);
        }
        bar.set_message(format!(
            "reward {:.3} kl {:.4} {:.0} tok/s",
            report.rollout.reward_mean, report.update.kl, report.rollout.tokens_per_s
        ));
        bar.set_position(step as u64);
        log.write(m)?;
        t.timeline.flush()?;
        let every = t.recipe.checkpoint.every;
        let stopping = stopping(stop);
        if t.state.bad_in_row >= MAX_BAD_STEPS_IN_ROW {
            let dir = save_checkpoint(t)?;
            bar.abandon();
            return Err(TrainError::Diverged(format!(
                "{} steps in a row had NaN/Inf loss or gradients (weights left untouched); \
                 checkpoint {}; start a new run with a lower optimizer.lr, or a lower \
                 optimizer.grad_clip (a tighter bound on the gradient norm; 0 turns clipping \
                 off) (a resumed run keeps its optimizer settings)",
                t.state.bad_in_row,
                dir.display()
            )));
        }
        if step == steps || stopping || (every > 0 && step.is_multiple_of(every)) {
            save_checkpoint(t)?;
        }
        if stopping && step < steps {
            return Ok(true);
        }
    }
    Ok(false)
}
