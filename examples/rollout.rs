//! Samples groups of responses for a built-in task and prints them with their rewards.
//!
//! ```text
//! cargo run --release --example rollout -- --model PATH --task arithmetic --group-size 8
//!     --prompts 4 [--max-new-tokens N] [--difficulty 1..3] [--temperature T] [--seed S]
//!     [--device D]
//! ```
//! Tasks: `arithmetic`, `countdown`, `calculator_tool` (multi-turn with a `calc` tool). Prompts
//! are chat-formatted when the model has a chat template. `--max-new-tokens` (default 64) is
//! capped to the model's context. The last line is `generation: X tokens/s`.

mod common;

use anyhow::Result;
use rlft::cli::Args;
use rlft::rollout::{RolloutConfig, RolloutSetup, SamplingConfig, Split, Task, TaskKind, rollout};

fn main() -> Result<()> {
    let args = Args::parse(&[
        ("model", true),
        ("task", true),
        ("group-size", true),
        ("prompts", true),
        ("max-new-tokens", true),
        ("difficulty", true),
        ("temperature", true),
        ("seed", true),
        ("device", true),
    ])
    .map_err(anyhow::Error::msg)?;
    let get = |k, d| args.get::<usize>(k, d).map_err(anyhow::Error::msg);
    let kind = TaskKind::parse(args.value("task").unwrap_or("arithmetic"))?;
    let mut task = Task::new(kind, get("difficulty", 1)? as u32)?;
    let device = common::device(&args)?;
    let p = common::load(&args, &device)?;
    task.chat = p.tokenizer.chat_template.is_some();
    let seed = args.get::<u64>("seed", 0).map_err(anyhow::Error::msg)?;
    task.seed = seed;
    let examples = task.examples(Split::Train, get("prompts", 4)?);
    let context = p.config.max_position_embeddings;
    let max_new = get("max-new-tokens", 64)?
        .min(context.saturating_sub(256))
        .max(1);
    let sampling = SamplingConfig::new()
        .with_max_new_tokens(max_new)
        .with_temperature(args.get("temperature", 1.0).map_err(anyhow::Error::msg)?);
    let cfg = RolloutConfig::new(sampling)
        .with_group_size(get("group-size", 8)?)
        .with_max_prompt_len(256)
        .with_max_total_tokens(max_new * 4);
    let env = task.environment();
    let rewards = task.rewards();
    let setup = RolloutSetup {
        tokenizer: &p.tokenizer,
        env: env.as_ref(),
        rewards: &rewards,
        cfg: &cfg,
    };
    let batch = rollout(&p.model, setup, &examples, 0, seed)?;
    for (g, group) in batch.groups.iter().enumerate() {
        println!(
            "== group {g}: {:?} (answer {})",
            group.example.prompt.user_text(),
            group.example.answer
        );
        for t in &group.trajectories {
            let reward = t.reward.map_or_else(
                || format!("failed: {:?}", t.reward_error),
                |r| format!("{r:.2}"),
            );
            println!(
                "  reward {reward:>6}  {:>3} tokens  {:<6}  {:?}",
                t.generated_len(),
                format!("{:?}", t.finish_reason).to_lowercase(),
                t.completion.chars().take(120).collect::<String>()
            );
        }
    }
    if batch.skipped_prompts > 0 {
        println!(
            "skipped {} prompts longer than {} tokens",
            batch.skipped_prompts, cfg.max_prompt_len
        );
    }
    println!(
        "generation: {:.1} tokens/s",
        batch.generated_tokens as f64 / batch.generate_seconds
    );
    Ok(())
}
