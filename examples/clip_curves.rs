//! The PPO-family clip curves (p.32 of the stale-samples lecture, docs/stale-samples.md): the
//! per-token objective against the importance ratio for A = +1 and A = −1, for every loss and
//! preset of the registry, computed by the losses themselves (PPO, Clip-Higher, dual clip, CISPO,
//! GSPO, CTPO at positions 1, 16 and 256, ...). Batch-coupled losses are listed as not drawable,
//! with the reason.
//!
//! ```text
//! cargo run --release --example clip_curves -- [--out DIR]     # default docs/img
//! ```

use anyhow::{Result, bail};
use rlft::algo::loss::LossRegistry;
use std::path::PathBuf;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let out = match args.as_slice() {
        [] => PathBuf::from("docs/img"),
        [flag, dir] if flag == "--out" => PathBuf::from(dir),
        _ => bail!("usage: clip_curves [--out DIR]"),
    };
    let (files, skipped) =
        rlft::train::plot::write_clip_curves(&LossRegistry::with_builtins(), &out)?;
    for f in files {
        println!("{}", f.display());
    }
    for n in skipped {
        println!("not drawn: {}: {}", n.loss, n.reason);
    }
    Ok(())
}
