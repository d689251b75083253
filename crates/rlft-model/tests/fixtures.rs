//! Parity with transformers on the tiny checkpoints in `tests/data/fixtures` (`RLFT_FIXTURES_DIR`
//! overrides the location): full-vocabulary logits within 1e-4, greedy ids identical, and a
//! left-padded batch equal to the unpadded rows. Bad checkpoints are errors, never panics.

use burn::tensor::{DType, Device, Tensor};
use rlft_model::{
    ChatMessage, ForwardInput, HostWeights, LoraConfig, ModelError, Pretrained, Transformer,
    TransformerConfig,
};
use serde_json::Value;
use std::path::{Path, PathBuf};

mod common;
use common::*;

fn check_fixture(name: &str) {
    check_dir(&fixtures().join(name));
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
    // The zero-initialised bias trains too.
    let bias = critic.value_head.bias.as_ref().expect("a value bias");
    assert_eq!(
        bias.val().into_data().try_to_vec::<f32>().unwrap(),
        vec![0.0]
    );
    let g = bias.val().grad(&grads).expect("value bias gradient");
    assert_eq!(
        g.into_scalar::<f32>(),
        4.0,
        "d Σ values / d bias = positions"
    );
}

/// Load → export → load gives identical logits, for every fixture, and the exported folder has
/// what transformers reads.
#[test]
fn export_round_trip_is_exact() {
    let device = Device::flex();
    for name in ["tiny-llama", "tiny-llama-tied", "tiny-qwen2"] {
        let src = fixtures().join(name);
        let p = Pretrained::load(&src, &device, DType::F32).unwrap_or_else(|e| panic!("{e}"));
        let out = std::env::temp_dir().join(format!("rlft-export-{name}-{}", std::process::id()));
        p.save_hf(&out).unwrap_or_else(|e| panic!("{e}"));
        for f in [
            "config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
            "chat_template.jinja",
            "generation_config.json",
        ] {
            assert!(out.join(f).exists(), "{name}: {f} written");
        }
        let q = Pretrained::load(&out, &device, DType::F32).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(q.config, p.config, "{name}: config round trip");
        let ids = int2(vec![3, 99, 250, 17, 8], [1, 5], &device);
        let input = ForwardInput::new(ids);
        assert_eq!(
            to_vec(p.model.forward(&input)),
            to_vec(q.model.forward(&input)),
            "{name}"
        );
        let text = "What is 7*8?";
        assert_eq!(
            p.tokenizer.encode(text).unwrap(),
            q.tokenizer.encode(text).unwrap()
        );
        assert_eq!(q.tokenizer.eos_ids, p.tokenizer.eos_ids);
        let msgs = [ChatMessage::user("hi")];
        assert_eq!(
            q.tokenizer.apply_chat_template(&msgs, true).unwrap(),
            p.tokenizer.apply_chat_template(&msgs, true).unwrap()
        );
        std::fs::remove_dir_all(&out).ok();
    }
}

/// LoRA: only adapters train, the adapted model starts equal to the base, and export merges the
/// trained adapters into the weights.
#[test]
fn lora_trains_adapters_and_merges_on_export() {
    let device = Device::flex().autodiff();
    let src = fixtures().join("tiny-llama");
    let p = Pretrained::load(&src, &device, DType::F32).expect("load");
    let input = ForwardInput::new(int2(vec![5, 17, 42, 7], [1, 4], &device));
    let base = to_vec(p.model.forward(&input));
    let bad = LoraConfig::new(4, 8.0).with_target_modules(vec!["qproj".into()]);
    let e = p.model.clone().with_lora(&bad).unwrap_err().to_string();
    assert!(e.contains("'qproj' does not exist"), "{e}");
    let cfg = LoraConfig::new(4, 8.0).with_target_modules(vec!["q_proj".into(), "up_proj".into()]);
    let mut model = p.model.clone().with_lora(&cfg).expect("lora");
    assert_eq!(to_vec(model.forward(&input)), base, "B = 0 at start");

    // One SGD step on the adapters by hand.
    use burn::module::Module;
    use burn::optim::{GradientsParams, SgdConfig};
    let loss = model.forward(&input).powi_scalar(2).mean();
    let grads = GradientsParams::from_grads(loss.backward(), &model);
    let mut optim = SgdConfig::new().init();
    model = optim.step(1e-1, model, grads);
    let after = to_vec(model.forward(&input));
    assert!(
        max_diff(&after, &base) > 1e-4,
        "adapters changed the output"
    );
    // The decode kernels' host copies carry the adapters (`val()` is base + scale · A·B).
    let host = HostWeights::new(&model).expect("host weights");
    let decoded = incremental(&model, &input, 2, Some(&host));
    let diff = max_diff(&decoded, &after);
    assert!(diff < 1e-4, "LoRA model decoded on the host: {diff}");
    let embed_before = to_vec(p.model.embed_tokens.weight.val().unsqueeze::<3>());
    let embed_after = to_vec(model.embed_tokens.weight.val().unsqueeze::<3>());
    assert_eq!(embed_before, embed_after, "non-adapted weights are frozen");
    assert!(
        model.num_params() > p.model.num_params(),
        "adapter parameters added"
    );

    let out = std::env::temp_dir().join(format!("rlft-lora-{}", std::process::id()));
    model
        .save_hf(&p.config, Some(&p.tokenizer), &out)
        .expect("export");
    let plain = Device::flex();
    let merged = Pretrained::load(&out, &plain, DType::F32).expect("reload merged");
    let input_plain = ForwardInput::new(int2(vec![5, 17, 42, 7], [1, 4], &plain));
    let diff = max_diff(&to_vec(merged.model.forward(&input_plain)), &after);
    assert!(
        diff < 1e-4,
        "merged export reproduces the adapted model: {diff}"
    );
    std::fs::remove_dir_all(&out).ok();
}

#[test]
fn random_init_and_unknown_model_type() {
    let device = Device::flex();
    let cfg = TransformerConfig::new(50, 16, 32, 2, 4, 2, 4);
    let model = cfg.init(&device);
    let out = model.forward(&ForwardInput::new(int2(vec![1, 2, 3], [1, 3], &device)));
    assert_eq!(out.dims(), [1, 3, 50]);
    let dir = broken_copy("model-type", |c| c["model_type"] = "gpt_neox".into());
    let e = Transformer::from_hf_dir(&dir, &device, DType::F32)
        .unwrap_err()
        .to_string();
    assert!(e.contains("model_type 'gpt_neox' is not supported"), "{e}");
}

/// Computing in bf16 or f16 (f32 master weights cast in each pass): logits against transformers'
/// f32 ones within the documented tolerance for the type (relative to the largest logit), greedy
/// ids identical while the top-2 margin is wider than twice it, and gradients that reach the f32
/// weights in f32, near the f32 pass's.
#[test]
fn half_precision_compute_stays_near_f32() {
    use burn::module::{Module, ModuleVisitor, Param};
    use burn::tensor::FloatDType;
    // Documented in docs/backends.md ("Precision"): max |Δ logit| against transformers' f32 logits, as a
    // fraction of the largest |logit| (measured: bf16 ≤ 3.0 %, f16 ≤ 0.28 %).
    for (dtype, tolerance) in [(FloatDType::BF16, 0.05f32), (FloatDType::F16, 0.005)] {
        for name in ["tiny-llama", "tiny-llama-tied", "tiny-qwen2"] {
            let dir = fixtures().join(name);
            let device = Device::flex();
            let model = Transformer::from_hf_dir(&dir, &device, DType::F32)
                .unwrap_or_else(|e| panic!("{e}"))
                .with_compute_dtype(dtype);
            let text = std::fs::read_to_string(dir.join("expected.json")).expect("expected.json");
            let expected: Value = serde_json::from_str(&text).expect("json");
            for case in expected["cases"].as_array().expect("cases") {
                let input_ids = ids(&case["input_ids"]);
                let n = input_ids.len();
                let out =
                    model.forward(&ForwardInput::new(int2(input_ids.clone(), [1, n], &device)));
                assert_eq!(out.dtype(), DType::F32, "logits come out in f32");
                let want = floats(&case["logits"]);
                let scale = want.iter().fold(0.0f32, |m, x| m.max(x.abs()));
                let diff = max_diff(&to_vec(out), &want);
                println!(
                    "{name} {dtype:?}: max |Δlogit| vs transformers f32 = {diff:.2e} (max |logit| {scale:.2})"
                );
                let tolerance = tolerance * scale;
                assert!(
                    diff < tolerance,
                    "{name} {dtype:?}: {diff} (max |logit| {scale})"
                );
                let want = ids(&case["greedy_ids"]);
                let margins = floats(&case["greedy_top1_top2_margin"]);
                let got = greedy_cached(&model, &input_ids, want.len(), &device);
                for ((g, w), m) in got.iter().zip(&want).zip(&margins) {
                    if *m > 2.0 * tolerance {
                        assert_eq!(g, w, "{name} {dtype:?}: greedy id with margin {m}");
                    } else {
                        break;
                    }
                }
            }
            // A left-padded batch: the padding queries see no key at all, which must not turn
            // into NaN (f16 cannot hold the -1e9 mask value), and the real rows stay near
            // transformers' logits.
            let (input, [b, l]) = left_padded_batch(&expected, &device);
            let (got, [_, _, v]) = logits(&model, input);
            assert!(
                got.iter().all(|x| x.is_finite()),
                "{name} {dtype:?}: padded batch"
            );
            let cases = expected["cases"].as_array().expect("cases");
            for (row, case) in cases.iter().take(b).enumerate() {
                let want = floats(&case["logits"]);
                let n = want.len() / v;
                let scale = want.iter().fold(0.0f32, |m, x| m.max(x.abs()));
                let diff = max_diff(&got[(row * l + (l - n)) * v..(row * l + l) * v], &want);
                assert!(
                    diff < tolerance * scale,
                    "{name} {dtype:?} padded row {row}: {diff}"
                );
            }
        }
    }
    // Gradients: f32, on the f32 weights, close to those of an f32 pass.
    let dir = fixtures().join("tiny-llama");
    let device = Device::flex().autodiff();
    let base = Transformer::from_hf_dir(&dir, &device, DType::F32).expect("load");
    let input = ForwardInput::new(int2((1..20).collect(), [1, 19], &device));
    struct Grads<'a>(&'a burn::optim::GradientsParams, Vec<(DType, Vec<f32>)>);
    impl ModuleVisitor for Grads<'_> {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            let g = self.0.get::<D>(p.id).expect("every weight has a gradient");
            let dtype = g.dtype();
            self.1.push((
                dtype,
                g.into_data()
                    .convert::<f32>()
                    .try_into_vec::<f32>()
                    .unwrap(),
            ));
        }
    }
    let grads = |model: &Transformer| {
        let loss = model.forward(&input).powf_scalar(2.0).mean();
        let g = burn::optim::GradientsParams::from_grads(loss.backward(), model);
        let mut v = Grads(&g, Vec::new());
        model.visit(&mut v);
        v.1
    };
    let full = grads(&base);
    let half = grads(&base.clone().with_compute_dtype(FloatDType::BF16));
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for ((d, h), (_, f)) in half.iter().zip(&full) {
        assert_eq!(*d, DType::F32, "gradients reach the f32 weights in f32");
        for (a, b) in h.iter().zip(f) {
            num += ((a - b) as f64).powi(2);
            den += (*b as f64).powi(2);
        }
    }
    let rel = (num / den).sqrt();
    println!("bf16 pass: gradient relative L2 error vs f32 = {rel:.2e}");
    assert!(rel < 0.05, "{rel}");
}
