//! Peak memory of one learner micro-batch — the forward pass, the GRPO loss and its backward —
//! with the output head run over the whole micro-batch at once or in chunks
//! (`algorithm.logits_chunk_tokens`). Run each setting in its own process: the peak is the
//! process's.
//!
//! ```text
//! cargo run --release --example learner_memory -- --model models/SmolLM2-135M-Instruct.Q4_1.gguf \
//!     --rows 8 --len 256 --chunk off
//! cargo run --release --example learner_memory -- --vocab 151936 --rows 8 --len 256 --chunk auto
//! ```
//! `--vocab N` builds a scratch model (hidden 256, 2 layers) with an N-token vocabulary. `--chunk`
//! is `off` (one pass, what the trainer did before chunking), `auto` (the trainer's default: a
//! 1 GiB budget of logits) or a number of response positions. Prints one JSON line: the
//! setting, the chunk used, `peak_rss_mb` before and after the step, and the step's seconds.

mod common;

use anyhow::Result;
use burn::tensor::{Tensor, TensorData};
use rlft::algo::loss::{LossRegistry, PolicyLossInput};
use rlft::cli::Args;
use rlft::model::{Transformer, TransformerConfig};
use rlft::rollout::LearnerBatch;
use rlft::train::chunked::{LossOut, chunk_for_budget, chunked_backward};
use std::time::Instant;

fn main() -> Result<()> {
    let args = Args::parse(&[
        ("model", true),
        ("vocab", true),
        ("rows", true),
        ("len", true),
        ("prompt", true),
        ("chunk", true),
        ("device", true),
    ])
    .map_err(anyhow::Error::msg)?;
    let plain = common::device(&args)?;
    let device = plain.clone().autodiff();
    let (model, vocab): (Transformer, usize) = if args.value("model").is_some() {
        let p = common::load(&args, &device)?;
        let v = p.config.vocab_size;
        (p.model, v)
    } else {
        let v: usize = args.get("vocab", 151_936).map_err(anyhow::Error::msg)?;
        let cfg = TransformerConfig::new(v, 256, 768, 2, 4, 2, 64).with_tie_word_embeddings(true);
        (cfg.init_seeded(&device, 0), v)
    };
    let rows: usize = args.get("rows", 8).map_err(anyhow::Error::msg)?;
    let len: usize = args.get("len", 256).map_err(anyhow::Error::msg)?;
    let prompt: usize = args.get("prompt", 32).map_err(anyhow::Error::msg)?;
    anyhow::ensure!(prompt < len, "--prompt must be shorter than --len");
    let chunk = match args.value("chunk").unwrap_or("auto") {
        "off" => usize::MAX,
        "auto" => chunk_for_budget(vocab, rlft::train::chunked::LOGITS_CHUNK_BYTES),
        n => n.parse().map_err(|e| anyhow::anyhow!("--chunk {n}: {e}"))?,
    };
    // Token ids from a fixed LCG: memory does not depend on which tokens they are.
    let mut s = 0x2545_F491_4F6C_DD1Du64;
    let ids: Vec<Vec<u32>> = (0..rows)
        .map(|_| {
            (0..len)
                .map(|_| {
                    s = s.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                    ((s >> 33) % vocab as u64) as u32
                })
                .collect()
        })
        .collect();
    let layout: Vec<(&[u32], usize)> = ids.iter().map(|r| (&r[..], prompt)).collect();
    let batch = LearnerBatch::new(&layout, 0, &device);
    let [n, r] = [batch.rows_len(), batch.response_len()];
    let t2 = |v: Vec<f32>| Tensor::<2>::from_data(TensorData::new(v, [n, r]), &device);
    let adv: Vec<f32> = (0..n * r)
        .map(|i| if (i / r) % 2 == 0 { 1.0 } else { -1.0 })
        .collect();
    let registry = LossRegistry::with_builtins();
    let mut config = registry.resolve("grpo")?.config.clone();
    config.kl_coef = 0.0;
    let before = common::peak_rss_mb();
    let t0 = Instant::now();
    let (grads, ()) = chunked_backward(
        &batch,
        &model,
        Some(1.0),
        chunk,
        false,
        |s| -> rlft::algo::Result<LossOut<()>> {
            let (lp, ent) = (s.lp, s.ent);
            let old = lp.clone().detach();
            let input =
                PolicyLossInput::new(lp, old, t2(adv), t2(vec![1.0; n * r])).with_entropy(ent);
            let out = registry.compute("grpo", &input, &config)?;
            Ok(LossOut {
                loss: out.loss,
                extra: (),
            })
        },
    )?;
    drop(grads);
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "{}",
        serde_json::json!({
            "vocab": vocab,
            "rows": rows,
            "len": len,
            "response_tokens": batch.tokens(),
            "chunk": if chunk == usize::MAX { serde_json::json!("off") } else { serde_json::json!(chunk) },
            "peak_rss_mb_before": before.round(),
            "peak_rss_mb": common::peak_rss_mb().round(),
            "step_s": secs,
        })
    );
    Ok(())
}
