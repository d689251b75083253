//! How each family's GGUF metadata is read: llama.cpp's rules for what a file omits.

use crate::TransformerConfig;
use crate::config::LayerType;
use crate::dequant::GgmlType;
use crate::gguf::{GgufFile, GgufWriter};

/// `got` is 1/√`d`.
fn close(got: Option<f64>, d: f64) {
    let got = got.expect("a score scale");
    assert!((got - d.powf(-0.5)).abs() < 1e-12, "{got} vs 1/√{d}");
}

/// A metadata-only file of architecture `arch` (plus the embedding, which sizes the vocab).
fn config(arch: &str, layers: u32, extra: impl FnOnce(&mut GgufWriter)) -> TransformerConfig {
    try_config(arch, layers, extra).unwrap()
}

fn try_config(
    arch: &str,
    layers: u32,
    extra: impl FnOnce(&mut GgufWriter),
) -> crate::Result<TransformerConfig> {
    let mut w = GgufWriter::new();
    w.string("general.architecture", arch);
    for (k, v) in [
        ("embedding_length", 64),
        ("block_count", layers),
        ("feed_forward_length", 96),
        ("attention.head_count", 4),
        ("attention.head_count_kv", 2),
        ("attention.key_length", 24),
    ] {
        w.u32(&format!("{arch}.{k}"), v);
    }
    extra(&mut w);
    w.tensor("token_embd.weight", &[10, 64], GgmlType::F32, &[0.0; 640]);
    // One file per call: tests run in parallel.
    static FILES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = FILES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!(
        "rlft-gguf-family-{arch}-{n}-{}.gguf",
        std::process::id()
    ));
    std::fs::write(&path, w.to_bytes()).unwrap();
    let file = GgufFile::open(&path).unwrap();
    let cfg = TransformerConfig::from_gguf(&file);
    std::fs::remove_file(&path).ok();
    cfg
}

#[test]
fn gemma_scales_scores_as_llama_cpp_does() {
    let small = config("gemma2", 4, |_| {});
    close(small.attention_multiplier, 24.0);
    // Gemma 2 27B (46 layers): hidden / heads.
    let big = config("gemma2", 46, |_| {});
    close(big.attention_multiplier, 16.0);
    // Gemma 2's soft-caps default as in llama.cpp; Gemma 3 has none without keys.
    assert_eq!(small.attn_logit_softcapping, Some(50.0));
    assert_eq!(small.final_logit_softcapping, Some(30.0));
    let g3 = config("gemma3", 62, |_| {});
    close(g3.attention_multiplier, 16.0);
    assert_eq!(g3.final_logit_softcapping, None);
    assert!(g3.norm_unit_offset && g3.tie_word_embeddings);
}

#[test]
fn gemma_layer_types_follow_the_pattern_key_or_llama_cpp_default() {
    let types = |c: &TransformerConfig| -> Vec<LayerType> {
        (0..c.num_layers).map(|i| c.layer_type(i)).collect()
    };
    let (s, f) = (LayerType::Sliding, LayerType::Full);
    let g3 = config("gemma3", 7, |w| w.u32("gemma3.attention.sliding_window", 6));
    assert_eq!(types(&g3), vec![s, s, s, s, s, f, s]);
    assert_eq!(g3.sliding_window, Some(6));
    let g3 = config("gemma3", 4, |w| {
        w.u32("gemma3.attention.sliding_window", 6);
        w.u32("gemma3.attention.sliding_window_pattern", 2);
    });
    assert_eq!(types(&g3), vec![s, f, s, f]);
    let g2 = config("gemma2", 4, |_| {});
    assert_eq!(types(&g2), vec![s, f, s, f]);
    assert_eq!(g2.sliding_window, Some(4096));
    let global = config("gemma3", 3, |_| {});
    assert_eq!(types(&global), vec![f, f, f]);
}

#[test]
fn granite_and_moe_defaults_are_llama_cpp_s() {
    let g = config("granite", 2, |w| w.f32("granite.logit_scale", 8.0));
    close(g.attention_multiplier, 24.0);
    assert_eq!((g.embedding_multiplier, g.residual_multiplier), (1.0, 1.0));
    assert_eq!(g.logits_scaling, 8.0);
    let e = try_config("granite", 2, |_| {}).unwrap_err().to_string();
    assert!(e.contains("logit_scale' is missing"), "{e}");
    let q = config("qwen3moe", 2, |w| {
        w.u32("qwen3moe.expert_count", 8);
        w.u32("qwen3moe.expert_used_count", 2);
        w.u32("qwen3moe.expert_feed_forward_length", 32);
    });
    let moe = q.moe.expect("experts");
    assert!(moe.norm_topk_prob);
    assert_eq!((moe.num_experts, moe.experts_per_token), (8, 2));
    assert_eq!(moe.expert_intermediate_size, 32);
    // No router tensors in this file: every layer is dense.
    assert_eq!(moe.mlp_only_layers, vec![0, 1]);
    let m = config("llama", 2, |w| {
        w.u32("llama.expert_count", 4);
        w.u32("llama.expert_used_count", 2);
    });
    assert_eq!(m.model_type, "mixtral");
    assert_eq!(m.moe.expect("experts").expert_intermediate_size, 96);
}

#[test]
fn unsupported_rope_forms_are_refused_with_the_reason() {
    let err = |arch: &str, extra: fn(&mut GgufWriter)| {
        try_config(arch, 2, extra).unwrap_err().to_string()
    };
    let e = err("phi3", |w| {
        w.tensor("rope_factors_long.weight", &[8], GgmlType::F32, &[1.0; 8])
    });
    assert!(e.contains("longrope"), "{e}");
    let e = err("olmo2", |w| w.u32("olmo2.rope.dimension_count", 8));
    assert!(
        e.contains("partial rotary is supported for phi3 only"),
        "{e}"
    );
    let e = err("gemma3", |w| w.string("gemma3.rope.scaling.type", "yarn"));
    assert!(e.contains("'yarn' is not supported"), "{e}");
    let e = err("falcon", |_| {});
    assert!(e.contains("supported: llama, mistral"), "{e}");
}
