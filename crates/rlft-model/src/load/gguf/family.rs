//! The families beyond Llama and Qwen in GGUF files: their metadata turned into the
//! `config.json` transformers would read, so that one parser ([`TransformerConfig::from_hf_json`])
//! applies every family's rules.
//!
//! A GGUF file does not carry everything a `config.json` does. Where a key is missing, the file
//! means what llama.cpp computes from it, and these are llama.cpp's rules:
//! - Gemma 2 and 3 have no `query_pre_attn_scalar`: scores are scaled by 1/√head_dim, or by
//!   1/√(hidden/heads) for the 27B models (46 and 62 layers);
//! - Gemma's per-layer attention types come from `sliding_window_pattern` (a period, or one
//!   flag per layer); without it every 2nd (Gemma 2) or 6th (Gemma 3) layer is global;
//! - a Granite file without `attention.scale` scales scores by 1/√head_dim, and one without
//!   `residual_scale` or `embedding_scale` does not scale them;
//! - Qwen3-MoE and Mixtral always renormalise the top-k routing weights.
//!
//! Where the file stores a value, it is used even if llama.cpp ignores it: llama.cpp disables
//! Phi-3's sliding window (with a warning that results may suffer); rlft keeps it, as
//! transformers does.

use crate::gguf::{GgufFile, GgufValue};
use crate::{ModelError, Result};
use serde_json::{Map, Value, json};

/// llama.cpp's architecture name → transformers' `model_type`, for the families read through
/// their `config.json` form. Mixtral is llama.cpp's `llama` with experts.
pub(crate) fn model_type(file: &GgufFile, arch: &str) -> Option<&'static str> {
    Some(match arch {
        "gemma2" => "gemma2",
        "gemma3" => "gemma3_text",
        "phi3" => "phi3",
        "olmo2" => "olmo2",
        "granite" => "granite",
        "qwen3moe" => "qwen3_moe",
        "llama" if experts(file, arch) > 0 => "mixtral",
        _ => return None,
    })
}

fn experts(file: &GgufFile, arch: &str) -> u64 {
    file.get(&format!("{arch}.expert_count"))
        .and_then(GgufValue::as_u64)
        .unwrap_or(0)
}

/// The `config.json` equivalent of `file`'s metadata for `model_type` (see [`model_type`]).
pub(crate) fn config_json(file: &GgufFile, arch: &str, model_type: &str) -> Result<Value> {
    let err = |msg: String| ModelError::Config {
        path: file.path().into(),
        msg,
    };
    let key = |k: &str| file.get(&format!("{arch}.{k}"));
    let int = |k: &str| -> Result<Option<u64>> {
        key(k)
            .map(|v| {
                v.as_u64()
                    .ok_or_else(|| err(format!("'{arch}.{k}' is not a non-negative integer")))
            })
            .transpose()
    };
    let need = |k: &str| -> Result<u64> {
        int(k)?.ok_or_else(|| err(format!("'{arch}.{k}' is missing; the file is incomplete")))
    };
    let float = |k: &str| -> Result<Option<f64>> {
        key(k)
            .map(|v| {
                v.as_f64()
                    .ok_or_else(|| err(format!("'{arch}.{k}' is not a number")))
            })
            .transpose()
    };
    let hidden = need("embedding_length")?;
    let heads = need("attention.head_count")?;
    let layers = need("block_count")?;
    if heads == 0 {
        return Err(err(format!(
            "'{arch}.attention.head_count' must be positive"
        )));
    }
    let head_dim = int("attention.key_length")?.unwrap_or(hidden / heads);
    let embd = file
        .tensors
        .get("token_embd.weight")
        .ok_or_else(|| err("the file has no token_embd.weight".into()))?;
    let vocab = match int("vocab_size")? {
        Some(v) => v,
        None => embd.shape().first().copied().unwrap_or(0) as u64,
    };
    let mut c = Map::new();
    let mut set = |k: &str, v: Value| {
        c.insert(k.into(), v);
    };
    set("model_type", json!(model_type));
    set("vocab_size", json!(vocab));
    set("hidden_size", json!(hidden));
    set("num_hidden_layers", json!(layers));
    set("num_attention_heads", json!(heads));
    set(
        "num_key_value_heads",
        json!(int("attention.head_count_kv")?.unwrap_or(heads)),
    );
    set("head_dim", json!(head_dim));
    set(
        "tie_word_embeddings",
        json!(!file.tensors.contains_key("output.weight")),
    );
    set(
        "attention_bias",
        json!(file.tensors.contains_key("blk.0.attn_q.bias")),
    );
    if let Some(v) = int("context_length")? {
        set("max_position_embeddings", json!(v));
    }
    if let Some(v) = float("attention.layer_norm_rms_epsilon")? {
        set("rms_norm_eps", json!(v));
    }
    // llama.cpp's default base when a file has none.
    set(
        "rope_theta",
        json!(float("rope.freq_base")?.unwrap_or(10_000.0)),
    );
    match key("rope.scaling.type").and_then(GgufValue::as_str) {
        None | Some("none") => {}
        Some("linear") => {
            let factor = float("rope.scaling.factor")?.unwrap_or(1.0);
            set(
                "rope_scaling",
                json!({"rope_type": "linear", "factor": factor}),
            );
        }
        Some(other) => {
            return Err(err(format!(
                "'{arch}.rope.scaling.type' = '{other}' is not supported for {model_type} \
                 (supported: none, linear)"
            )));
        }
    }
    if file.tensors.contains_key("rope_factors_long.weight") {
        return Err(err(format!(
            "the file carries LongRoPE factors (rope_factors_long.weight); {model_type} with \
             longrope scaling is not supported: use a model without it (the 4k-context Phi-3 \
             variants)"
        )));
    }
    let rotary = int("rope.dimension_count")?.unwrap_or(head_dim);
    if rotary != head_dim {
        if model_type != "phi3" || head_dim == 0 {
            return Err(err(format!(
                "'{arch}.rope.dimension_count' is {rotary} but heads are {head_dim} wide; \
                 partial rotary is supported for phi3 only"
            )));
        }
        set(
            "partial_rotary_factor",
            json!(rotary as f64 / head_dim as f64),
        );
    }
    let window = int("attention.sliding_window")?.filter(|&w| w > 0);
    if let Some(ff) = int("feed_forward_length")? {
        set("intermediate_size", json!(ff));
    }
    match model_type {
        "gemma2" | "gemma3_text" => {
            let (layers_27b, period) = if model_type == "gemma2" {
                (46, 2)
            } else {
                (62, 6)
            };
            let scalar = if layers == layers_27b {
                hidden / heads
            } else {
                head_dim
            };
            set("query_pre_attn_scalar", json!(scalar));
            set("hidden_activation", json!("gelu_pytorch_tanh"));
            // Absent caps: Gemma 2's defaults (50, 30) in both llama.cpp and transformers;
            // none for Gemma 3.
            for cap in ["attn_logit_softcapping", "final_logit_softcapping"] {
                if let Some(v) = float(cap)? {
                    set(cap, json!(v));
                }
            }
            if model_type == "gemma3_text" {
                set(
                    "rope_local_base_freq",
                    json!(float("rope.freq_base_swa")?.unwrap_or(10_000.0)),
                );
            }
            // llama.cpp: Gemma 2 always slides (4096 tokens unless the file says otherwise);
            // Gemma 3 only when the file has a window.
            let window = match (model_type, int("attention.sliding_window")?) {
                ("gemma2", None) => Some(4096),
                _ => window,
            };
            let types = match (window, key("attention.sliding_window_pattern")) {
                // Gemma 3 without a window: every layer global.
                (None, _) => vec![false; layers as usize],
                (Some(_), Some(GgufValue::Array(flags))) => flags
                    .iter()
                    .map(|f| {
                        f.as_bool().ok_or_else(|| {
                            err(format!(
                                "'{arch}.attention.sliding_window_pattern' must hold one \
                                 boolean per layer"
                            ))
                        })
                    })
                    .collect::<Result<Vec<_>>>()?,
                (Some(_), p) => {
                    let n = match p {
                        None => period,
                        Some(v) => v.as_u64().ok_or_else(|| {
                            err(format!(
                                "'{arch}.attention.sliding_window_pattern' is not an integer"
                            ))
                        })?,
                    };
                    // llama.cpp: a period of 0 makes every layer slide.
                    (0..layers)
                        .map(|i| n == 0 || i % n < n - 1)
                        .collect::<Vec<_>>()
                }
            };
            set("sliding_window", json!(window.unwrap_or(4096)));
            set(
                "layer_types",
                json!(
                    types
                        .iter()
                        .map(|&s| if s {
                            "sliding_attention"
                        } else {
                            "full_attention"
                        })
                        .collect::<Vec<_>>()
                ),
            );
        }
        "phi3" => {
            set("sliding_window", json!(window));
        }
        "granite" => {
            set(
                "attention_multiplier",
                json!(float("attention.scale")?.unwrap_or((head_dim as f64).powf(-0.5))),
            );
            set(
                "embedding_multiplier",
                json!(float("embedding_scale")?.unwrap_or(1.0)),
            );
            set(
                "residual_multiplier",
                json!(float("residual_scale")?.unwrap_or(1.0)),
            );
            let logit = float("logit_scale")?.ok_or_else(|| {
                err(format!(
                    "'{arch}.logit_scale' is missing; llama.cpp requires it"
                ))
            })?;
            set("logits_scaling", json!(logit));
        }
        "qwen3_moe" | "mixtral" => {
            set("num_local_experts", json!(need("expert_count")?));
            set("num_experts_per_tok", json!(need("expert_used_count")?));
            if model_type == "qwen3_moe" {
                // Layers without a router are dense (llama.cpp's converter writes none).
                let dense: Vec<u64> = (0..layers)
                    .filter(|i| {
                        !file
                            .tensors
                            .contains_key(&format!("blk.{i}.ffn_gate_inp.weight"))
                    })
                    .collect();
                set("mlp_only_layers", json!(dense));
                set("norm_topk_prob", json!(true));
                let expert_ff = match int("expert_feed_forward_length")? {
                    Some(v) => v,
                    None => expert_rows(file)?,
                };
                set("moe_intermediate_size", json!(expert_ff));
            } else {
                set("sliding_window", json!(window));
            }
        }
        _ => {}
    }
    Ok(Value::Object(c))
}

/// The width of the experts' hidden layer, from the first stacked gate tensor.
fn expert_rows(file: &GgufFile) -> Result<u64> {
    file.tensors
        .iter()
        .find(|(n, _)| n.ends_with(".ffn_gate_exps.weight"))
        .and_then(|(_, t)| t.shape().get(1).copied())
        .map(|v| v as u64)
        .ok_or_else(|| ModelError::Config {
            path: file.path().into(),
            msg: "a mixture-of-experts file without expert_feed_forward_length nor any \
                  ffn_gate_exps tensor"
                .into(),
        })
}

#[cfg(test)]
mod tests {
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
}
