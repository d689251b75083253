//! Runs a training recipe: the `rlft train` command, as an example.
//!
//! ```text
//! cargo run --release --example train -- recipes/quickstart.toml [--set KEY=VALUE]...
//!     [--device D] [--resume DIR]
//! ```
//! The recipe is read from the TOML file, then `RLFT__SECTION__KEY` environment variables, then
//! `--set` overrides (`--set algorithm.kl_coef=0.01`). `--resume DIR` continues from a
//! checkpoint folder or a run's `output_dir` (its latest checkpoint, or its start if it has
//! none); without a recipe file the recipe stored in the run is used, and only
//! `schedule.steps`, `eval.*`, `checkpoint.*` and `logging.*` may change. Ctrl-C writes a
//! checkpoint, then exits.

/// rlft's allocator (mimalloc, freed memory kept): `rlft::alloc`.
#[global_allocator]
static GLOBAL: rlft::alloc::Allocator = rlft::alloc::Allocator;

fn main() -> anyhow::Result<()> {
    let report = rlft::cli::train(std::env::args().skip(1))?;
    println!("{report}");
    Ok(())
}
