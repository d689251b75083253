//! Helpers shared by the parity tests: reading `expected.json`, forward passes, greedy and
//! incremental decoding, and the whole parity check of one checkpoint folder.

#![allow(dead_code)]

use burn::tensor::{DType, Device, Int, Tensor, TensorData};
use rlft_model::{ChatMessage, ForwardInput, HostWeights, KvCache, Tokenizer, Transformer};
use serde_json::Value;
use std::path::{Path, PathBuf};

pub fn fixtures() -> PathBuf {
    std::env::var_os("RLFT_FIXTURES_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/fixtures"))
}

pub fn ids(v: &Value) -> Vec<i64> {
    v.as_array()
        .expect("id list")
        .iter()
        .map(|x| x.as_i64().expect("id"))
        .collect()
}

pub fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("list")
        .iter()
        .flat_map(|row| match row.as_array() {
            Some(r) => r
                .iter()
                .map(|x| x.as_f64().expect("float") as f32)
                .collect(),
            None => vec![row.as_f64().expect("float") as f32],
        })
        .collect()
}

pub fn logits(model: &Transformer, input: ForwardInput) -> (Vec<f32>, [usize; 3]) {
    let out = model.forward(&input);
    let dims = out.dims();
    (
        out.into_data()
            .convert::<f32>()
            .try_to_vec::<f32>()
            .expect("f32 logits"),
        dims,
    )
}

pub fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

pub fn to_vec(t: Tensor<3>) -> Vec<f32> {
    t.into_data()
        .convert::<f32>()
        .try_to_vec::<f32>()
        .expect("f32 logits")
}

pub fn int2(v: Vec<i64>, dims: [usize; 2], device: &Device) -> Tensor<2, Int> {
    Tensor::from_data(TensorData::new(v, dims), device)
}

/// Greedy decoding with the KV cache, EOS not stopping: prefill, then one token per step.
/// The fixture's `batch_left_padded` as one forward input (ids, per-row positions, attention
/// mask) and its `[rows, width]`.
pub fn left_padded_batch(expected: &Value, device: &Device) -> (ForwardInput, [usize; 2]) {
    let batch = &expected["batch_left_padded"];
    let rows: Vec<Vec<i64>> = batch["input_ids"]
        .as_array()
        .expect("rows")
        .iter()
        .map(ids)
        .collect();
    let (b, l) = (rows.len(), rows[0].len());
    let flat = |key: &str| -> Vec<i64> {
        batch[key]
            .as_array()
            .expect("rows")
            .iter()
            .flat_map(ids)
            .collect()
    };
    let input = ForwardInput {
        input_ids: int2(rows.concat(), [b, l], device),
        position_ids: int2(flat("position_ids"), [b, l], device),
        attention_mask: Some(int2(flat("attention_mask"), [b, l], device)),
        segment_ids: None,
        prefix_ids: None,
    };
    (input, [b, l])
}

pub fn greedy_cached(
    model: &Transformer,
    prompt: &[i64],
    steps: usize,
    device: &Device,
) -> Vec<i64> {
    let mut cache = KvCache::new();
    let mut seq = prompt.to_vec();
    let mut input = ForwardInput::new(int2(seq.clone(), [1, seq.len()], device));
    for _ in 0..steps {
        let out = model.forward_cached(&input, &mut cache);
        let [_, len, v] = out.dims();
        let l = to_vec(out);
        let last = &l[(len - 1) * v..len * v];
        let arg = (0..v)
            .max_by(|a, b| last[*a].total_cmp(&last[*b]))
            .expect("vocab") as i64;
        seq.push(arg);
        input = ForwardInput {
            input_ids: int2(vec![arg], [1, 1], device),
            position_ids: int2(vec![seq.len() as i64 - 1], [1, 1], device),
            attention_mask: None,
            segment_ids: None,
            prefix_ids: None,
        };
    }
    assert_eq!(cache.len(), seq.len() - 1);
    seq[prompt.len()..].to_vec()
}

/// Logits `[b, L, vocab]` (flattened) of a prefill of `split` tokens through the KV cache and
/// then one decode step per token: on the backend, or with `host`, on the host
/// ([`HostWeights::decode_step`] over the prefilled cache moved to the host).
pub fn incremental(
    model: &Transformer,
    input: &ForwardInput,
    split: usize,
    host: Option<&HostWeights>,
) -> Vec<f32> {
    let [b, l] = input.input_ids.dims();
    let cols = |a: usize, n: usize| ForwardInput {
        input_ids: input.input_ids.clone().narrow(1, a, n),
        position_ids: input.position_ids.clone().narrow(1, a, n),
        attention_mask: input.attention_mask.clone().map(|m| m.narrow(1, a, n)),
        segment_ids: None,
        prefix_ids: None,
    };
    let mut cache = KvCache::new();
    let prefill = model.forward_cached(&cols(0, split), &mut cache);
    let Some(host) = host else {
        let mut parts = vec![prefill];
        for c in split..l {
            parts.push(model.forward_cached(&cols(c, 1), &mut cache));
        }
        return to_vec(Tensor::cat(parts, 1));
    };
    let v = prefill.dims()[2];
    let prefill = to_vec(prefill);
    let ints = |t: Tensor<2, Int>| -> Vec<i64> {
        t.into_data()
            .convert::<i64>()
            .try_to_vec::<i64>()
            .expect("ids")
    };
    let (ids, pos) = (
        ints(input.input_ids.clone()),
        ints(input.position_ids.clone()),
    );
    let mut host_cache = cache.to_host().expect("left-padded cache");
    let steps: Vec<Vec<f32>> = (split..l)
        .map(|c| {
            let tokens: Vec<u32> = (0..b).map(|r| ids[r * l + c] as u32).collect();
            let positions: Vec<usize> = (0..b).map(|r| pos[r * l + c] as usize).collect();
            host.decode_step(&mut host_cache, &tokens, &positions)
                .expect("decode step")
        })
        .collect();
    (0..b)
        .flat_map(|r| {
            let mut row = prefill[r * split * v..(r + 1) * split * v].to_vec();
            steps
                .iter()
                .for_each(|s| row.extend_from_slice(&s[r * v..(r + 1) * v]));
            row
        })
        .collect()
}

/// Parity of the checkpoint in `dir` with its `expected.json`: full logits, greedy ids
/// through the KV cache, incremental decoding (backend, and host kernels when they cover the
/// model), the left-padded batch, and the tokenizer.
pub fn check_dir(dir: &Path) {
    let name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("fixture");
    let device = Device::flex();
    let model =
        Transformer::from_hf_dir(dir, &device, DType::F32).unwrap_or_else(|e| panic!("{e}"));
    let text = std::fs::read_to_string(dir.join("expected.json")).expect("expected.json");
    let expected: Value = serde_json::from_str(&text).expect("json");
    let cases = expected["cases"].as_array().expect("cases");
    let tokenizer = Tokenizer::from_hf_dir(dir).unwrap_or_else(|e| panic!("{e}"));
    let host = HostWeights::unsupported(&model)
        .is_none()
        .then(|| HostWeights::new(&model).unwrap_or_else(|e| panic!("{e}")));
    let mut per_case = Vec::new();
    for case in cases {
        let case_name = &case["name"];
        let input_ids = ids(&case["input_ids"]);
        check_tokenizer(&tokenizer, case, &input_ids);
        let n = input_ids.len();
        let input = ForwardInput::new(int2(input_ids.clone(), [1, n], &device));
        let (got, [_, _, v]) = logits(&model, input.clone());
        let diff = max_diff(&got, &floats(&case["logits"]));
        println!("{name} case {case_name}: {n} tokens, max |Δlogit| = {diff:.2e}");
        assert!(
            diff < 1e-4,
            "{name} case {case_name}: max |Δlogit| = {diff}"
        );

        let want_greedy = ids(&case["greedy_ids"]);
        let greedy = greedy_cached(&model, &input_ids, want_greedy.len(), &device);
        assert_eq!(greedy, want_greedy, "{name} case {case_name}: greedy ids");

        for (kernels, host) in [("backend", None), ("host decode steps", host.as_ref())] {
            if kernels != "backend" && host.is_none() {
                continue;
            }
            let diff = max_diff(&incremental(&model, &input, n / 2, host), &got);
            println!(
                "{name} case {case_name}: KV-cache incremental ({kernels}) vs full, max |Δ| = {diff:.2e}"
            );
            // Decode steps multiply other shapes (one query row per head group) than the full
            // pass, so f32 sums differ in the last bits (≈2e-5 seen); the tolerance is the one
            // used against transformers.
            assert!(
                diff < 1e-4,
                "{name} case {case_name}: incremental ({kernels}) vs full max |Δ| = {diff}"
            );
        }
        per_case.push((got, v));
    }

    let (input, [b, l]) = left_padded_batch(&expected, &device);
    let (got, [_, _, v]) = logits(&model, input.clone());
    let cached = incremental(&model, &input, l - 3, None);
    let kernels = match &host {
        Some(h) => incremental(&model, &input, l - 3, Some(h)),
        None => cached.clone(),
    };
    for (row, (want, _)) in per_case.iter().take(b).enumerate() {
        let n = want.len() / v;
        let span = (row * l + (l - n)) * v..(row * l + l) * v;
        let diff = max_diff(&got[span.clone()], want);
        println!("{name} left-padded row {row}: max |Δlogit| = {diff:.2e}");
        assert!(
            diff < 1e-4,
            "{name} left-padded row {row}: max |Δlogit| = {diff}"
        );
        // Batched decode steps run other matmul shapes than the full pass, so f32 sums differ
        // in the last bits (≈2e-5 seen here); the tolerance is the one used against transformers.
        for (how, logits) in [
            ("KV cache", &cached),
            ("KV cache + host decode steps", &kernels),
        ] {
            if host.is_none() && how != "KV cache" {
                continue;
            }
            let diff = max_diff(&logits[span.clone()], &got[span.clone()]);
            println!("{name} left-padded row {row} via {how}: max |Δ| = {diff:.2e}");
            assert!(
                diff < 1e-4,
                "{name} left-padded row {row} via {how}: max |Δ| = {diff}"
            );
        }
    }
}

/// Tokenizer ids, chat rendering and greedy text against transformers.
pub fn check_tokenizer(tokenizer: &Tokenizer, case: &Value, input_ids: &[i64]) {
    let name = &case["name"];
    let text = case["text"].as_str().expect("text");
    if let Some(messages) = case["messages"].as_array() {
        let messages: Vec<ChatMessage> = messages
            .iter()
            .map(|m| serde_json::from_value(m.clone()).expect("message"))
            .collect();
        let rendered = tokenizer
            .apply_chat_template(&messages, true)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(rendered, text, "case {name}: chat prompt");
    }
    let got: Vec<i64> = tokenizer
        .encode(text)
        .expect("encode")
        .into_iter()
        .map(i64::from)
        .collect();
    assert_eq!(got, input_ids, "case {name}: tokenizer ids");
    let greedy: Vec<u32> = ids(&case["greedy_ids"]).iter().map(|&i| i as u32).collect();
    let decoded = tokenizer.decode(&greedy, false).expect("decode");
    assert_eq!(
        decoded,
        case["greedy_text"].as_str().expect("greedy_text"),
        "case {name}: decode"
    );
}
