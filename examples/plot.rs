//! Writes PNG curves of a run's `metrics.jsonl` next to it.
//!
//! ```text
//! cargo run --release --example plot -- OUTPUT_DIR
//! ```

use anyhow::{Result, bail};
use std::path::Path;

fn main() -> Result<()> {
    let Some(dir) = std::env::args().nth(1) else {
        bail!("usage: plot OUTPUT_DIR (a folder with metrics.jsonl)");
    };
    let dir = Path::new(&dir);
    let metrics = dir.join("metrics.jsonl");
    if !metrics.exists() {
        bail!("{} not found", metrics.display());
    }
    for f in rlft::train::plot::plot_metrics(&metrics, dir)? {
        println!("{}", f.display());
    }
    Ok(())
}
