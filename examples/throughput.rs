//! Generation and forward throughput, measured as `scripts/bench_hf.py` measures
//! PyTorch/transformers, printed as one JSON line.
//!
//! ```text
//! cargo run --release --example throughput -- --model PATH [--device D] [--reps 3]
//!     [--new-tokens 64] [--train] --json
//! ```
//! - `decode_tok_s_b1`, `decode_tok_s_b8`: batch × new tokens / median wall time of one whole
//!   generate call (32-token prompts cut from the same text as bench_hf.py, no padding, prefill
//!   included, exactly `--new-tokens` (64, as bench_hf.py) new tokens with EOS not stopping,
//!   temperature 1, no top-k/top-p), after a warm-up; median of `--reps`.
//! - `forward_tok_s`: 8 × 128 / median time of one no-autodiff forward producing full-vocabulary
//!   logits at every position (random ids ≥ 17; the logits are summed and read back as one
//!   scalar, as bench_hf.py does).
//! - `read_bw_gb_s`: the memory read bandwidth this binary measures (one thread per core summing
//!   its share of a 1 GiB buffer, median of 5 passes after a warm-up), and `decode_b8_bw_frac`:
//!   the bytes of f32 weights a decode step reads (every weight but an untied embedding table)
//!   per batch-8 step — the whole generate call's median time over `--new-tokens` steps, prefill
//!   included — divided by that bandwidth: the fraction of the machine's read bandwidth a
//!   decode step uses.
//! - `peak_rss_mb`: the process's peak resident memory (`VmHWM`), after loading and all runs
//!   (before the bandwidth pass);
//!   `load_rss_mb` right after loading.
//!
//! With `--train`, the learner's figures replace the decode ones, measured as bench_hf.py's
//! `bench_train` measures PyTorch: `forward_tok_s` as above, then `fwd_bwd_tok_s` and
//! `fwd_bwd_adamw_tok_s` = 8 × 128 / median time of one step on the same ids — the learner's
//! forward (every parameter trained), cross-entropy over all 8 × 127 next-token targets with the
//! full output head, backward, and for the second an AdamW step at lr 1e-6 with PyTorch's
//! defaults (betas 0.9 / 0.999, ε 1e-8, weight decay 0.01) — after a warm-up step; median of
//! `--reps`. `loss` is the last step's cross-entropy.

mod common;

use anyhow::Result;
use burn::optim::GradientsParams;
use burn::tensor::Device;
use burn::tensor::{Int, Tensor, TensorData};
use rlft::algo::seed::{GOLDEN_GAMMA, xorshift64};
use rlft::cli::Args;
use rlft::model::ForwardInput;
use rlft::rollout::{LearnerBatch, Sampler, SamplingConfig};
use rlft::train::optim::FusedAdamWConfig;
use std::time::Instant;

/// The text bench_hf.py cuts its prompts from.
const TEXT: &str = "Reinforcement learning from verifiable rewards fine-tunes a language model by sampling several \
answers to each prompt, scoring them with a program instead of a learned reward model, and \
pushing the policy towards the answers that scored above the group average. Group relative \
policy optimisation removes the value network entirely: the advantage of each completion is its \
reward minus the mean reward of its group, divided by the standard deviation. The method is \
simple, cheap and surprisingly effective on arithmetic and coding tasks, where correctness can \
be checked exactly. Variants change how the loss is averaged over tokens and sequences, how the \
ratio is clipped, and whether a reference model is kept for a KL penalty.";

/// Bytes of f32 weights one decode step reads: every parameter except an untied embedding
/// table, of which a step reads only its tokens' rows.
fn decode_weight_bytes(model: &rlft::model::Transformer) -> usize {
    use burn::module::Module;
    let embed = model.embed_tokens.weight.dims();
    let untied = model.lm_head.is_some();
    4 * (model.num_params() - if untied { embed[0] * embed[1] } else { 0 })
}

/// Read bandwidth in bytes/s: one thread per core sums its share of a 1 GiB buffer; the
/// median of 5 passes after one warm-up pass.
fn read_bandwidth() -> f64 {
    let buf: Vec<f32> = (0..(1usize << 28)).map(|i| (i % 7) as f32).collect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let share = buf.len().div_ceil(threads);
    let pass = || {
        let t = Instant::now();
        let s: f32 = std::thread::scope(|scope| {
            let parts: Vec<_> = buf
                .chunks(share)
                .map(|c| {
                    scope.spawn(move || {
                        // 16 independent lanes, so the adds vectorise and the loads, not the
                        // add latency, bound the pass.
                        let lanes = c.chunks_exact(16).fold([0.0f32; 16], |mut acc, x| {
                            acc.iter_mut().zip(x).for_each(|(a, v)| *a += v);
                            acc
                        });
                        lanes.iter().sum::<f32>()
                    })
                })
                .collect();
            parts.into_iter().map(|h| h.join().unwrap_or(0.0)).sum()
        });
        std::hint::black_box(s);
        t.elapsed().as_secs_f64()
    };
    pass();
    let times: Vec<f64> = (0..5).map(|_| pass()).collect();
    (buf.len() * 4) as f64 / median(times)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<()> {
    let args = Args::parse(&[
        ("model", true),
        ("device", true),
        ("reps", true),
        ("new-tokens", true),
        ("train", false),
        ("json", false),
    ])
    .map_err(anyhow::Error::msg)?;
    let reps: usize = args.get("reps", 3).map_err(anyhow::Error::msg)?;
    let new_tokens: usize = args.get("new-tokens", 64).map_err(anyhow::Error::msg)?;
    anyhow::ensure!(new_tokens >= 1, "--new-tokens must be at least 1");
    let device = common::device(&args)?;
    let p = common::load(&args, &device)?;
    let load_rss = common::peak_rss_mb();
    let ids = p.tokenizer.encode(TEXT)?;
    anyhow::ensure!(
        ids.len() >= 32 + 7 * 8,
        "the prompt text encodes to too few tokens"
    );
    let sampler = Sampler::new(&p.model, None);
    let mut decode = Vec::new();
    let decode_sizes: &[usize] = if args.flag("train") { &[] } else { &[1, 8] };
    for &bs in decode_sizes {
        let prompts: Vec<Vec<u32>> = (0..bs).map(|i| ids[8 * i..8 * i + 32].to_vec()).collect();
        let cfg = |n: usize, seed: u64| {
            SamplingConfig::new()
                .with_max_new_tokens(n)
                .with_ignore_eos(true)
                .with_seed(seed)
        };
        sampler.generate(&prompts, &cfg(4, 0))?; // warm-up
        let times: Vec<f64> = (0..reps)
            .map(|r| {
                let t = Instant::now();
                let out = sampler.generate(&prompts, &cfg(new_tokens, r as u64))?;
                assert!(out.iter().all(|c| c.tokens.len() == new_tokens));
                Ok(t.elapsed().as_secs_f64())
            })
            .collect::<Result<_>>()?;
        decode.push((bs * new_tokens) as f64 / median(times));
    }
    let (b, t) = (8usize, 128usize);
    let vocab = p.config.vocab_size as u64;
    let mut state = GOLDEN_GAMMA;
    let rand_ids: Vec<i64> = (0..b * t)
        .map(|_| {
            state = xorshift64(state);
            (17 + state % (vocab - 17)) as i64
        })
        .collect();
    let input = ForwardInput::new(Tensor::<2, Int>::from_data(
        TensorData::new(rand_ids.clone(), [b, t]),
        &device,
    ));
    let mut fwd = Vec::new();
    for r in 0..=reps {
        let start = Instant::now();
        let s: f32 = p.model.forward(&input).sum().into_scalar();
        anyhow::ensure!(s.is_finite(), "non-finite logits");
        if r > 0 {
            fwd.push(start.elapsed().as_secs_f64());
        }
    }
    let tok_s = |times: Vec<f64>| ((b * t) as f64 / median(times) * 10.0).round() / 10.0;
    let mut out = serde_json::json!({
        "forward_tok_s": tok_s(fwd),
        "load_rss_mb": load_rss.round(),
        "device": format!("{device:?}"),
        "reps": reps,
    });
    if args.flag("train") {
        let train = learner_steps(&args, &device, &rand_ids, [b, t], reps)?;
        out["fwd_bwd_tok_s"] = tok_s(train.fwd_bwd).into();
        out["fwd_bwd_adamw_tok_s"] = tok_s(train.fwd_bwd_adamw).into();
        out["loss"] = train.loss.into();
    } else {
        out["decode_tok_s_b1"] = ((decode[0] * 10.0).round() / 10.0).into();
        out["decode_tok_s_b8"] = ((decode[1] * 10.0).round() / 10.0).into();
    }
    out["peak_rss_mb"] = common::peak_rss_mb().round().into();
    if !args.flag("train") {
        // After the peak RSS is read: the bandwidth buffer is not the model's memory.
        let bw = read_bandwidth();
        let step_s = 8.0 / decode[1];
        let frac = decode_weight_bytes(&p.model) as f64 / step_s / bw;
        out["read_bw_gb_s"] = ((bw / 1e8).round() / 10.0).into();
        out["decode_b8_bw_frac"] = ((frac * 1000.0).round() / 1000.0).into();
    }
    if args.flag("json") {
        println!("{out}");
    } else {
        println!("{}", serde_json::to_string_pretty(&out)?);
    }
    Ok(())
}

/// Step times of the learner (see the module docs).
struct LearnerTimes {
    fwd_bwd: Vec<f64>,
    fwd_bwd_adamw: Vec<f64>,
    loss: f64,
}

/// Times `reps` learner steps (after one warm-up) on `ids` (`[b, t]`): forward, mean
/// cross-entropy of every next token, backward, and with AdamW an optimizer step. The model is
/// loaded again on `device`'s autodiff twin, every parameter trained, as the trainer holds it.
fn learner_steps(
    args: &Args,
    device: &Device,
    ids: &[i64],
    [b, t]: [usize; 2],
    reps: usize,
) -> Result<LearnerTimes> {
    let ad = device.clone().autodiff();
    let mut model = common::load(args, &ad)?.model;
    // Each row is one sequence: its first token is the prompt, the other t − 1 are predicted.
    let rows: Vec<(&[i64], usize)> = ids.chunks(t).map(|r| (r, 1)).collect();
    let batch = LearnerBatch::new(&rows, 0, &ad);
    let targets = (b * (t - 1)) as f64;
    let mut times = [Vec::new(), Vec::new()];
    let mut loss_v = f64::NAN;
    for (mode, out) in times.iter_mut().enumerate() {
        let mut optim = (mode == 1).then(|| FusedAdamWConfig::new().init());
        for r in 0..=reps {
            let start = Instant::now();
            let loss = batch.logprobs(&model, None)?.sum().neg() * (1.0 / targets);
            loss_v = f64::from(loss.clone().into_scalar::<f32>());
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            if let Some(o) = optim.as_mut() {
                model = o.step(1e-6, model, grads);
            }
            anyhow::ensure!(loss_v.is_finite(), "non-finite loss");
            if r > 0 {
                out.push(start.elapsed().as_secs_f64());
            }
        }
    }
    let [fwd_bwd, fwd_bwd_adamw] = times;
    Ok(LearnerTimes {
        fwd_bwd,
        fwd_bwd_adamw,
        loss: (loss_v * 1e4).round() / 1e4,
    })
}
