//! The rlft command line.
//!
//! ```text
//! rlft train RECIPE.toml [--set KEY=VALUE]... [--device D] [--resume DIR]
//! rlft train --resume DIR [--set KEY=VALUE]...
//! rlft export SOURCE (--gguf OUT.gguf [--type f32|f16|q8_0] | --hf DIR) [--force]
//! rlft serve MODEL [--host 127.0.0.1] [--port 8000] [--device D] [--api-key KEY] ...
//! rlft recipe keys
//! ```
//! The recipe is read from the TOML file, then `RLFT__SECTION__KEY` environment variables, then
//! `--set` overrides. `--resume DIR` continues a run from its output_dir (its latest checkpoint,
//! or its start if it has none) or from one of its checkpoint folders, with the recipe stored
//! in the run; only `schedule.steps`, `eval.*`, `checkpoint.*` and `logging.*` may be changed
//! at resume. Ctrl-C writes a checkpoint, then exits; a second Ctrl-C exits at once.
//!
//! Exit status: 0 on success, 1 when the run fails (the message says why and what to do), 2 on a
//! bad command line, 3 when a rollout worker of an asynchronous run fails (`rollout worker N
//! failed: …`).

use std::process::ExitCode;

const HELP: &str = "rlft: reinforcement-learning fine-tuning of language models

usage: rlft train RECIPE.toml [--set KEY=VALUE]... [--device D] [--resume DIR]
       rlft train --resume DIR [--set KEY=VALUE]...
       rlft export SOURCE (--gguf OUT.gguf [--type f32|f16|q8_0] | --hf DIR) [--force]
                             the model of a run folder (its final/, else its latest checkpoint),
                             a checkpoint, an HF folder or a GGUF file, LoRA merged; GGUF for
                             llama, qwen2 and qwen3; a new file or a new or empty folder
                             (--force: replace an existing file or write into a folder)
       rlft serve MODEL [--host 127.0.0.1] [--port 8000] [--device D] [--api-key KEY] ...
                             serve MODEL (what export takes) with OpenAI's completions
                             protocol and SGLang's /update_weights_from_disk; `rlft serve --help`
       rlft recipe keys      every recipe key: type, default, allowed values, meaning (Markdown)
       rlft --version";

#[global_allocator]
static GLOBAL: rlft::alloc::Allocator = rlft::alloc::Allocator;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    match args.next().as_deref() {
        Some("train") => match rlft::cli::train(args) {
            Ok(report) => {
                if !report.is_empty() {
                    println!("{report}");
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(e.exit_code())
            }
        },
        Some("export") => match rlft::cli::export(args) {
            Ok(line) => {
                println!("{line}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(e.exit_code())
            }
        },
        Some("serve") => match rlft::cli::serve(args, |line| {
            println!("{line}");
            let _ = std::io::Write::flush(&mut std::io::stdout());
        }) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(e.exit_code())
            }
        },
        Some("recipe") => match (args.next().as_deref(), args.next()) {
            (Some("keys"), None) => {
                print!("{}", rlft::train::recipe::reference::reference_markdown());
                ExitCode::SUCCESS
            }
            _ => {
                eprintln!("error: the recipe command is 'rlft recipe keys'\n\n{HELP}");
                ExitCode::from(2)
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
            eprintln!(
                "error: unknown command '{other}'; the commands are 'train', 'export', 'serve' and 'recipe keys'\n\n{HELP}"
            );
            ExitCode::from(2)
        }
        None => {
            eprintln!("{HELP}");
            ExitCode::from(2)
        }
    }
}
