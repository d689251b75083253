//! Draws a run's pictures into its folder: one curve per metric, and where the run has their
//! data the cumulative-ratio fan (`ratio_fan`), the staleness histogram (`staleness`), the
//! off-policy curves (`offpolicy`) and the timeline of `events.jsonl` (`timeline`; with a second
//! run folder, the two timelines one above the other, e.g. a sync and an async run). With
//! `--report`, also `report.html`: a summary table, every picture inlined and the recipe, in one
//! file that opens offline.
//!
//! ```text
//! cargo run --release --example plot -- RUN [OTHER_RUN] [--report]
//! ```

use anyhow::{Result, bail};
use std::path::Path;

fn main() -> Result<()> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let report = args.iter().any(|a| a == "--report");
    args.retain(|a| a != "--report");
    if let Some(flag) = args.iter().find(|a| a.starts_with("--")) {
        bail!("unknown option {flag}; usage: plot RUN [OTHER_RUN] [--report]");
    }
    let Some(dir) = args.first() else {
        bail!("usage: plot RUN [OTHER_RUN] [--report] (run folders with metrics.jsonl)");
    };
    let dir = Path::new(dir);
    if !dir.join("metrics.jsonl").exists() {
        bail!("{} not found", dir.join("metrics.jsonl").display());
    }
    let pictures = rlft::train::plot::plot_run(dir, args.get(1).map(Path::new))?;
    for f in &pictures {
        println!("{}", f.display());
    }
    if report {
        println!(
            "{}",
            rlft::train::plot::write_report(dir, &pictures)?.display()
        );
    }
    Ok(())
}
