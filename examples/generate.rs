//! Streams a completion from a model.
//!
//! ```text
//! cargo run --release --example generate -- --model PATH (--prompt TEXT | --chat TEXT)
//!     [--max-new-tokens N] [--temperature T] [--top-p P] [--top-k K] [--seed S] [--device D]
//! ```
//! PATH is an HF checkpoint folder or a `.gguf` file. `--chat` wraps the text in the model's chat
//! template as a user turn. Temperature 0 (the default, as in transformers' `generate`) is greedy
//! decoding. Generation stops at the tokenizer's EOS or after `--max-new-tokens` (default 128).

mod common;

use anyhow::{Result, bail};
use rlft::cli::Args;
use rlft::rollout::{Sampler, SamplingConfig};
use std::io::Write;

fn main() -> Result<()> {
    let args = Args::parse(&[
        ("model", true),
        ("prompt", true),
        ("chat", true),
        ("max-new-tokens", true),
        ("temperature", true),
        ("top-p", true),
        ("top-k", true),
        ("seed", true),
        ("device", true),
    ])
    .map_err(anyhow::Error::msg)?;
    let device = common::device(&args)?;
    let p = common::load(&args, &device)?;
    let ids = match (args.value("prompt"), args.value("chat")) {
        (Some(t), None) => common::prompt_ids(&p, t, false)?,
        (None, Some(t)) => common::prompt_ids(&p, t, true)?,
        _ => bail!("give exactly one of --prompt TEXT or --chat TEXT"),
    };
    let cfg = SamplingConfig::new()
        .with_max_new_tokens(
            args.get("max-new-tokens", 128)
                .map_err(anyhow::Error::msg)?,
        )
        .with_temperature(args.get("temperature", 0.0).map_err(anyhow::Error::msg)?)
        .with_top_p(args.get("top-p", 1.0).map_err(anyhow::Error::msg)?)
        .with_top_k(args.get("top-k", 0).map_err(anyhow::Error::msg)?)
        .with_seed(args.get("seed", 0).map_err(anyhow::Error::msg)?);
    let mut stream = p.tokenizer.decode_stream(true);
    let mut out = std::io::stdout().lock();
    let start = std::time::Instant::now();
    let completions =
        Sampler::new(&p.model, Some(&p.tokenizer)).generate_with(&[ids], &cfg, |t| {
            if let Ok(Some(text)) = stream.step(t.draw.token as u32) {
                let _ = write!(out, "{text}");
                let _ = out.flush();
            }
            std::ops::ControlFlow::Continue(())
        })?;
    let c = &completions[0];
    let secs = start.elapsed().as_secs_f64();
    eprintln!(
        "\n[{} tokens, {:?}, {:.1} tokens/s]",
        c.tokens.len(),
        c.finish_reason,
        c.tokens.len() as f64 / secs
    );
    Ok(())
}
