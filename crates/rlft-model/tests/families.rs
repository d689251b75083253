//! Parity with transformers on the tiny checkpoints of `tests/data/fixtures-families`
//! (Gemma 2/3, Phi-3, Phi-4-mini, OLMo 2, Qwen3-MoE, Mixtral, Granite; `RLFT_FAMILY_FIXTURES_DIR`
//! points at another set): every folder's logits, greedy ids, incremental decoding and
//! left-padded batch as in `fixtures.rs`; MoE routing equal to transformers' (expert ids and
//! weights), and a forward pass that forces the recorded experts reproducing the logits;
//! re-export reproducing the configuration and every tensor bit for bit.

mod common;

use burn::tensor::{DType, Device};
use common::*;
use rlft_model::{ForwardInput, Pretrained, Routing, TransformerConfig};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn family_fixtures() -> PathBuf {
    std::env::var_os("RLFT_FAMILY_FIXTURES_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/fixtures-families")
        })
}

/// Every checkpoint folder of the set, sorted.
fn dirs() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(family_fixtures())
        .expect("family fixtures folder")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("config.json").exists())
        .collect();
    out.sort();
    assert!(!out.is_empty(), "no fixtures in {:?}", family_fixtures());
    out
}

fn expected(dir: &Path) -> Value {
    let text = std::fs::read_to_string(dir.join("expected.json")).expect("expected.json");
    serde_json::from_str(&text).expect("json")
}

#[test]
fn every_family_matches_transformers() {
    for dir in dirs() {
        check_dir(&dir);
    }
}

/// The recorded routing of a case's first `n` tokens, one [`Routing`] per sparse layer.
fn recorded(case: &Value, n: usize) -> (Vec<usize>, Vec<Routing>) {
    let router = &case["router"];
    let sparse: Vec<usize> = router["sparse_layers"]
        .as_array()
        .expect("sparse_layers")
        .iter()
        .map(|v| v.as_u64().expect("layer") as usize)
        .collect();
    let k = router["num_experts_per_tok"].as_u64().expect("k") as usize;
    let mut routes = Vec::new();
    for layer in router["layers"].as_array().expect("layers") {
        let ids: Vec<u32> = layer["topk_ids"].as_array().expect("ids")[..n]
            .iter()
            .flat_map(|row| row.as_array().expect("row").clone())
            .map(|v| v.as_u64().expect("id") as u32)
            .collect();
        routes.push(Routing { k, ids });
    }
    (sparse, routes)
}

/// Mixtures of experts route every token to transformers' experts, and a pass that forces the
/// recorded experts (router replay) gives transformers' logits.
#[test]
fn moe_routing_matches_and_replay_reproduces_the_logits() {
    let device = Device::flex();
    let mut checked = 0;
    for dir in dirs() {
        let exp = expected(&dir);
        if exp["cases"][0]["router"].is_null() {
            continue;
        }
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let p = Pretrained::load(&dir, &device, DType::F32).unwrap_or_else(|e| panic!("{e}"));
        assert!(p.model.is_moe(), "{name}");
        let sparse: Vec<usize> = (0..p.config.num_layers)
            .filter(|&i| p.config.is_sparse_layer(i))
            .collect();
        for case in exp["cases"].as_array().expect("cases") {
            let input_ids = ids(&case["input_ids"]);
            let n = input_ids.len();
            let (want_sparse, replay) = recorded(case, n);
            assert_eq!(sparse, want_sparse, "{name}: sparse layers");
            let input = ForwardInput::new(int2(input_ids, [1, n], &device));
            let (logits, own) = p.model.forward_routed(&input, None);
            assert_eq!(own, replay, "{name} {}: expert ids", case["name"]);
            let want = floats(&case["logits"]);
            let (forced, own_under_replay) = p.model.forward_routed(&input, Some(&replay));
            assert_eq!(own_under_replay, replay, "{name}: own routing under replay");
            let forced = to_vec(forced);
            let d = max_diff(&forced, &want);
            assert!(d < 1e-4, "{name}: replayed logits off by {d}");
            assert!(max_diff(&to_vec(logits), &want) < 1e-4, "{name}");
            checked += 1;
        }
    }
    assert!(checked > 0, "no MoE fixture in the set");
}

/// Re-exporting an unmodified checkpoint reproduces its configuration (as transformers parses
/// it) and every tensor, names, shapes and bytes.
#[test]
fn re_export_reproduces_config_and_tensors() {
    let device = Device::flex();
    for dir in dirs() {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let p = Pretrained::load(&dir, &device, DType::F32).unwrap_or_else(|e| panic!("{e}"));
        let out = std::env::temp_dir().join(format!("rlft-family-{name}-{}", std::process::id()));
        p.save_hf(&out).unwrap_or_else(|e| panic!("{name}: {e}"));
        let again = TransformerConfig::from_hf_file(&out.join("config.json"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(again, p.config, "{name}: config round trip");
        let written: Value =
            serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
        let original: Value =
            serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
        for key in ["model_type", "architectures", "vocab_size", "hidden_size"] {
            assert_eq!(written[key], original[key], "{name}: {key}");
        }
        let a = std::fs::read(dir.join("model.safetensors")).unwrap();
        let b = std::fs::read(out.join("model.safetensors")).unwrap();
        let (a, b) = (
            safetensors::SafeTensors::deserialize(&a).unwrap(),
            safetensors::SafeTensors::deserialize(&b).unwrap(),
        );
        let mut names_a: Vec<_> = a.names();
        let mut names_b: Vec<_> = b.names();
        names_a.sort();
        names_b.sort();
        assert_eq!(names_a, names_b, "{name}: tensor names");
        for n in names_a {
            let (x, y) = (a.tensor(n).unwrap(), b.tensor(n).unwrap());
            assert_eq!(x.shape(), y.shape(), "{name}: {n} shape");
            assert!(x.data() == y.data(), "{name}: {n} values");
        }
        // And it loads back to the same logits.
        let q = Pretrained::load(&out, &device, DType::F32).unwrap_or_else(|e| panic!("{e}"));
        let input = ForwardInput::new(int2(vec![3, 99, 250, 17, 8], [1, 5], &device));
        assert_eq!(
            to_vec(p.model.forward(&input)),
            to_vec(q.model.forward(&input)),
            "{name}"
        );
        std::fs::remove_dir_all(&out).ok();
    }
}

/// LoRA on every family: the fused projections of Phi-3 (`qkv_proj`, `gate_up_proj`), Mixtral's
/// experts (`w1`, `w3`), and the attention and MLP projections of the others (Qwen3-MoE's
/// experts included): the adapted model starts as the base, trains, and its merged export
/// (fused and renamed again) reloads to the adapted model's logits.
#[test]
fn lora_on_every_family_merges_on_export() {
    use burn::optim::{GradientsParams, SgdConfig};
    use rlft_model::LoraConfig;
    let ad = Device::flex().autodiff();
    for dir in dirs() {
        let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("?");
        let p = Pretrained::load(&dir, &ad, DType::F32).unwrap_or_else(|e| panic!("{e}"));
        let targets = match p.config.model_type.as_str() {
            "phi3" => vec!["qkv_proj", "gate_up_proj"],
            "mixtral" => vec!["w1", "w3", "o_proj"],
            _ => vec!["q_proj", "v_proj", "gate_proj", "down_proj"],
        };
        let input = ForwardInput::new(int2(vec![5, 17, 42, 7], [1, 4], &ad));
        let base = to_vec(p.model.forward(&input));
        let lora = LoraConfig::new(2, 4.0)
            .with_target_modules(targets.iter().map(|t| t.to_string()).collect());
        let mut model = p
            .model
            .clone()
            .with_lora(&lora)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            max_diff(&to_vec(model.forward(&input)), &base) < 1e-6,
            "{name}"
        );
        for _ in 0..2 {
            let loss = model.forward(&input).powi_scalar(2).mean();
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = SgdConfig::new().init().step(1e-1, model, grads);
        }
        let after = to_vec(model.forward(&input));
        assert!(max_diff(&after, &base) > 1e-4, "{name}: adapters trained");
        let out = std::env::temp_dir().join(format!("rlft-lora-{name}-{}", std::process::id()));
        model
            .save_hf(&p.config, Some(&p.tokenizer), &out)
            .unwrap_or_else(|e| panic!("{e}"));
        let plain = Device::flex();
        let merged = Pretrained::load(&out, &plain, DType::F32).unwrap_or_else(|e| panic!("{e}"));
        let input = ForwardInput::new(int2(vec![5, 17, 42, 7], [1, 4], &plain));
        let diff = max_diff(&to_vec(merged.model.forward(&input)), &after);
        assert!(diff < 1e-4, "{name}: merged export {diff}");
        std::fs::remove_dir_all(&out).ok();
    }
}
