//! A downstream trainer adding its own reward term and its own policy loss through the library
//! API, then training with them.
//!
//! ```text
//! cargo run --release --example custom_reward [-- --steps N]
//! ```
//! The reward adds a bonus for answers written without extra text; the loss is a truncated-IS
//! policy gradient `−sg(min(ρ, C))·A·log πθ` registered next to the built-ins. The run trains
//! from `recipes/custom-loss.toml` (the quickstart's tiny model from scratch), whose
//! `algorithm.loss` names the registered loss; it writes to `runs/custom_reward`.

mod common;

use anyhow::Result;
use common::TruncatedIsPg;
use rlft::algo::loss::LossRegistry;
use rlft::cli::Args;
use rlft::rollout::{Reward, RewardInput};
use rlft::train::{Extensions, Recipe, Trainer};
use std::path::Path;
use std::sync::Arc;

/// +1 when the completion is nothing but the number.
struct Terse;

impl Reward for Terse {
    fn name(&self) -> &str {
        "terse"
    }
    fn score(&self, x: &RewardInput) -> Result<f64, String> {
        let t = x.completion.trim();
        Ok(f64::from(u8::from(
            !t.is_empty() && t.parse::<i64>().is_ok(),
        )))
    }
}

fn main() -> Result<()> {
    let args = Args::parse(&[("steps", true)]).map_err(anyhow::Error::msg)?;
    let steps: usize = args.get("steps", 20).map_err(anyhow::Error::msg)?;
    let recipe = Recipe::load(
        Path::new("recipes/custom-loss.toml"),
        &[format!("schedule.steps={steps}")],
    )?;
    // A rerun starts afresh.
    if recipe.output_dir.exists() {
        std::fs::remove_dir_all(&recipe.output_dir)?;
    }
    let mut registry = LossRegistry::with_builtins();
    registry.register("truncated_is_pg", TruncatedIsPg { cap: 2.0 });
    let ext = Extensions {
        registry,
        rewards: vec![(0.2, Arc::new(Terse) as Arc<dyn Reward>)],
        ..Extensions::default()
    };
    let summary = Trainer::with_extensions(recipe, None, ext)?.run(None)?;
    println!("{}", summary.table);
    if let Some((a, b)) = summary.eval_first_last {
        println!("eval/accuracy {a:.3} -> {b:.3} with a custom reward and loss");
    }
    Ok(())
}
