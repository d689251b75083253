//! The `rlft train` command (the `rlft` binary and the `train` example share it): which recipe
//! a command line means, Ctrl-C, and the report printed at the end.
//!
//! Without `--resume` the recipe file, then `RLFT__…` environment variables, then `--set`
//! overrides make the effective recipe. With `--resume DIR` the run's stored recipe is the base
//! (or the recipe file, if one is given) and the result must equal the stored one except for
//! [`crate::recipe::RESUMABLE_KEYS`].

use crate::checkpoint;
use crate::{Extensions, Recipe, Result, RunSummary, TrainError, Trainer};
use rlft_algo::loss::LossRegistry;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

/// How to call the command.
pub const USAGE: &str = "usage: rlft train RECIPE.toml [--set KEY=VALUE]... [--device D] \
                         [--resume DIR]\n       rlft train --resume DIR [--set KEY=VALUE]...";

/// One `train` command line, parsed.
#[derive(Debug, Clone, Default)]
pub struct TrainCommand {
    /// The recipe file, if given.
    pub recipe: Option<PathBuf>,
    /// `--set KEY=VALUE` overrides, in order.
    pub overrides: Vec<String>,
    /// `--resume DIR`: a run folder or one of its checkpoints.
    pub resume: Option<PathBuf>,
    /// The losses the recipe may name and set (the built-ins, and a downstream trainer's own).
    pub registry: LossRegistry,
}

impl TrainCommand {
    /// The effective recipe the command runs.
    ///
    /// # Errors
    /// No recipe file and nothing to resume, or a bad recipe, override or run folder.
    pub fn recipe(&self) -> Result<Recipe> {
        match (&self.recipe, &self.resume) {
            (Some(path), _) => Recipe::load_with(path, &self.overrides, &self.registry),
            (None, Some(dir)) => {
                let stored = checkpoint::resume_from(dir)?.stored_recipe()?;
                Recipe::from_toml_str_with(&stored, &self.overrides, &self.registry)
            }
            (None, None) => Err(TrainError::Usage(format!(
                "no recipe given (a TOML file, e.g. recipes/quickstart.toml)\n{USAGE}"
            ))),
        }
    }

    /// Builds the trainer for `recipe` (what [`TrainCommand::recipe`] gave) and runs it to the
    /// end, or until `stop` is set.
    ///
    /// # Errors
    /// Everything [`Trainer::new`] and [`Trainer::run`] report.
    pub fn run(
        &self,
        recipe: Recipe,
        stop: Option<Arc<AtomicBool>>,
    ) -> Result<(RunSummary, PathBuf)> {
        let ext = Extensions {
            registry: self.registry.clone(),
            ..Extensions::default()
        };
        let mut trainer = Trainer::with_extensions(recipe, self.resume.as_deref(), ext)?;
        let out = trainer.output_dir().to_path_buf();
        Ok((trainer.run(stop)?, out))
    }
}

/// What the command prints when a run ends: the summary table, the evaluation, how to resume
/// an interrupted run, where the outputs are.
pub fn report(summary: &RunSummary, out: &std::path::Path) -> String {
    let mut s = summary.table.clone();
    if let Some((first, last)) = summary.eval_first_last {
        s += &format!(
            "eval/accuracy: {first:.3} at RL step 0 -> {last:.3} at step {}\n",
            summary.steps
        );
    }
    if summary.skipped_steps > 0 {
        s += &format!("{} steps skipped (NaN/Inf)\n", summary.skipped_steps);
    }
    if summary.interrupted {
        let at = match summary.warmup_steps {
            Some(k) => format!("warm-up step {k}"),
            None => format!("step {}", summary.steps),
        };
        s += &format!(
            "interrupted at {at}; resume with --resume {}\n",
            out.display()
        );
    }
    if let Some(dir) = &summary.exported {
        s += &format!("final policy: {}\n", dir.display());
    }
    s += &format!("metrics: {}", out.join("metrics.jsonl").display());
    s
}
