//! Runs a training recipe.
//!
//! ```text
//! cargo run --release --example train -- recipes/quickstart.toml [--set KEY=VALUE]...
//!     [--device D] [--resume DIR]
//! ```
//! The recipe is read from the TOML file, then `RLFT__SECTION__KEY` environment variables, then
//! `--set` overrides (`--set algorithm.kl_coef=0.01`). `--resume DIR` continues from a
//! checkpoint folder or a run's `output_dir` (its latest checkpoint); without a recipe file the
//! recipe stored in the checkpoint is used. Ctrl-C writes a checkpoint, then exits.

use anyhow::{Context, Result};
use rlft::cli::Args;
use rlft::train::{Recipe, Trainer, checkpoint};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

fn main() -> Result<()> {
    let args = Args::parse(&[("set", true), ("device", true), ("resume", true)])
        .map_err(anyhow::Error::msg)?;
    let mut overrides = args.values("set").to_vec();
    if let Some(d) = args.value("device") {
        overrides.push(format!("device=\"{d}\""));
    }
    let resume = args.value("resume").map(Path::new);
    let recipe = match (args.positional.first(), resume) {
        (Some(path), _) => Recipe::load(Path::new(path), &overrides)?,
        (None, Some(dir)) => {
            let state = checkpoint::read_state(&checkpoint::locate(dir)?)?;
            Recipe::from_toml_str(&state.recipe, &overrides)?
        }
        (None, None) => anyhow::bail!(
            "usage: train RECIPE.toml [--set KEY=VALUE]... [--device D] [--resume DIR]"
        ),
    };
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    ctrlc::set_handler(move || {
        if flag.swap(true, Ordering::SeqCst) {
            std::process::exit(130);
        }
        eprintln!(
            "\nstopping after this step (a checkpoint will be written); Ctrl-C again to abort"
        );
    })
    .context("installing the Ctrl-C handler")?;
    let out = recipe.output_dir.clone();
    let mut trainer = Trainer::new(recipe, resume)?;
    let summary = trainer.run(Some(stop))?;
    println!("{}", summary.table);
    if let Some((first, last)) = summary.eval_first_last {
        println!(
            "eval/accuracy: {first:.3} at RL step 0 -> {last:.3} at step {}",
            summary.steps
        );
    }
    if summary.skipped_steps > 0 {
        println!("{} steps skipped (NaN/Inf)", summary.skipped_steps);
    }
    if summary.interrupted {
        println!(
            "interrupted at step {}; resume with --resume {}",
            summary.steps,
            out.display()
        );
    }
    if let Some(dir) = summary.exported {
        println!("final policy: {}", dir.display());
    }
    println!("metrics: {}", out.join("metrics.jsonl").display());
    Ok(())
}
