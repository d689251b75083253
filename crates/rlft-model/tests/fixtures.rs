//! Parity with transformers on the tiny checkpoints in `shared/fixtures` (`RLFT_FIXTURES_DIR`
//! overrides the location): full-vocabulary logits within 1e-4, greedy ids identical, and a
//! left-padded batch equal to the unpadded rows. Bad checkpoints are errors, never panics.

use burn::tensor::{DType, Device, Int, Tensor, TensorData};
use rlft_model::{ForwardInput, KvCache, ModelError, Transformer};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    std::env::var_os("RLFT_FIXTURES_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures"))
}

fn ids(v: &Value) -> Vec<i64> {
    v.as_array()
        .expect("id list")
        .iter()
        .map(|x| x.as_i64().expect("id"))
        .collect()
}

fn floats(v: &Value) -> Vec<f32> {
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

fn logits(model: &Transformer, input: ForwardInput) -> (Vec<f32>, [usize; 3]) {
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

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn to_vec(t: Tensor<3>) -> Vec<f32> {
    t.into_data()
        .convert::<f32>()
        .try_to_vec::<f32>()
        .expect("f32 logits")
}

fn int2(v: Vec<i64>, dims: [usize; 2], device: &Device) -> Tensor<2, Int> {
    Tensor::from_data(TensorData::new(v, dims), device)
}

/// Greedy decoding with the KV cache, EOS not stopping: prefill, then one token per step.
fn greedy_cached(model: &Transformer, prompt: &[i64], steps: usize, device: &Device) -> Vec<i64> {
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
        };
    }
    assert_eq!(cache.len(), seq.len() - 1);
    seq[prompt.len()..].to_vec()
}

/// Prefill `split` columns, then one column at a time through the cache; all logits.
fn incremental(model: &Transformer, input: &ForwardInput, split: usize) -> Vec<f32> {
    let [_, l] = input.input_ids.dims();
    let cols = |a: usize, n: usize| ForwardInput {
        input_ids: input.input_ids.clone().narrow(1, a, n),
        position_ids: input.position_ids.clone().narrow(1, a, n),
        attention_mask: input.attention_mask.clone().map(|m| m.narrow(1, a, n)),
    };
    let mut cache = KvCache::new();
    let mut parts = vec![model.forward_cached(&cols(0, split), &mut cache)];
    for c in split..l {
        parts.push(model.forward_cached(&cols(c, 1), &mut cache));
    }
    to_vec(Tensor::cat(parts, 1))
}

fn check_fixture(name: &str) {
    let dir = fixtures().join(name);
    let device = Device::flex();
    let model =
        Transformer::from_hf_dir(&dir, &device, DType::F32).unwrap_or_else(|e| panic!("{e}"));
    let text = std::fs::read_to_string(dir.join("expected.json")).expect("expected.json");
    let expected: Value = serde_json::from_str(&text).expect("json");
    let cases = expected["cases"].as_array().expect("cases");
    let mut per_case = Vec::new();
    for case in cases {
        let case_name = &case["name"];
        let input_ids = ids(&case["input_ids"]);
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

        let diff = max_diff(&incremental(&model, &input, n / 2), &got);
        println!("{name} case {case_name}: KV-cache incremental vs full, max |Δ| = {diff:.2e}");
        assert!(
            diff < 1e-5,
            "{name} case {case_name}: incremental vs full max |Δ| = {diff}"
        );
        per_case.push((got, v));
    }

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
        input_ids: int2(rows.concat(), [b, l], &device),
        position_ids: int2(flat("position_ids"), [b, l], &device),
        attention_mask: Some(int2(flat("attention_mask"), [b, l], &device)),
    };
    let (got, [_, _, v]) = logits(&model, input.clone());
    let cached = incremental(&model, &input, l - 3);
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
        let diff = max_diff(&cached[span.clone()], &got[span]);
        println!("{name} left-padded row {row} via KV cache: max |Δ| = {diff:.2e}");
        assert!(
            diff < 1e-4,
            "{name} left-padded row {row} via KV cache: max |Δ| = {diff}"
        );
    }
}

#[test]
fn tiny_llama_matches_transformers() {
    check_fixture("tiny-llama");
}

#[test]
fn tiny_llama_tied_matches_transformers() {
    check_fixture("tiny-llama-tied");
}

#[test]
fn tiny_qwen2_matches_transformers() {
    check_fixture("tiny-qwen2");
}

/// Copies a fixture to a temporary folder with `edit` applied to its config.
fn broken_copy(tag: &str, edit: impl Fn(&mut Value)) -> PathBuf {
    let src = fixtures().join("tiny-llama");
    let dst = std::env::temp_dir().join(format!("rlft-model-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dst).expect("temp dir");
    std::fs::copy(src.join("model.safetensors"), dst.join("model.safetensors")).expect("copy");
    let mut cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).expect("config"))
            .expect("json");
    edit(&mut cfg);
    std::fs::write(dst.join("config.json"), cfg.to_string()).expect("write");
    dst
}

#[test]
fn bad_checkpoints_are_errors() {
    let device = Device::flex();
    let load = |dir: &Path| Transformer::from_hf_dir(dir, &device, DType::F32).map(|_| ());

    let dir = broken_copy("layers", |c| c["num_hidden_layers"] = 3.into());
    let e = load(&dir).unwrap_err();
    assert!(matches!(e, ModelError::MissingTensor { .. }), "{e}");
    assert!(e.to_string().contains("model.layers.2."), "{e}");

    let dir = broken_copy("shape", |c| c["intermediate_size"] = 96.into());
    let e = load(&dir).unwrap_err().to_string();
    assert!(
        e.contains("has shape [128, 64] but the config implies [96, 64]"),
        "{e}"
    );

    let dir = broken_copy("tied", |c| c["tie_word_embeddings"] = true.into());
    assert!(
        load(&dir).is_ok(),
        "an unused lm_head next to tied embeddings is tolerated"
    );

    let dir = broken_copy("truncated", |_| ());
    let bytes = std::fs::read(dir.join("model.safetensors")).expect("read");
    std::fs::write(dir.join("model.safetensors"), &bytes[..bytes.len() / 2]).expect("truncate");
    let e = load(&dir).unwrap_err();
    assert!(matches!(e, ModelError::Weights { .. }), "{e}");

    std::fs::remove_file(dir.join("model.safetensors")).expect("rm");
    let e = load(&dir).unwrap_err().to_string();
    assert!(e.contains("no model.safetensors"), "{e}");
}

#[test]
fn reference_copy_and_value_model() {
    let dir = fixtures().join("tiny-llama");
    let device = Device::flex().autodiff();
    let policy = Transformer::from_hf_dir(&dir, &device, DType::F32).expect("load");
    let ids = int2(vec![5, 17, 42, 7], [1, 4], &device);
    let input = ForwardInput::new(ids);
    let plain = Device::flex();
    let reference = policy.reference_copy(&plain);
    let input_plain = ForwardInput::new(int2(vec![5, 17, 42, 7], [1, 4], &plain));
    let (a, b) = (
        to_vec(policy.forward(&input)),
        to_vec(reference.forward(&input_plain)),
    );
    // The autodiff and plain devices run different kernels: equal up to f32 rounding.
    let diff = max_diff(&a, &b);
    assert!(
        diff < 1e-4,
        "the reference starts equal to the policy: max |Δ| = {diff}"
    );
    assert!(!reference.embed_tokens.weight.val().is_require_grad());

    let critic = rlft_model::ValueModel::from_trunk(policy, &device);
    let values = critic.forward(&input);
    assert_eq!(values.dims(), [1, 4]);
    let grads = values.sum().backward();
    let g = critic
        .value_head
        .weight
        .val()
        .grad(&grads)
        .expect("value head gradient");
    assert!(g.abs().sum().into_scalar::<f32>() > 0.0);
}
