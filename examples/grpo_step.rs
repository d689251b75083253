//! Times full GRPO steps as `scripts/bench_hf.py --only grpo` runs them in TRL's
//! `GRPOTrainer`, and splits each step into generate / score / train.
//!
//! ```text
//! cargo run --release --example grpo_step -- [--model PATH] [--steps 3] [--device D] [--json]
//!     [--set KEY=VALUE]...
//! ```
//! The same setting as the anchor: SmolLM2-135M-Instruct in f32, the anchor's 16 single-digit
//! chat prompts (`benches/data/grpo_step_prompts.jsonl`, made with its `random.Random(0)`), one
//! prompt × G = 8 completions per step, up to 64 new tokens at temperature 1 (stopping at
//! `<|im_end|>`), β = 0 (no reference model), one update per batch (π_old = the behaviour
//! log-probs), AdamW at lr 1e-6. `score` is reward scoring plus the advantages; `train` is the
//! forward + backward pass and the optimizer step. Like the anchor, the first step is reported
//! but left out of the mean. `--set` changes the recipe (e.g. `--set
//! algorithm.correction.mode='"decoupled"'`); `correction_s` (the off-policy correction and its
//! metrics, inside score and train) and `prox_s` (the π_old / π_prox pass) are reported too.

use anyhow::Result;
use rlft::cli::Args;
use rlft::train::metrics::StepMetrics;
use rlft::train::{Recipe, Trainer};

const RECIPE: &str = r#"
seed = 0
[model]
path = "models/SmolLM2-135M-Instruct.Q4_1.gguf"
[data]
train = "benches/data/grpo_step_prompts.jsonl"
[[reward]]
kind = "exact"                 # the last number of the completion, as TRL's anchor scores it
[rollout]
prompts_per_step = 1
group_size = 8
max_new_tokens = 64
max_total_tokens = 64
temperature = 1.0
[algorithm]
loss = "grpo"
kl_coef = 0.0
micro_batch_size = 8
[optimizer]
lr = 1e-6
[schedule]
steps = 1000
[checkpoint]
export_final = false
[logging]
progress = false
"#;

/// rlft's allocator (mimalloc, freed memory kept): `rlft::alloc`.
#[global_allocator]
static GLOBAL: rlft::alloc::Allocator = rlft::alloc::Allocator;

fn main() -> Result<()> {
    let args = Args::parse(&[
        ("model", true),
        ("steps", true),
        ("device", true),
        ("json", false),
        ("set", true),
    ])
    .map_err(anyhow::Error::msg)?;
    let steps: usize = args.get("steps", 3).map_err(anyhow::Error::msg)?;
    anyhow::ensure!(steps >= 1, "--steps must be at least 1");
    // A fresh scratch folder per run (removed at the end), so the benchmark reruns; a
    // `--set output_dir=…` keeps its run instead.
    let scratch = std::env::temp_dir().join(format!("rlft-grpo_step-{}", std::process::id()));
    let mut overrides = vec![format!("output_dir={:?}", scratch.display().to_string())];
    overrides.extend(args.values("set").iter().cloned());
    if let Some(m) = args.value("model") {
        overrides.push(format!("model.path={m:?}"));
    }
    if let Some(d) = args.value("device") {
        overrides.push(format!("device={d:?}"));
    }
    let recipe = Recipe::from_toml_str(RECIPE, &overrides)?;
    let keep = recipe.output_dir != scratch;
    let mut trainer = Trainer::new(recipe, None)?;
    let json = args.flag("json");
    let mut history = Vec::with_capacity(steps);
    for step in 1..=steps {
        let m = trainer.train_step()?.to_metrics()?;
        if !json {
            println!(
                "step {step}: generate {:.2} s, score {:.3} s, train {:.2} s, total {:.2} s \
                 (mean response {:.1} tokens, reward {:.2})",
                value(&m, "time/generate_s"),
                value(&m, "time/score_s"),
                value(&m, "time/train_s"),
                value(&m, "time/step_s"),
                value(&m, "response_len/mean"),
                value(&m, "reward/mean"),
            );
        }
        history.push(m);
    }
    drop(trainer);
    if !keep {
        std::fs::remove_dir_all(&scratch).ok();
    }
    // The anchor's convention: the first step (warm-up allocations) is left out of the mean.
    let steady = if history.len() > 1 {
        &history[1..]
    } else {
        &history[..]
    };
    let mean = |k: &str| steady.iter().map(|m| value(m, k)).sum::<f64>() / steady.len() as f64;
    if json {
        let doc = serde_json::json!({
            "steps": steps,
            "seconds_per_step_all": history.iter().map(|m| value(m, "time/step_s")).collect::<Vec<_>>(),
            "seconds_per_step_excl_first": mean("time/step_s"),
            "generate_s": mean("time/generate_s"),
            "score_s": mean("time/score_s"),
            "train_s": mean("time/train_s"),
            "correction_s": mean("time/correction_s"),
            "prox_s": mean("time/prox_s"),
            "correction_share": mean("time/correction_s") / mean("time/step_s"),
            "response_len_mean": mean("response_len/mean"),
        });
        println!("{doc}");
    } else {
        println!(
            "mean over steps {}..{steps}: {:.2} s per step = generate {:.2} + score {:.3} + \
             train {:.2} (mean response {:.1} tokens); correction {:.4} s ({:.2} % of the step)",
            steps + 1 - steady.len(),
            mean("time/step_s"),
            mean("time/generate_s"),
            mean("time/score_s"),
            mean("time/train_s"),
            mean("response_len/mean"),
            mean("time/correction_s"),
            100.0 * mean("time/correction_s") / mean("time/step_s"),
        );
    }
    Ok(())
}

/// A numeric metric of one step (NaN when absent).
fn value(m: &StepMetrics, key: &str) -> f64 {
    m.get(key).and_then(|v| v.as_f64()).unwrap_or(f64::NAN)
}
