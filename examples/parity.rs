//! Checks rlft against verl's golden cases.
//!
//! ```text
//! cargo run --release --example parity -- [DIR] [--f32]
//! ```
//! DIR defaults to `$RLFT_GOLDEN_DIR`, then `../shared/golden`. Prints each failure with its case
//! id and ends with `N passed, M failed, K skipped`; exits non-zero when any case fails.

use rlft::parity::{Options, golden_dir, run_dir};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let f32 = args.iter().any(|a| a == "--f32");
    let dir = args
        .iter()
        .find(|a| !a.starts_with("--"))
        .map(String::as_str);
    let opts = if f32 { Options::f32() } else { Options::f64() };
    let dir = golden_dir(dir);
    let report = run_dir(&dir, &opts)?;
    println!("{}", report.render());
    let (_, failed, _) = report.counts();
    if failed > 0 {
        std::process::exit(1);
    }
    Ok(())
}
