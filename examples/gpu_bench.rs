//! Decode and GRPO-step speed of SmolLM2-135M's architecture, randomly initialised (speed does
//! not depend on the weights' values, so no checkpoint and no network are needed), in f32, bf16
//! or f16, on any compiled backend. `scripts/gpu-bench.sh` runs it on a CUDA machine.
//!
//! ```text
//! cargo run --release --features cuda --example gpu_bench -- --device cuda [--dtype bf16]
//!     [--size smollm2-135m|tiny] [--batch 8] [--new-tokens 128] [--steps 5] [--hbm-gbs 4800]
//!     [--json]
//! ```
//! - `decode_tok_s_b1`, `decode_tok_s_bN`: batch × new tokens / seconds of one whole generate
//!   call from 32-token random prompts (prefill included, EOS ignored, temperature 1, sampling
//!   on the device), after a warm-up call.
//! - `hbm_fraction_b1`: the weight bytes one decode step reads (every parameter once, in the
//!   compute type) × decode steps per second at batch 1 ÷ `--hbm-gbs` (the device's memory
//!   bandwidth in GB/s; 4800 is an H200's). KV-cache reads are left out (a few MB here).
//! - GRPO steps: each samples `--batch` completions of one random prompt, scores them (the share
//!   of even token ids, so rewards differ within the group), and takes one on-policy AdamW step
//!   over all rows (f32 master weights and optimiser state, passes in `--dtype`).
//!   `train_tok_s` = prompt + response tokens of the batch / seconds of the update;
//!   `step_s` = generate + update. The first step is reported but left out of the means.

use anyhow::Result;
use rlft::algo::advantage::AdvantageEstimator;
use rlft::algo::loss::{LossRegistry, PolicyLossInput};
use rlft::algo::seed::{spread, xorshift64};
use rlft::burn::module::Module;
use rlft::burn::optim::AdamWConfig;
use rlft::burn::tensor::{Device, FloatDType};
use rlft::cli::Args;
use rlft::model::{Transformer, TransformerConfig};
use rlft::rollout::{
    Example, FinishReason, Group, Prompt, SampleOn, Sampler, SamplingConfig, Trajectory,
};
use rlft::train::batch::{Packing, Row, RowOptions, Rows, per_token};
use rlft::train::chunked::{LossOut, chunked_backward};
use std::time::Instant;

/// SmolLM2-135M's architecture (its config.json), or a tiny one for a quick check on a CPU.
fn architecture(size: &str) -> Result<TransformerConfig> {
    Ok(match size {
        "smollm2-135m" => TransformerConfig::new(49152, 576, 1536, 30, 9, 3, 64)
            .with_rms_norm_eps(1e-5)
            .with_rope_theta(100000.0)
            .with_tie_word_embeddings(true)
            .with_max_position_embeddings(8192),
        "tiny" => TransformerConfig::new(512, 64, 128, 2, 4, 2, 16).with_tie_word_embeddings(true),
        other => anyhow::bail!("--size must be smollm2-135m or tiny, not '{other}'"),
    })
}

/// `n` prompts of 32 pseudo-random token ids (from `seed`), below `vocab`.
fn prompts(n: usize, vocab: usize, seed: u64) -> Vec<Vec<u32>> {
    let mut s = spread(seed) | 1;
    (0..n)
        .map(|_| {
            (0..32)
                .map(|_| {
                    s = xorshift64(s);
                    (s % vocab as u64) as u32
                })
                .collect()
        })
        .collect()
}

/// rlft's allocator (mimalloc, freed memory kept): `rlft::alloc`.
#[global_allocator]
static GLOBAL: rlft::alloc::Allocator = rlft::alloc::Allocator;

fn main() -> Result<()> {
    let args = Args::parse(&[
        ("device", true),
        ("dtype", true),
        ("size", true),
        ("batch", true),
        ("new-tokens", true),
        ("steps", true),
        ("hbm-gbs", true),
        ("json", false),
    ])
    .map_err(anyhow::Error::msg)?;
    let get = |k: &str, d: usize| args.get(k, d).map_err(anyhow::Error::msg);
    let (batch, new_tokens, steps) = (get("batch", 8)?, get("new-tokens", 128)?, get("steps", 5)?);
    anyhow::ensure!(
        batch >= 2 && new_tokens >= 1 && steps >= 1,
        "--batch ≥ 2, --new-tokens ≥ 1, --steps ≥ 1"
    );
    let hbm_gbs: f64 = args.get("hbm-gbs", 4800.0).map_err(anyhow::Error::msg)?;
    let dtype_name = args.value("dtype").unwrap_or("f32");
    let dtype = match dtype_name {
        "f32" => FloatDType::F32,
        "bf16" => FloatDType::BF16,
        "f16" => FloatDType::F16,
        other => anyhow::bail!("--dtype must be f32, bf16 or f16, not '{other}'"),
    };
    let plain: Device = rlft::device::resolve(args.value("device"))?;
    anyhow::ensure!(
        dtype == FloatDType::F32 || plain.supports_dtype(dtype),
        "this device has no {dtype_name} arithmetic (burn 0.22: ndarray has no half types, WGSL no bf16)"
    );
    let size = args.value("size").unwrap_or("smollm2-135m");
    let config = architecture(size)?;
    let device = plain.clone().autodiff();
    let mut policy = config.init_seeded(&device, 0).with_compute_dtype(dtype);
    let params = policy.num_params();
    let bytes_per_param = if dtype == FloatDType::F32 { 4.0 } else { 2.0 };

    // Decode: sampling on the device.
    let sampling = SamplingConfig::new()
        .with_max_new_tokens(new_tokens)
        .with_ignore_eos(true)
        .with_sample_on(SampleOn::Device);
    let decode = |model: &Transformer, rows: usize| -> Result<f64> {
        let sampler = Sampler::new(model, None);
        let p = prompts(rows, config.vocab_size, rows as u64);
        sampler.generate(&p, &sampling)?; // warm-up: kernels compiled, memory pools grown
        let t = Instant::now();
        sampler.generate(&p, &sampling)?;
        Ok((rows * new_tokens) as f64 / t.elapsed().as_secs_f64())
    };
    // The frozen policy as the trainer hands it to its sampler (f32 master weights; the
    // sampler casts them to the compute type once per set of weights).
    let frozen = policy.valid();
    let b1 = decode(&frozen, 1)?;
    let bn = decode(&frozen, batch)?;
    drop(frozen);
    let hbm_fraction = params as f64 * bytes_per_param * (b1 / 1.0) / (hbm_gbs * 1e9);

    // GRPO steps.
    let registry = LossRegistry::with_builtins();
    let mut loss_cfg = registry.resolve("grpo")?.config.clone();
    loss_cfg.kl_coef = 0.0;
    let mut optim = AdamWConfig::new().init();
    let (mut step_s, mut train_s, mut train_tok) = (Vec::new(), Vec::new(), Vec::new());
    for step in 0..steps {
        let t0 = Instant::now();
        let prompt = prompts(1, config.vocab_size, 1000 + step as u64).remove(0);
        let snapshot = policy.valid();
        let done = Sampler::new(&snapshot, None).generate(
            &vec![prompt.clone(); batch],
            &sampling.clone().with_seed(step as u64),
        )?;
        drop(snapshot);
        let trajectories: Vec<Trajectory> = done
            .into_iter()
            .map(|c| {
                let even = c.tokens.iter().filter(|t| *t % 2 == 0).count();
                Trajectory {
                    prompt_ids: prompt.clone(),
                    loss_mask: vec![1; c.tokens.len()],
                    token_versions: vec![step as u64; c.tokens.len()],
                    reward: Some(even as f64 / c.tokens.len() as f64),
                    behaviour_logprobs: c.logprobs,
                    filter_log_mass: c.log_kept_mass.iter().map(|&m| f64::from(m)).sum(),
                    kept_ids: c.kept_ids,
                    routing: c.routing,
                    response_ids: c.tokens,
                    version: step as u64,
                    finish_reason: FinishReason::Length,
                    truncated: true,
                    reward_terms: Vec::new(),
                    reward_error: None,
                    group_id: 0,
                    completion: String::new(),
                    turns: 1,
                }
            })
            .collect();
        let gen_s = t0.elapsed().as_secs_f64();
        let group = Group {
            example: Example {
                prompt: Prompt::Text(String::new()),
                answer: String::new(),
                alternatives: Vec::new(),
                completion: None,
                metadata: serde_json::Value::Null,
            },
            trajectories,
        };
        let t1 = Instant::now();
        let mut rows = Rows::from_groups(std::slice::from_ref(&group), &RowOptions::default());
        let advantages = AdvantageEstimator::from_name("grpo")?
            .compute(&rows.advantage_input(&device, None, false)?)?;
        rows.set_advantages(advantages, false);
        let refs = rows.refs();
        let ids = Packing::new(0).pack(&refs, &device);
        let (grads, loss) = chunked_backward(&ids, &policy, Some(1.0), usize::MAX, false, |s| {
            let field = |f: fn(&Row) -> &[f32]| per_token(&ids, &refs, f);
            let (old, adv) = (field(|r| &r.old_lp), field(|r| &r.adv));
            let input =
                PolicyLossInput::new(s.lp, old, adv, field(|r| &r.mask)).with_entropy(s.ent);
            let out = registry.compute("grpo", &input, &loss_cfg)?;
            let value: f32 = out.loss.clone().into_scalar();
            Ok::<_, anyhow::Error>(LossOut::new(out.loss, value))
        })?;
        policy = optim.step(1e-6, policy, grads);
        anyhow::ensure!(loss.is_finite(), "step {step}: loss {loss}");
        // The step's weights reach the device before the clock stops.
        let _: f32 = policy.embed_tokens.weight.val().sum().into_scalar();
        let upd = t1.elapsed().as_secs_f64();
        step_s.push(gen_s + upd);
        train_s.push(upd);
        train_tok.push((batch * (32 + new_tokens)) as f64 / upd);
    }
    let steady = |v: &[f64]| {
        let v = if v.len() > 1 { &v[1..] } else { v };
        v.iter().sum::<f64>() / v.len() as f64
    };
    let doc = serde_json::json!({
        "size": size,
        "dtype": dtype_name,
        "params": params,
        "batch": batch,
        "new_tokens": new_tokens,
        "decode_tok_s_b1": b1,
        format!("decode_tok_s_b{batch}"): bn,
        "hbm_gbs": hbm_gbs,
        "hbm_fraction_b1": hbm_fraction,
        "steps": steps,
        "step_s_all": step_s,
        "step_s": steady(&step_s),
        "train_s": steady(&train_s),
        "train_tok_s": steady(&train_tok),
    });
    if args.flag("json") {
        println!("{doc}");
    } else {
        println!("{}", serde_json::to_string_pretty(&doc)?);
    }
    Ok(())
}
