//! Checks rlft against golden reference cases (verl 0.9.1, the CTPO authors' code, and TRL,
//! slime, AReaL, ROLL and prime-rl for the frontier off-policy variants).
//!
//! ```text
//! cargo run --release --example parity -- [DIR] [--f32]
//! ```
//! DIR is any directory of `rl-golden/v1` cases; it defaults to the verl set kept in this
//! repository (`tests/golden/verl`; also there: `tests/golden/offpolicy`, `tests/golden/ctpo`,
//! `tests/golden/frontier`).
//! Prints each failure and skip with its case id and ends with `N passed, M failed, K skipped`;
//! exits non-zero when any case fails.

use rlft_parity::{Options, golden_dir, run_dir};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let f32 = args.iter().any(|a| a == "--f32");
    let dir = args
        .iter()
        .find(|a| !a.starts_with("--"))
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| golden_dir("verl"));
    let opts = if f32 { Options::f32() } else { Options::f64() };
    let report = run_dir(&dir, &opts)?;
    println!("{}", report.render());
    let (_, failed, _) = report.counts();
    if failed > 0 {
        std::process::exit(1);
    }
    Ok(())
}
