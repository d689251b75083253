//! Sync vs async training projected by a discrete-event simulation whose parameters come only
//! from measured runs (`rlft_train::sim`): per-token generation and training seconds from a
//! sync run's `events.jsonl` (and, for the two sides sharing this machine's cores, from a run
//! that gave each side its share: an async η = 0 run with one thread per side), the batch size
//! and a log-normal response-length distribution fitted to the run's lengths.
//!
//! Prints the projected speed-up over sync (`N.NNx`) and the learner's and rollout devices' idle
//! fractions for 1–64 rollout devices and η ∈ {0, 1, 2, 4, 8}, writes `async_sim.png`, and
//! with `--validate`, compares the projection for this machine's own configuration (one worker
//! sharing the cores) with the speed-up each given async run measured. Nothing is fitted to the
//! async runs: they only supply the measured ratio.
//!
//! ```text
//! scripts/async_throughput.sh 6     # the runs: sync, async eta 0/1/2/4 (SmolLM2, ~15 min)
//! cargo run --release --example async_sim -- runs/async_throughput/sync \
//!     --shared runs/async_throughput/async-eta0 \
//!     --validate runs/async_throughput/async-eta1,runs/async_throughput/async-eta2,runs/async_throughput/async-eta4 \
//!     [--out docs/img] [--steps 400] [--seed 0]
//! ```

use anyhow::{Context, Result, bail};
use rlft::train::Recipe;
use rlft::train::sim::{Costs, simulate};
use std::path::{Path, PathBuf};

const DEVICES: [usize; 7] = [1, 2, 4, 8, 16, 32, 64];
const ETAS: [usize; 5] = [0, 1, 2, 4, 8];

/// Mean `time/step_s` over a run's steps after the first (the first includes start-up).
fn measured_step_s(run: &Path) -> Result<f64> {
    let rows = rlft::train::metrics::read_metrics(&run.join("metrics.jsonl"))?;
    let v: Vec<f64> = rows
        .iter()
        .filter(|m| {
            m.get("step")
                .and_then(|s| s.as_u64())
                .is_some_and(|s| s > 1)
        })
        .filter_map(|m| m.get("time/step_s")?.as_f64())
        .collect();
    if v.is_empty() {
        bail!(
            "{}: no steps after the first in metrics.jsonl",
            run.display()
        );
    }
    Ok(v.iter().sum::<f64>() / v.len() as f64)
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let mut sync: Option<PathBuf> = None;
    let (mut shared, mut validate) = (None, Vec::new());
    let (mut out, mut steps, mut seed) = (PathBuf::from("docs/img"), 400usize, 0u64);
    while let Some(a) = args.next() {
        let mut value = || args.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--shared" => shared = Some(PathBuf::from(value()?)),
            "--validate" => validate = value()?.split(',').map(PathBuf::from).collect(),
            "--out" => out = value()?.into(),
            "--steps" => steps = value()?.parse().context("--steps: an integer")?,
            "--seed" => seed = value()?.parse().context("--seed: an integer")?,
            flag if flag.starts_with("--") => bail!("unknown option {flag}"),
            run => sync = Some(run.into()),
        }
    }
    let sync =
        sync.context("usage: async_sim SYNC_RUN [--shared RUN] [--validate RUN,...] [--out DIR]")?;
    let c = Costs::from_runs(&sync, shared.as_deref())?;
    println!(
        "measured: generate {:.2} ms/token, train {:.2} ms/token (shared: {:.2} and {:.2}), \
         score {:.3} s, publish {:.3} s, {} sequences per batch, lengths mean {:.1} sigma {:.2} max {:.0}",
        1e3 * c.gen_s_per_token,
        1e3 * c.train_s_per_token,
        1e3 * c.shared_gen_s_per_token,
        1e3 * c.shared_train_s_per_token,
        c.score_s,
        c.publish_s,
        c.batch_seqs,
        c.lengths.mean,
        c.lengths.sigma,
        c.lengths.max
    );
    println!(
        "\nprojected speed-up over sync (rollout devices of their own; learner idle / rollout idle):"
    );
    print!("{:>8}", "devices");
    for eta in ETAS {
        print!("{:>22}", format!("eta = {eta}"));
    }
    println!();
    let mut lines: Vec<(usize, Vec<(usize, f64)>)> =
        ETAS.iter().map(|&e| (e, Vec::new())).collect();
    let mut best = (0.0, 0, 0);
    for d in DEVICES {
        let base = simulate(&c, d, 0, false, steps, seed);
        print!("{d:>8}");
        for (i, eta) in ETAS.into_iter().enumerate() {
            let s = simulate(&c, d, eta, false, steps, seed);
            let x = base.step_s / s.step_s;
            if x > best.0 {
                best = (x, d, eta);
            }
            lines[i].1.push((d, x));
            print!(
                "{:>22}",
                format!("{x:.2}x ({:.2}/{:.2})", s.learner_idle, s.rollout_idle)
            );
        }
        println!();
    }
    println!(
        "\nlargest projected speed-up: {:.2}x with {} rollout devices and eta = {}",
        best.0, best.1, best.2
    );
    for f in rlft::train::plot::write_speedup(lines, &out)? {
        if f.extension().is_some_and(|e| e == "png") {
            println!("{}", f.display());
        }
    }
    if !validate.is_empty() {
        println!(
            "\nvalidation on this machine (one rollout worker sharing the cores with the learner):"
        );
        let sync_s = measured_step_s(&sync)?;
        let base = simulate(&c, 1, 0, false, steps, seed);
        for run in &validate {
            let r = Recipe::from_stored(&std::fs::read_to_string(run.join("recipe.toml"))?)?;
            let eta = r.asynchrony.eta();
            let workers = r.asynchrony.rollout_workers.unwrap_or(1);
            let projected = base.step_s / simulate(&c, workers, eta, true, steps, seed).step_s;
            let measured = sync_s / measured_step_s(run)?;
            println!(
                "  {}: eta = {eta}, {workers} worker(s): projected {projected:.2}x, measured {measured:.2}x",
                run.display()
            );
        }
    }
    Ok(())
}
