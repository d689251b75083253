//! Sampler and rollout engine on the tiny-llama fixture: reproducibility, behaviour log-probs
//! equal to the learner's, stop strings across token boundaries, observation tokens outside the
//! loss mask, skipped long prompts.

use burn::tensor::{DType, Device, Int, Tensor, TensorData};
use rlft_algo::logprobs_from_logits;
use rlft_model::{ForwardInput, Pretrained};
use rlft_rollout::{
    EnvStep, Environment, Example, FinishReason, KvOnUpdate, LearnerBatch, Prompt, RewardSet,
    RolloutConfig, RolloutSetup, SampleOn, Sampler, SamplingConfig, Updates, WeightUpdate, rollout,
};
use std::path::{Path, PathBuf};

fn fixture() -> PathBuf {
    std::env::var_os("RLFT_FIXTURES_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/fixtures"))
        .join("tiny-llama")
}

fn load() -> (Pretrained, Device) {
    let device = Device::flex();
    let p = Pretrained::load(&fixture(), &device, DType::F32).expect("fixture");
    (p, device)
}

/// Largest |a − b| over two equally long slices.
fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max)
}

fn prompts(p: &Pretrained) -> Vec<Vec<u32>> {
    ["What is 23+45?", "Hello", "The quick brown fox jumps"]
        .iter()
        .map(|t| p.tokenizer.encode(t).unwrap())
        .collect()
}

#[test]
fn same_seed_same_tokens() {
    let (p, _) = load();
    let s = Sampler::new(&p.model, Some(&p.tokenizer));
    let cfg = SamplingConfig::new().with_max_new_tokens(12).with_seed(5);
    let a = s.generate(&prompts(&p), &cfg).unwrap();
    let b = s.generate(&prompts(&p), &cfg).unwrap();
    assert_eq!(a, b);
    let c = s.generate(&prompts(&p), &cfg.clone().with_seed(6)).unwrap();
    assert_ne!(a, c, "another seed samples other tokens");
}

/// The sampler's rescored log μ (one pass in the learner's packed layout) must equal log πθ
/// recomputed on the same tokens with the same weights — here in another layout, one
/// left-padded row per sequence with an attention mask — to f32 rounding (1e-5), for rows that
/// ended at a stop token as well as for rows cut off by the length limit. Each row alone
/// (unpadded) agrees to f32 rounding of a different reduction order (≤ 5e-5).
/// `generate_with` shows every token as it is chosen (its draw, version and, on a row's last
/// token, why the row stopped), exactly the completions' tokens; a `Break` ends the generation
/// with `Cancelled` after that call; a model with NaN weights is `NonFiniteLogits`, never a
/// draw from NaN.
#[test]
fn tokens_are_shown_as_chosen_and_a_break_cancels() {
    use rlft_rollout::RolloutError;
    use std::ops::ControlFlow;
    let (p, device) = load();
    let s = Sampler::new(&p.model, Some(&p.tokenizer));
    let cfg = SamplingConfig::new()
        .with_max_new_tokens(10)
        .with_seed(3)
        .with_top_k(50);
    let rows = prompts(&p);
    let mut seen: Vec<Vec<(u32, f32)>> = vec![Vec::new(); rows.len()];
    let mut finished = vec![None; rows.len()];
    let done = s
        .generate_with(&rows, &cfg, |t| {
            assert!(finished[t.row].is_none(), "a token after the row's finish");
            seen[t.row].push((t.draw.token as u32, t.draw.logprob));
            finished[t.row] = t.finish;
            ControlFlow::Continue(())
        })
        .unwrap();
    assert_eq!(done, s.generate(&rows, &cfg).unwrap());
    for (i, c) in done.iter().enumerate() {
        let ids: Vec<u32> = seen[i].iter().map(|t| t.0).collect();
        let lps: Vec<f32> = seen[i].iter().map(|t| t.1).collect();
        assert_eq!(
            (ids, lps),
            (c.tokens.clone(), c.logprobs.clone()),
            "row {i}"
        );
        assert_eq!(finished[i], Some(c.finish_reason), "row {i}");
    }
    let mut calls = 0;
    let e = s
        .generate_with(&rows, &cfg, |_| {
            calls += 1;
            if calls == 4 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
        .unwrap_err();
    assert!(matches!(e, RolloutError::Cancelled), "{e}");
    assert_eq!(calls, 4);

    let mut poisoned = p.model.clone();
    let [v, h] = poisoned.embed_tokens.weight.dims();
    poisoned.embed_tokens.weight =
        burn::module::Param::from_tensor(Tensor::full([v, h], f32::NAN, &device));
    let e = Sampler::new(&poisoned, Some(&p.tokenizer))
        .generate(&rows, &cfg)
        .unwrap_err();
    assert!(
        matches!(
            e,
            RolloutError::NonFiniteLogits {
                row: 0,
                position: 0,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("non-finite logit"), "{e}");
}

#[test]
fn behaviour_logprobs_equal_the_learners() {
    let (p, device) = load();
    let s = Sampler::new(&p.model, Some(&p.tokenizer));
    let prompts = prompts(&p);
    // Row 0's third sampled token becomes a stop token, so some rows finish early.
    let free = SamplingConfig::new().with_max_new_tokens(10).with_seed(11);
    let stop = s.generate(&prompts, &free).unwrap()[0].tokens[2];
    for temperature in [1.0, 0.7] {
        let cfg = free
            .clone()
            .with_temperature(temperature)
            .with_stop_token_ids(vec![stop])
            .with_rescore(true);
        let out = s.generate(&prompts, &cfg).unwrap();
        let finishes: Vec<FinishReason> = out.iter().map(|c| c.finish_reason).collect();
        if temperature == 1.0 {
            assert!(finishes.contains(&FinishReason::Stop), "{finishes:?}");
            assert!(finishes.contains(&FinishReason::Length), "{finishes:?}");
        }
        // The learner's batch: [P + R] per row.
        let (pl, rl) = (
            prompts.iter().map(Vec::len).max().unwrap(),
            out.iter().map(|c| c.tokens.len()).max().unwrap(),
        );
        let (n, w) = (prompts.len(), pl + rl);
        let (mut ids, mut mask, mut pos) =
            (vec![0i64; n * w], vec![0i64; n * w], vec![0i64; n * w]);
        for (i, (pr, c)) in prompts.iter().zip(&out).enumerate() {
            for (j, &t) in pr.iter().chain(&c.tokens).enumerate() {
                let col = pl - pr.len() + j;
                ids[i * w + col] = t as i64;
                mask[i * w + col] = 1;
                pos[i * w + col] = j as i64;
            }
        }
        let int2 = |v: Vec<i64>| Tensor::<2, Int>::from_data(TensorData::new(v, [n, w]), &device);
        let input = ForwardInput {
            input_ids: int2(ids.clone()),
            position_ids: int2(pos),
            attention_mask: Some(int2(mask)),
            segment_ids: None,
            prefix_ids: None,
        };
        let logits = p.model.forward_positions(&input, pl - 1, rl);
        let labels: Vec<i64> = (0..n)
            .flat_map(|i| ids[i * w + pl..(i + 1) * w].to_vec())
            .collect();
        let labels = Tensor::<2, Int>::from_data(TensorData::new(labels, [n, rl]), &device);
        let learner = logprobs_from_logits(logits, labels, Some(temperature))
            .unwrap()
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        for (i, c) in out.iter().enumerate() {
            let diff = max_diff(&c.logprobs, &learner[i * rl..]);
            println!(
                "T={temperature} row {i} ({:?}, {} tokens): max |Δ| = {diff:.2e}",
                c.finish_reason,
                c.tokens.len()
            );
            assert!(
                diff <= 1e-5,
                "T={temperature} row {i}: max |log μ − log π| = {diff}"
            );
            // The same row alone, unpadded.
            let full: Vec<i64> = prompts[i]
                .iter()
                .chain(&c.tokens)
                .map(|&t| t as i64)
                .collect();
            let k = c.tokens.len();
            let alone = p
                .model
                .forward(&ForwardInput::new(Tensor::from_data(
                    TensorData::new(full.clone(), [1, full.len()]),
                    &device,
                )))
                .narrow(1, prompts[i].len() - 1, k);
            let labels = Tensor::<2, Int>::from_data(
                TensorData::new(full[prompts[i].len()..].to_vec(), [1, k]),
                &device,
            );
            let alone = logprobs_from_logits(alone, labels, Some(temperature))
                .unwrap()
                .into_data()
                .try_to_vec::<f32>()
                .unwrap();
            let diff = max_diff(&alone, &c.logprobs);
            assert!(diff <= 5e-5, "row {i} alone: {diff}");
        }
        // Without rescoring, μ comes from the decode steps themselves: the same distribution,
        // computed with other matmul shapes (f32 rounding, ≈1e-5).
        let raw = s
            .generate(&prompts, &cfg.clone().with_rescore(false))
            .unwrap();
        for (a, b) in raw.iter().zip(&out) {
            assert_eq!(a.tokens, b.tokens, "rescoring does not change the tokens");
            let diff = a
                .logprobs
                .iter()
                .zip(&b.logprobs)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f32::max);
            println!("T={temperature}: decode-time μ vs rescored: max |Δ| = {diff:.2e}");
            assert!(diff <= 5e-5);
        }
    }
}

/// GRPO's G completions of one prompt: the prompt is prefilled once and its cache rows copied;
/// each copy decodes as that prompt alone does.
#[test]
fn repeated_prompts_decode_like_a_prompt_alone() {
    let (p, _) = load();
    let s = Sampler::new(&p.model, Some(&p.tokenizer));
    let all = prompts(&p);
    let cfg = SamplingConfig::new()
        .with_max_new_tokens(8)
        .with_temperature(0.0)
        .with_ignore_eos(true);
    let batch = [
        all[0].clone(),
        all[1].clone(),
        all[0].clone(),
        all[0].clone(),
    ];
    let out = s.generate(&batch, &cfg).unwrap();
    for (i, prompt) in batch.iter().enumerate() {
        let alone = &s.generate(std::slice::from_ref(prompt), &cfg).unwrap()[0];
        assert_eq!(out[i].tokens, alone.tokens, "row {i}");
        let diff = max_diff(&out[i].logprobs, &alone.logprobs);
        assert!(diff <= 5e-5, "row {i}: max |Δ log μ| = {diff}");
    }
}

#[test]
fn stop_strings_spanning_tokens_stop_generation() {
    let (p, _) = load();
    let s = Sampler::new(&p.model, None);
    let prompt = p.tokenizer.encode("What is 23+45?").unwrap();
    let greedy = SamplingConfig::new()
        .with_temperature(0.0)
        .with_max_new_tokens(16)
        .with_ignore_eos(true);
    let free = s.generate(std::slice::from_ref(&prompt), &greedy).unwrap()[0].clone();
    // A stop string made of the last character of token k and the first of token k+1, which
    // does not occur earlier.
    let text_upto = |k: usize| p.tokenizer.decode(&free.tokens[..=k], false).unwrap();
    let (k, stop) = (0..free.tokens.len() - 1)
        .find_map(|k| {
            let (a, b) = (text_upto(k), text_upto(k + 1));
            let next = &b[a.len()..];
            let last = a.chars().last()?;
            let first = next.chars().next()?;
            let stop = format!("{last}{first}");
            (!a.contains(&stop)).then_some((k, stop))
        })
        .expect("some boundary to stop at");
    let s = Sampler::new(&p.model, Some(&p.tokenizer));
    let cfg = greedy.with_stop_strings(vec![stop.clone()]);
    let c = s.generate(&[prompt], &cfg).unwrap()[0].clone();
    assert_eq!(c.finish_reason, FinishReason::Stop, "stop {stop:?}");
    assert_eq!(
        c.tokens,
        free.tokens[..=k + 1],
        "stopped on the token completing {stop:?}"
    );
}

/// Answers every model turn with a fixed observation, twice.
struct Echo;
impl Environment for Echo {
    fn step(&self, _: &Example, _: &str) -> rlft_rollout::Result<EnvStep> {
        Ok(EnvStep::Observation(" [obs] ".into()))
    }
}

#[test]
fn observations_stay_out_of_the_loss_mask() {
    let (p, _) = load();
    let vocab = p.config.vocab_size as u32;
    // Every token is a stop token: each turn is one token, then the environment answers.
    let sampling = SamplingConfig::new()
        .with_max_new_tokens(4)
        .with_ignore_eos(true)
        .with_stop_token_ids((0..vocab).collect());
    let cfg = RolloutConfig::new(sampling)
        .with_group_size(3)
        .with_max_turns(3)
        .with_max_prompt_len(8);
    let examples = vec![
        Example {
            prompt: Prompt::Text("Hello".into()),
            answer: "1".into(),
            alternatives: Vec::new(),
            completion: None,
            metadata: serde_json::Value::Null,
        },
        Example {
            prompt: Prompt::Text(
                "a very long prompt that has far more than eight tokens in it".into(),
            ),
            answer: "1".into(),
            alternatives: Vec::new(),
            completion: None,
            metadata: serde_json::Value::Null,
        },
    ];
    let rewards = RewardSet::new();
    let setup = RolloutSetup {
        tokenizer: &p.tokenizer,
        env: &Echo,
        rewards: &rewards,
        cfg: &cfg,
    };
    let batch = rollout(&p.model, setup, &examples, 7, 1).unwrap();
    assert_eq!(batch.skipped_prompts, 1);
    assert_eq!(batch.groups.len(), 1);
    let obs = p.tokenizer.encode(" [obs] ").unwrap();
    for t in &batch.groups[0].trajectories {
        assert_eq!(t.version, 7);
        assert_eq!(t.turns, 3);
        assert_eq!(t.response_ids.len(), t.loss_mask.len());
        assert_eq!(t.behaviour_logprobs.len(), t.loss_mask.len());
        // turn, obs, turn, obs, turn; the third observation is not appended (out of turns).
        let expect: Vec<u8> = [
            vec![1],
            vec![0; obs.len()],
            vec![1],
            vec![0; obs.len()],
            vec![1],
        ]
        .concat();
        assert_eq!(t.loss_mask, expect);
        for (i, &m) in t.loss_mask.iter().enumerate() {
            if m == 0 {
                assert_eq!(t.behaviour_logprobs[i], 0.0);
            }
        }
        assert_eq!(t.response_ids[1..1 + obs.len()], obs[..]);
        assert!(t.truncated, "ran out of turns");
        assert_eq!(t.reward, Some(0.0), "an empty reward set scores 0");
        assert_eq!(t.generated_len(), 3);
    }
}

/// Interruptible generation: new weights handed over before the third decode step are used from
/// the fourth token on; every token records the version that sampled it, and its μ is that
/// version's probability — exactly the learner's (to f32 rounding) when the KV cache is
/// recomputed. With no update, the generation is the plain one.
#[test]
fn interruptible_generation_switches_weights_between_decode_steps() {
    let (p, device) = load();
    let other = p.config.init_seeded(&device, 7);
    let s = Sampler::new(&p.model, Some(&p.tokenizer));
    let prompts = prompts(&p);
    let cfg = SamplingConfig::new()
        .with_max_new_tokens(8)
        .with_ignore_eos(true)
        .with_seed(3);
    let plain = s.generate(&prompts, &cfg).unwrap();
    let mut never = || None;
    let mut u = Updates {
        version: 1,
        kv: KvOnUpdate::Keep,
        poll: &mut never,
    };
    let same = s.generate_updating(&prompts, &cfg, &mut u).unwrap();
    assert_eq!(same.completions, plain);
    assert!(same.versions.iter().flatten().all(|&v| v == 1));
    assert!(same.latest.is_none());
    // μ of `tokens[range]` under `model`, recomputed in the learner's layout.
    let learner = |model: &rlft_model::Transformer, out: &[rlft_rollout::Completion]| {
        let rows: Vec<Vec<u32>> = prompts
            .iter()
            .zip(out)
            .map(|(pr, c)| [&pr[..], &c.tokens[..]].concat())
            .collect();
        let rows: Vec<(&[u32], usize)> = rows
            .iter()
            .zip(&prompts)
            .map(|(r, pr)| (&r[..], pr.len()))
            .collect();
        let batch = LearnerBatch::new(&rows, 0, &device);
        let lp = batch
            .logprobs(model, Some(1.0))
            .unwrap()
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        (0..out.len())
            .map(|i| batch.unpack(&lp, i, out[i].tokens.len()))
            .collect::<Vec<_>>()
    };
    for kv in [KvOnUpdate::Recompute, KvOnUpdate::Keep] {
        let mut calls = 0;
        let mut poll = || {
            calls += 1;
            (calls == 3).then(|| WeightUpdate {
                version: 2,
                model: other.clone(),
            })
        };
        let mut u = Updates {
            version: 1,
            kv,
            poll: &mut poll,
        };
        let got = s.generate_updating(&prompts, &cfg, &mut u).unwrap();
        assert_eq!(got.latest.as_ref().map(|w| w.version), Some(2));
        for (c, v) in got.completions.iter().zip(&got.versions) {
            assert_eq!(v, &[1, 1, 1, 2, 2, 2, 2, 2], "{kv:?}");
            assert_eq!(c.tokens.len(), 8);
        }
        // Before the update: the plain generation's tokens and the old weights' μ.
        let old = learner(&p.model, &got.completions);
        let new = learner(&other, &got.completions);
        for (i, c) in got.completions.iter().enumerate() {
            assert_eq!(c.tokens[..3], plain[i].tokens[..3], "{kv:?}");
            for (j, (a, b)) in c.logprobs.iter().zip(&old[i]).take(3).enumerate() {
                assert!((a - b).abs() < 1e-4, "{kv:?} row {i} token {j}");
            }
            if kv == KvOnUpdate::Recompute {
                for (j, (a, b)) in c.logprobs.iter().zip(&new[i]).enumerate().skip(3) {
                    assert!(
                        (a - b).abs() < 1e-4,
                        "row {i} token {j}: μ {a} vs the new weights' {b}"
                    );
                }
            }
        }
    }
}

/// Sampling on the device (`SampleOn::Device`: every step on burn's forward, the draw as tensor
/// operations) draws the host path's tokens for the same seed, with or without filters, and its
/// μ matches the learner's rescoring within the bound above.
#[test]
fn device_sampling_draws_the_host_tokens() {
    let (p, _) = load();
    let s = Sampler::new(&p.model, Some(&p.tokenizer));
    let prompts = prompts(&p);
    let base = SamplingConfig::new()
        .with_max_new_tokens(12)
        .with_ignore_eos(true);
    let configs = [
        base.clone(),
        base.clone().with_temperature(0.7),
        base.clone().with_temperature(0.0),
        base.clone().with_top_k(5),
        base.clone().with_top_p(0.8),
        base.clone().with_min_p(0.05),
        base.clone()
            .with_temperature(1.3)
            .with_top_k(40)
            .with_top_p(0.9)
            .with_min_p(0.01),
    ];
    let mut draws = 0;
    for cfg in &configs {
        for seed in [0, 1, 2] {
            let cfg = cfg.clone().with_seed(seed);
            let host = s
                .generate(&prompts, &cfg.clone().with_sample_on(SampleOn::Host))
                .unwrap();
            let device = s
                .generate(&prompts, &cfg.clone().with_sample_on(SampleOn::Device))
                .unwrap();
            for (h, d) in host.iter().zip(&device) {
                assert_eq!(h.tokens, d.tokens, "{cfg:?}");
                draws += d.tokens.len();
                let diff = max_diff(&h.logprobs, &d.logprobs);
                assert!(diff <= 5e-5, "{cfg:?}: max |Δ log μ| = {diff}");
            }
            let rescored = s
                .generate(
                    &prompts,
                    &cfg.clone()
                        .with_sample_on(SampleOn::Device)
                        .with_rescore(true),
                )
                .unwrap();
            for (d, r) in device.iter().zip(&rescored) {
                assert_eq!(d.tokens, r.tokens);
                let diff = max_diff(&d.logprobs, &r.logprobs);
                assert!(diff <= 5e-5, "{cfg:?}: μ vs rescored {diff}");
            }
        }
    }
    println!("{draws} tokens drawn alike on the host and on the device");
}
