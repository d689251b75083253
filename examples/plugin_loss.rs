//! A policy loss defined outside rlft's crates, with settings of its own read from the recipe:
//! the clamped-IS policy gradient `−sg(clamp(ρ, floor, cap))·A·log πθ`, whose two settings live
//! in `[algorithm.clamped_is_pg]`.
//!
//! ```text
//! cargo run --release --example plugin_loss -- [--steps N] [--set KEY=VALUE]... [--keys]
//! ```
//! Trains from `recipes/plugin-loss.toml` (the quickstart's tiny model from scratch) into
//! `runs/plugin_loss`, starting afresh; `--set` overrides any recipe key as in `rlft train`
//! (`--set algorithm.clamped_is_pg.cap=3`). `--keys` prints the recipe reference of this binary,
//! with the loss's settings in it. The built-in `rlft train` refuses the recipe, listing the
//! losses it knows.

use anyhow::Result;
use rlft::algo::loss::{
    LossContext, LossRegistry, LossSettings, LossTerms, PolicyLoss, SettingError,
};
use rlft::cli::Args;
use rlft::train::launch::{self, TrainCommand};
use rlft::train::recipe::reference;
use serde::{Deserialize, Serialize};

/// rlft's allocator (mimalloc, freed memory kept): `rlft::alloc`.
#[global_allocator]
static GLOBAL: rlft::alloc::Allocator = rlft::alloc::Allocator;

/// `[algorithm.clamped_is_pg]`: where the importance weight is clamped.
#[derive(schemars::JsonSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClampedIsSettings {
    /// Upper clamp of the importance weight ρ = πθ/π_old (at least 1).
    pub cap: f64,
    /// Lower clamp of the importance weight (in [0, 1]; 0: no floor).
    pub floor: f64,
}

impl Default for ClampedIsSettings {
    fn default() -> Self {
        Self {
            cap: 2.0,
            floor: 0.0,
        }
    }
}

impl LossSettings for ClampedIsSettings {
    const SECTION: &'static str = "clamped_is_pg";

    fn check(&self) -> Result<(), SettingError> {
        if !(self.cap.is_finite() && self.cap >= 1.0) {
            return Err(SettingError::new(
                "cap",
                format!("must be finite and ≥ 1, got {}", self.cap),
            ));
        }
        if !(0.0..=1.0).contains(&self.floor) {
            return Err(SettingError::new(
                "floor",
                format!("must be in [0, 1], got {}", self.floor),
            ));
        }
        Ok(())
    }
}

/// `L = −sg(clamp(ρ, floor, cap))·A·log πθ`: every token keeps its gradient (like CISPO), with
/// an importance weight bounded on both sides. Clip fractions: tokens whose ρ fell below the
/// floor (`clip_frac/low`) or rose above the cap (`clip_frac/high`).
#[derive(Debug, Clone)]
pub struct ClampedIsPg {
    /// The settings.
    pub settings: ClampedIsSettings,
}

impl PolicyLoss for ClampedIsPg {
    fn terms(&self, ctx: &LossContext<'_>) -> rlft::algo::Result<LossTerms> {
        let ClampedIsSettings { cap, floor } = self.settings;
        let ratio = ctx.ratio();
        let weight = ratio.clone().clamp(floor, cap).detach();
        let loss = (weight * ctx.input.advantages.clone() * ctx.input.log_prob.clone()).neg();
        let mut terms = LossTerms::per_token(loss);
        terms.clip_frac_low = Some(ctx.fraction(ratio.clone().lower_elem(floor)));
        terms.clip_frac_high = Some(ctx.fraction(ratio.clone().greater_elem(cap)));
        terms.ratio = Some(ratio);
        Ok(terms)
    }
}

/// The built-in losses and `clamped_is_pg`.
pub fn registry() -> LossRegistry {
    let mut registry = LossRegistry::with_builtins();
    registry.register_with_settings("clamped_is_pg", |settings| Ok(ClampedIsPg { settings }));
    registry
}

/// The command line (without the program name): the report to print, or the recipe reference.
fn run(args: impl IntoIterator<Item = String>) -> Result<String> {
    let args = Args::from_iter(args, &[("steps", true), ("set", true), ("keys", false)])
        .map_err(anyhow::Error::msg)?;
    if args.flag("keys") {
        return Ok(reference::reference_markdown_with(&registry()));
    }
    let mut overrides = Vec::new();
    if let Some(steps) = args.value("steps") {
        let steps: usize = steps
            .parse()
            .map_err(|e| anyhow::anyhow!("--steps {steps}: {e}"))?;
        overrides.push(format!("schedule.steps={steps}"));
    }
    overrides.extend(args.values("set").iter().cloned());
    let cmd = TrainCommand {
        recipe: Some("recipes/plugin-loss.toml".into()),
        overrides,
        registry: registry(),
        ..TrainCommand::default()
    };
    let recipe = cmd.recipe()?;
    // A rerun starts afresh.
    if recipe.output_dir.exists() {
        std::fs::remove_dir_all(&recipe.output_dir)?;
    }
    // Under `[distributed] backend = "mpi"`, ranks past the first report nothing.
    Ok(match cmd.run(recipe, None)? {
        Some((summary, out)) => launch::report(&summary, &out),
        None => String::new(),
    })
}

fn main() -> Result<()> {
    println!("{}", run(std::env::args().skip(1))?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    /// The loss's settings are recipe keys of this binary, checked with their ranges, and it
    /// trains from its recipe.
    #[test]
    fn trains_from_its_recipe_with_its_own_settings() {
        let keys = run(args(&["--keys"])).unwrap();
        for key in [
            "algorithm.clamped_is_pg.cap",
            "algorithm.clamped_is_pg.floor",
        ] {
            assert!(
                keys.contains(&format!("| `{key}` |")),
                "{key} not in the reference"
            );
        }
        let err = run(args(&["--set", "algorithm.clamped_is_pg.cap=0.5"]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("algorithm.clamped_is_pg.cap"), "{err}");
        let out = std::env::temp_dir().join(format!("rlft-plugin-loss-{}", std::process::id()));
        let smoke = [
            format!("output_dir=\"{}\"", out.display()),
            "device=\"flex\"".into(),
            "sft.steps=2".into(),
            "sft.batch_size=4".into(),
            "rollout.prompts_per_step=2".into(),
            "rollout.group_size=2".into(),
            "eval.size=4".into(),
            "eval.k=1".into(),
            "logging.progress=false".into(),
            "algorithm.clamped_is_pg.floor=0.5".into(),
        ];
        let mut a = args(&["--steps", "2"]);
        for s in smoke {
            a.extend(["--set".to_string(), s]);
        }
        let report = run(a).unwrap();
        assert!(report.contains("eval/accuracy"), "{report}");
        let metrics = rlft::train::metrics::read_metrics(&out.join("metrics.jsonl")).unwrap();
        assert_eq!(metrics.len(), 3);
        assert!(metrics[1].contains_key("clip_frac/low"));
        std::fs::remove_dir_all(&out).ok();
    }
}
