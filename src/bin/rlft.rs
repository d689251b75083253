//! The rlft command line.
//!
//! ```text
//! rlft train RECIPE.toml [--set KEY=VALUE]... [--device D] [--resume DIR]
//! rlft train --resume DIR [--set KEY=VALUE]...
//! ```
//! The recipe is read from the TOML file, then `RLFT__SECTION__KEY` environment variables, then
//! `--set` overrides. `--resume DIR` continues a run from its output_dir (its latest checkpoint,
//! or its start if it has none) or from one of its checkpoint folders, with the recipe stored
//! in the run; only `schedule.steps`, `eval.*`, `checkpoint.*` and `logging.*` may be changed
//! at resume. Ctrl-C writes a checkpoint, then exits; a second Ctrl-C exits at once.
//!
//! Exit status: 0 on success, 1 when the run fails (the message says why and what to do), 2 on a
//! bad command line.

use std::process::ExitCode;

const HELP: &str = "rlft: reinforcement-learning fine-tuning of language models

usage: rlft train RECIPE.toml [--set KEY=VALUE]... [--device D] [--resume DIR]
       rlft train --resume DIR [--set KEY=VALUE]...
       rlft --version";

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    match args.next().as_deref() {
        Some("train") => match rlft::cli::train(args) {
            Ok(report) => {
                println!("{report}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                match e {
                    rlft::train::TrainError::Usage(_) => ExitCode::from(2),
                    _ => ExitCode::FAILURE,
                }
            }
        },
        Some("--version" | "-V") => {
            println!(
                "rlft {} (burn {})",
                env!("CARGO_PKG_VERSION"),
                rlft::BURN_VERSION
            );
            ExitCode::SUCCESS
        }
        Some("--help" | "-h" | "help") => {
            println!("{HELP}");
            ExitCode::SUCCESS
        }
        Some(other) => {
            eprintln!("error: unknown command '{other}'; the command is 'train'\n\n{HELP}");
            ExitCode::from(2)
        }
        None => {
            eprintln!("{HELP}");
            ExitCode::from(2)
        }
    }
}
