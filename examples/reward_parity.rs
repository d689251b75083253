//! Checks the Rust ports of verl's reward scorers (`gsm8k_strict`, `gsm8k_flexible`,
//! `math_boxed`, `math_dapo`, `qa_em`) against golden cases scored by verl 0.9.1.
//!
//! ```text
//! cargo run --release --example reward_parity -- [FILE]
//! ```
//! FILE is a JSONL file of cases, one a line:
//! `{"id", "scorer", "solution_str", "ground_truth", "expected": {"score", "acc"?, "pred"?}}`;
//! it defaults to the set kept in this repository (`tests/data/golden-rewards/cases.jsonl`).
//! Prints each failure (id, scorer, expected and got) and ends with `N passed, M failed`;
//! exits with status 1 when a case fails or the file cannot be used.

use rlft::rollout::scorers::check_golden_file;
use std::path::PathBuf;

fn main() {
    match run() {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(1);
        }
    }
}

/// Whether every case passed.
fn run() -> anyhow::Result<bool> {
    let mut args = std::env::args().skip(1);
    let path = args.next().map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/golden-rewards/cases.jsonl")
    });
    if let Some(extra) = args.next() {
        anyhow::bail!("unexpected argument {extra:?}; usage: reward_parity [FILE]");
    }
    let report = check_golden_file(&path)?;
    for failure in &report.failures {
        println!("FAIL {failure}");
    }
    println!("{}", report.summary());
    Ok(report.failures.is_empty())
}
