//! The `rlft train` command (the `rlft` binary and the `train` example share it): which recipe
//! a command line means, Ctrl-C, and the report printed at the end.
//!
//! Without `--resume` the recipe file, then `RLFT__…` environment variables, then `--set`
//! overrides make the effective recipe. With `--resume DIR` the run's stored recipe is the base
//! (or the recipe file, if one is given) and the result must equal the stored one except for
//! [`crate::recipe::RESUMABLE_KEYS`].

use crate::checkpoint;
use crate::distributed::DistributedBackend;
use crate::distributed::group::ProcessGroup;
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
    /// end, or until `stop` is set. Under `[distributed] backend = "mpi"` this process is one of
    /// the learner's ranks: rank 0 runs the trainer, the others follow it
    /// ([`crate::follower`]) and return `None` (they write nothing).
    ///
    /// # Errors
    /// Everything [`Trainer::new`] and [`Trainer::run`] report; `mpi` in a build without the
    /// `mpi` feature, or outside an MPI launcher.
    pub fn run(
        &self,
        recipe: Recipe,
        stop: Option<Arc<AtomicBool>>,
    ) -> Result<Option<(RunSummary, PathBuf)>> {
        match recipe.distributed.backend {
            DistributedBackend::Threads => self.lead(recipe, stop, None).map(Some),
            DistributedBackend::Mpi => self.run_mpi(recipe, stop),
        }
    }

    /// The trainer's run, as the only rank or as rank 0 of `group`.
    fn lead(
        &self,
        recipe: Recipe,
        stop: Option<Arc<AtomicBool>>,
        group: Option<Arc<dyn ProcessGroup>>,
    ) -> Result<(RunSummary, PathBuf)> {
        let ext = Extensions {
            registry: self.registry.clone(),
            group: group.clone(),
            ..Extensions::default()
        };
        let mut trainer = Trainer::with_extensions(recipe, self.resume.as_deref(), ext)?;
        let out = trainer.output_dir().to_path_buf();
        let summary = trainer.run(stop)?;
        if group.is_some() {
            let t = trainer.stop_ranks()?;
            eprintln!(
                "optimizer state per learner rank: {:?} bytes",
                t.optimizer_bytes
            );
            eprintln!("sent per learner rank: {:?} bytes", t.sent_bytes);
        }
        Ok((summary, out))
    }

    #[cfg(feature = "mpi")]
    fn run_mpi(
        &self,
        recipe: Recipe,
        stop: Option<Arc<AtomicBool>>,
    ) -> Result<Option<(RunSummary, PathBuf)>> {
        use crate::distributed::mpi::MpiGroup;
        let mpi = Arc::new(MpiGroup::init(&recipe.distributed)?);
        let group: Arc<dyn ProcessGroup> = mpi.clone();
        let result = match mpi.rank() {
            0 => self.lead(recipe, stop, Some(group.clone())).map(Some),
            _ => crate::follower::Follower::new(recipe, &self.registry, group.clone())
                .and_then(crate::follower::Follower::run)
                .map(|_| None),
        };
        drop(group);
        match result {
            Ok(done) => {
                mpi.finish();
                Ok(done)
            }
            // The other ranks may wait in a collective for this one: stop them all.
            Err(e) => mpi.abort(&e),
        }
    }

    #[cfg(not(feature = "mpi"))]
    fn run_mpi(
        &self,
        _recipe: Recipe,
        _stop: Option<Arc<AtomicBool>>,
    ) -> Result<Option<(RunSummary, PathBuf)>> {
        Err(TrainError::Usage(
            "distributed.backend = \"mpi\" needs rlft built with the mpi feature: install an \
             MPI library and libclang (Debian: apt install openmpi-bin libopenmpi-dev \
             libclang-dev), build with cargo build --release --features mpi, and launch every \
             rank with mpirun -np N target/release/rlft train RECIPE"
                .into(),
        ))
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
