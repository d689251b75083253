//! Per-token log-probs and greedy continuation of a text or an id list, as one JSON line.
//!
//! ```text
//! cargo run --release --example score -- --model PATH (--text TEXT | --ids 1,2,3) [--chat]
//!     [--greedy N] [--device D] --json
//! ```
//! Prints `{"ids": [...], "logprobs": [...], "greedy_ids": [...]}` where
//! `logprobs[t] = log p(ids[t+1] | ids[..=t])` (n − 1 values) and `greedy_ids` are exactly N
//! argmax tokens decoded with the KV cache, never stopping at EOS. Text is encoded without adding
//! special tokens (special tokens written in it are recognised); `--chat` renders it as a user
//! turn with the chat template first. Without `--json` the tokens are printed as a table.

mod common;

use anyhow::{Result, bail};
use burn::tensor::activation::log_softmax;
use burn::tensor::{Int, Tensor, TensorData};
use rlft::cli::Args;
use rlft::model::ForwardInput;
use rlft::rollout::{Sampler, SamplingConfig};

fn main() -> Result<()> {
    let args = Args::parse(&[
        ("model", true),
        ("text", true),
        ("ids", true),
        ("chat", false),
        ("greedy", true),
        ("device", true),
        ("json", false),
    ])
    .map_err(anyhow::Error::msg)?;
    let device = common::device(&args)?;
    let p = common::load(&args, &device)?;
    let ids: Vec<u32> = match (args.value("text"), args.value("ids")) {
        (Some(t), None) => common::prompt_ids(&p, t, args.flag("chat"))?,
        (None, Some(list)) => list
            .split(',')
            .map(|s| s.trim().parse::<u32>())
            .collect::<Result<_, _>>()
            .map_err(|e| anyhow::anyhow!("--ids {list:?}: {e}"))?,
        _ => bail!("give exactly one of --text TEXT or --ids 1,2,3"),
    };
    let vocab = p.config.vocab_size;
    if ids.is_empty() {
        bail!("nothing to score: the input encodes to no tokens");
    }
    if let Some(bad) = ids.iter().find(|&&i| i as usize >= vocab) {
        bail!("token id {bad} is outside the vocabulary (size {vocab})");
    }
    let n = ids.len();
    let input = ForwardInput::new(Tensor::<2, Int>::from_data(
        TensorData::new(ids.iter().map(|&i| i as i64).collect(), [1, n]),
        &device,
    ));
    let logp = log_softmax(p.model.forward(&input), 2);
    let logprobs: Vec<f32> = if n > 1 {
        let targets = Tensor::<2, Int>::from_data(
            TensorData::new(ids[1..].iter().map(|&i| i as i64).collect(), [1, n - 1]),
            &device,
        );
        logp.narrow(1, 0, n - 1)
            .gather(2, targets.unsqueeze_dim::<3>(2))
            .into_data()
            .convert::<f32>()
            .try_into_vec::<f32>()
            .map_err(|e| anyhow::anyhow!("{e:?}"))?
    } else {
        Vec::new()
    };
    let n_greedy = args.get("greedy", 0usize).map_err(anyhow::Error::msg)?;
    let greedy_ids = if n_greedy > 0 {
        let cfg = SamplingConfig::new()
            .with_temperature(0.0)
            .with_max_new_tokens(n_greedy)
            .with_ignore_eos(true);
        Sampler::new(&p.model, None).generate(std::slice::from_ref(&ids), &cfg)?[0]
            .tokens
            .clone()
    } else {
        Vec::new()
    };
    if args.flag("json") {
        println!(
            "{}",
            serde_json::json!({"ids": ids, "logprobs": logprobs, "greedy_ids": greedy_ids})
        );
    } else {
        for (t, &id) in ids.iter().enumerate() {
            let piece = p.tokenizer.id_to_token(id).unwrap_or_default();
            match t.checked_sub(1).map(|i| logprobs[i]) {
                Some(lp) => println!("{t:>5} {id:>7} {piece:<20} {lp:>10.4}"),
                None => println!("{t:>5} {id:>7} {piece:<20} {:>10}", "-"),
            }
        }
        if !greedy_ids.is_empty() {
            println!("greedy: {:?}", p.tokenizer.decode(&greedy_ids, false)?);
        }
    }
    Ok(())
}
