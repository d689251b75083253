//! A model with Llama 3 RoPE scaling, written as llama.cpp's converter writes a GGUF, loaded,
//! exported and reloaded; and a GGUF with another scheme, which loads but does not export.

use super::*;
use crate::ForwardInput;
use crate::dequant::GgmlType;
use crate::gguf::GgufWriter;
use crate::gguf::names::permute_rows;
use crate::rope::tests::{config, llama3, ramp};
use crate::rope::{RTOL, max_rel_diff};
use burn::tensor::{DType, Device, Int, Tensor, TensorData};
use std::path::{Path, PathBuf};

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rlft-rope-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `model` as llama.cpp's converter writes a llama-architecture GGUF (F32, q/k rows
/// permuted), with `divisors` as `rope_freqs.weight` whatever they are.
fn write_gguf(path: &Path, cfg: &TransformerConfig, model: &Transformer, divisors: &[f32]) {
    let mut w = GgufWriter::new();
    let arch = crate::families::Family::gguf_arch(&crate::families::Llama).unwrap();
    w.string("general.architecture", arch);
    for (k, v) in [
        ("embedding_length", cfg.hidden_size),
        ("block_count", cfg.num_layers),
        ("feed_forward_length", cfg.intermediate_size),
        ("attention.head_count", cfg.num_heads),
        ("attention.head_count_kv", cfg.num_kv_heads),
        ("attention.key_length", cfg.head_dim),
        ("context_length", cfg.max_position_embeddings),
    ] {
        w.u32(&format!("llama.{k}"), v as u32);
    }
    w.f32("llama.rope.freq_base", cfg.rope_theta as f32);
    w.f32(
        "llama.attention.layer_norm_rms_epsilon",
        cfg.rms_norm_eps as f32,
    );
    for (name, shape, values) in model.hf_tensors() {
        let heads = if name.contains("q_proj") {
            cfg.num_heads
        } else if name.contains("k_proj") {
            cfg.num_kv_heads
        } else {
            0
        };
        let values = if heads == 0 {
            values
        } else {
            permute_rows(&values, heads, shape[1])
        };
        let gguf = gguf_name(&name, NormNames::Llama).expect("GGUF name");
        w.tensor(&gguf, &shape, GgmlType::F32, &values);
    }
    w.tensor(ROPE_FREQS, &[divisors.len()], GgmlType::F32, divisors);
    std::fs::write(path, w.to_bytes()).unwrap();
}

/// Logits at positions far apart, where the low frequencies' scaling shows.
fn logits(model: &Transformer, device: &Device) -> Vec<f32> {
    let ids = |v: Vec<i64>| Tensor::<2, Int>::from_data(TensorData::new(v, [1, 6]), device);
    let input = ForwardInput {
        input_ids: ids(vec![1, 5, 9, 2, 14, 7]),
        position_ids: ids(vec![0, 3000, 9000, 30000, 70000, 120000]),
        ..ForwardInput::new(ids(vec![0; 6]))
    };
    let out = model.forward(&input).into_data().convert::<f32>();
    out.try_to_vec::<f32>().expect("f32")
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max)
}

/// A Llama 3.1-scaled model → GGUF (divisors as the converter computes them) → load → export
/// → load: the exported config declares the scaling, and the reloaded model rotates and
/// predicts as the GGUF-loaded one does.
#[test]
fn rope_scaling_survives_gguf_load_and_export() {
    let device = Device::flex();
    let want = llama3(8.0, 1.0, 4.0, 8192.0);
    let scaled = config(64, Some(want.clone()));
    let dir = temp_dir("llama3");
    let gguf = dir.join("model.gguf");
    write_gguf(
        &gguf,
        &scaled,
        &scaled.init_seeded(&device, 3),
        &scaled.llama3_divisors().expect("scaled config"),
    );
    let file = GgufFile::open(&gguf).unwrap();
    let (model, cfg) = Transformer::from_gguf(&file, &device, DType::F32).unwrap();
    assert_eq!(cfg.rope_scaling, Some(want));
    let (worst, _) = max_rel_diff(&model.rope_inv_freq, &scaled.inv_freq());
    assert!(worst <= RTOL, "{worst:e}");

    let out = dir.join("hf");
    model.save_hf(&cfg, None, &out).unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    let r = &json["rope_scaling"];
    assert_eq!(r["rope_type"], "llama3");
    assert_eq!(r["factor"], 8.0);
    assert_eq!(r["low_freq_factor"], 1.0);
    assert_eq!(r["high_freq_factor"], 4.0);
    assert_eq!(r["original_max_position_embeddings"], 8192);
    let back = Transformer::from_hf_dir(&out, &device, DType::F32).unwrap();
    let (worst, _) = max_rel_diff(&back.rope_inv_freq, &model.rope_inv_freq);
    assert!(worst <= RTOL, "{worst:e}");

    let (a, b) = (logits(&model, &device), logits(&back, &device));
    let mut unscaled = back.clone();
    unscaled.rope_inv_freq = cfg.unscaled_inv_freq();
    let c = logits(&unscaled, &device);
    let (same, without) = (max_abs_diff(&a, &b), max_abs_diff(&a, &c));
    assert!(same <= 1e-5, "exported logits differ by {same}");
    assert!(
        without > 100.0 * same.max(1e-7),
        "the check is blind to the scaling: {without} vs {same}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Divisors of another scheme: the GGUF loads with them, and exporting it is an error that
/// writes nothing.
#[test]
fn rope_scaling_of_another_scheme_refuses_export() {
    let device = Device::flex();
    let plain = config(64, None);
    let divisors: Vec<f32> = ramp(32).into_iter().map(|d| d as f32).collect();
    let dir = temp_dir("other");
    let gguf = dir.join("model.gguf");
    write_gguf(&gguf, &plain, &plain.init_seeded(&device, 3), &divisors);
    let file = GgufFile::open(&gguf).unwrap();
    let (model, cfg) = Transformer::from_gguf(&file, &device, DType::F32).unwrap();
    assert_eq!(cfg.rope_scaling, None);
    let d64: Vec<f64> = divisors.iter().map(|&d| f64::from(d)).collect();
    assert_eq!(
        model.rope_inv_freq,
        divide(&plain.unscaled_inv_freq(), &d64)
    );

    let out = dir.join("hf");
    let e = model.save_hf(&cfg, None, &out).unwrap_err();
    assert!(matches!(e, ModelError::RopeScaling(_)), "{e}");
    assert!(
        e.to_string()
            .contains("cannot be expressed in an HF config.json"),
        "{e}"
    );
    assert!(!out.join("config.json").exists());

    // A zero divisor is a corrupt file, not a model.
    let mut zero = divisors.clone();
    zero[3] = 0.0;
    write_gguf(&gguf, &plain, &plain.init_seeded(&device, 3), &zero);
    let file = GgufFile::open(&gguf).unwrap();
    let e = Transformer::from_gguf(&file, &device, DType::F32).unwrap_err();
    assert!(e.to_string().contains("rope_freqs.weight[3] is 0"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}
