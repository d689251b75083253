//! Fig. 1 of the stale-samples lecture (docs/stale-samples.md) on a real run: train with samples
//! drawn by a policy k versions old (the lagged testbed, `async.mode = "lagged"`, π_old recomputed
//! at every step), score them with the current policy, and draw the cumulative log-ratio `log Π
//! πθ/μ` by token position: near 0 (ratio near 1) for the first tokens, fanning out further into
//! the response, the more so the older the sampler. `examples/staleness_numbers.rs` computes the
//! lecture's worked numbers; this one measures.
//!
//! ```text
//! cargo run --release --example staleness -- [--recipe R] [--lags 0,4] [--steps N] [--out DIR]
//!     default: recipes/grpo-smollm2-arith.toml (./scripts/fetch-smollm2.sh), lags 0,4, 8 steps,
//!     docs/img
//! ```
//! The fan needs responses long enough to span several position buckets (1-8, 9-16, 17-32, ...):
//! the quickstart's answers of a few tokens give one bucket only, and the example says so.
//! Writes `staleness_fan_lag<k>.png` (and `.svg`) per lag into DIR, and prints the fan's width
//! (p95 − p5 of the cumulative log-ratio) in the first and the last position bucket.

use anyhow::{Context, Result, bail};
use rlft::train::{Recipe, Trainer};
use std::path::PathBuf;

/// rlft's allocator (mimalloc, freed memory kept): `rlft::alloc`.
#[global_allocator]
static GLOBAL: rlft::alloc::Allocator = rlft::alloc::Allocator;

fn main() -> Result<()> {
    let mut recipe = PathBuf::from("recipes/grpo-smollm2-arith.toml");
    let mut lags = vec![0usize, 4];
    let mut steps: Option<usize> = Some(8);
    let mut out = PathBuf::from("docs/img");
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--recipe" => recipe = value()?.into(),
            "--lags" => {
                lags = value()?
                    .split(',')
                    .map(|s| s.trim().parse())
                    .collect::<Result<_, _>>()
                    .context("--lags: comma-separated integers, e.g. 0,2,8")?
            }
            "--steps" => steps = Some(value()?.parse().context("--steps: an integer")?),
            "--out" => out = value()?.into(),
            other => bail!("unknown argument {other}; see the file's header for usage"),
        }
    }
    std::fs::create_dir_all(&out)?;
    let scratch = std::env::temp_dir().join(format!("rlft-staleness-{}", std::process::id()));
    for lag in lags {
        let dir = scratch.join(format!("lag{lag}"));
        let _ = std::fs::remove_dir_all(&dir);
        let mut sets = vec![
            format!("output_dir=\"{}\"", dir.display()),
            "async.mode=\"lagged\"".to_string(),
            format!("async.lag={lag}"),
            // π_old is recomputed at every step, so every step compares it with μ.
            "algorithm.correction.mode=\"recompute\"".into(),
            "logging.progress=false".into(),
            "checkpoint.export_final=false".into(),
        ];
        if let Some(n) = steps {
            sets.push(format!("schedule.steps={n}"));
        }
        let r = Recipe::load(&recipe, &sets)?;
        Trainer::new(r, None)?.run(None)?;
        rlft::train::plot::plot_run(&dir, None)?;
        let fan = dir.join("ratio_fan.png");
        if !fan.exists() {
            bail!(
                "the run wrote no off-policy position metrics (offpolicy/pos/*): is the correction mode off?"
            );
        }
        for ext in ["png", "svg"] {
            let to = out.join(format!("staleness_fan_lag{lag}.{ext}"));
            std::fs::copy(dir.join(format!("ratio_fan.{ext}")), &to)?;
            if ext == "png" {
                println!("{}", to.display());
            }
        }
        let rows = rlft::train::metrics::read_metrics(&dir.join("metrics.jsonl"))?;
        let width = |bucket: &str| -> Option<f64> {
            let w: Vec<f64> = rows
                .iter()
                .filter_map(|m| {
                    let q = |p: &str| m.get(&format!("offpolicy/pos/cum/{bucket}/{p}"))?.as_f64();
                    Some(q("p95")? - q("p5")?)
                })
                .collect();
            (!w.is_empty()).then(|| w.iter().sum::<f64>() / w.len() as f64)
        };
        let buckets: std::collections::BTreeSet<String> = rows
            .iter()
            .flat_map(|m| m.keys())
            .filter_map(|k| {
                k.strip_prefix("offpolicy/pos/cum/")?
                    .split('/')
                    .next()
                    .map(String::from)
            })
            .collect();
        let mut buckets: Vec<String> = buckets.into_iter().collect();
        buckets.sort_by_key(|b| b.split('-').next().and_then(|x| x.parse::<u64>().ok()));
        if buckets.len() == 1 {
            eprintln!(
                "note: the responses span one position bucket only ({}): too short to show a fan; \
                 use a recipe with longer responses",
                buckets[0]
            );
        }
        if let (Some(first), Some(last)) = (buckets.first(), buckets.last()) {
            println!(
                "lag {lag}: mean fan width (p95 - p5 of log Π πθ/μ) {first}: {:.4}, {last}: {:.4}",
                width(first).unwrap_or(f64::NAN),
                width(last).unwrap_or(f64::NAN)
            );
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(())
}
