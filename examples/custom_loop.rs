//! A GRPO loop written by hand from rlft's pieces, without `Trainer`: sample groups, score them,
//! lay them out for the learner, group-normalised advantages, the clipped surrogate, AdamW.
//!
//! ```text
//! cargo run --release --example custom_loop [-- --model DIR] [--steps N]
//! ```
//! Without `--model` a tiny transformer with a byte-level tokenizer is trained from scratch (it
//! learns nothing in a few steps; the point is the loop). Prints the loss every step.

use anyhow::Result;
use rlft::algo::advantage::AdvantageEstimator;
use rlft::algo::loss::{LossRegistry, PolicyLossInput};
use rlft::burn::module::Module;
use rlft::burn::optim::AdamWConfig;
use rlft::burn::tensor::{DType, Device};
use rlft::cli::Args;
use rlft::model::{Pretrained, Tokenizer, TransformerConfig};
use rlft::rollout::{
    LengthPenalty, RolloutConfig, RolloutSetup, SamplingConfig, Split, Task, TaskKind, rollout,
};
use rlft::train::batch::{Packing, Row, RowOptions, Rows, per_token};
use rlft::train::chunked::{LossOut, chunked_backward};

/// rlft's allocator (mimalloc, freed memory kept): `rlft::alloc`.
#[global_allocator]
static GLOBAL: rlft::alloc::Allocator = rlft::alloc::Allocator;

fn main() -> Result<()> {
    let args = Args::parse(&[("model", true), ("steps", true)]).map_err(anyhow::Error::msg)?;
    run(args).map(|_| ())
}

/// The loop; returns each step's loss.
fn run(args: Args) -> Result<Vec<f32>> {
    let steps: usize = args.get("steps", 3).map_err(anyhow::Error::msg)?;
    let device = Device::flex().autodiff();
    // The policy: a checkpoint, or a tiny model from scratch.
    let (mut policy, tokenizer) = match args.value("model") {
        Some(dir) => {
            Pretrained::load(dir.as_ref(), &device, DType::F32).map(|p| (p.model, p.tokenizer))?
        }
        None => {
            let t = Tokenizer::byte_level();
            let cfg = TransformerConfig::new(t.vocab_size(), 64, 128, 2, 4, 2, 16)
                .with_tie_word_embeddings(true);
            (cfg.init_seeded(&device, 0), t)
        }
    };
    let task = Task::new(TaskKind::Arithmetic, 1)?;
    // The task's verifier, plus a small penalty per token past 3 so that even an untrained
    // model's answers differ in reward within a group (GRPO learns from differences).
    let rewards = task.rewards().with(1.0, LengthPenalty::new(3, 0.3));
    let prompts = task.examples(Split::Train, 64);
    // A group of 4 answers to each of 4 prompts per step, 8 new tokens at most, temperature 1.
    let cfg = RolloutConfig::new(SamplingConfig::new().with_max_new_tokens(8)).with_group_size(4);
    let registry = LossRegistry::with_builtins();
    let mut loss_cfg = registry.resolve("grpo")?.config.clone();
    loss_cfg.kl_coef = 0.0; // no reference model in this loop
    let (mut optim, mut losses) = (AdamWConfig::new().init(), Vec::new());
    for step in 1..=steps {
        // The sampler takes the frozen policy (`valid()`); μ is recorded at temperature 1.0.
        let chunk = &prompts[(step - 1) * 4 % 60..][..4];
        let env = task.environment();
        let setup = RolloutSetup {
            tokenizer: &tokenizer,
            env: env.as_ref(),
            rewards: &rewards,
            cfg: &cfg,
        };
        let batch = rollout(&policy.valid(), setup, chunk, step as u64, step as u64)?;
        // The trainer's path: rows, their advantages, packed for the learner.
        let mut rows = Rows::from_groups(&batch.groups, &RowOptions::default());
        if rows.is_empty() {
            continue;
        }
        let advantages = AdvantageEstimator::from_name("grpo")?
            .compute(&rows.advantage_input(&device, None, false)?)?;
        rows.set_advantages(advantages, false);
        let refs = rows.refs();
        let ids = Packing::new(tokenizer.padding_id().into()).pack(&refs, &device);
        // One on-policy update: the ratio is πθ/μ, with μ (`old_lp`) from the sampler.
        let (grads, loss) = chunked_backward(&ids, &policy, Some(1.0), usize::MAX, false, |s| {
            let field = |f: fn(&Row) -> &[f32]| per_token(&ids, &refs, f);
            let (old, adv) = (field(|r| &r.old_lp), field(|r| &r.adv));
            let input =
                PolicyLossInput::new(s.lp, old, adv, field(|r| &r.mask)).with_entropy(s.ent);
            let out = registry.compute("grpo", &input, &loss_cfg)?;
            Ok::<_, anyhow::Error>(LossOut::new(out.loss.clone(), out.loss.into_scalar()))
        })?;
        // On-policy the surrogate's value is −mean(A) ≈ 0 (advantages are centred per group);
        // its gradient is not.
        policy = optim.step(1e-3, policy, grads);
        println!("step {step}: loss {loss:.3e}");
        losses.push(loss);
    }
    Ok(losses)
}

#[test]
fn the_loop_runs_and_its_losses_are_finite() {
    let losses = run(Args::default()).unwrap();
    assert!(losses.len() == 3 && losses.iter().all(|l| l.is_finite()));
}
