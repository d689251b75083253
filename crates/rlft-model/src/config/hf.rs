//! Reading and writing Hugging Face `config.json` for every supported family, in both
//! transformers 5's spelling (`rope_parameters`, `layer_types`, `num_local_experts`) and the
//! hub's older one (top-level `rope_theta` + `rope_scaling`, `sliding_window_pattern`,
//! `num_experts`). A key that is missing takes the value transformers' config class gives it,
//! which is not always neutral (Gemma 2's soft-caps, Granite's `attention_multiplier`).

use super::hf_keys::{Keys, Rope, parse_rope, rope_key};
use super::{Activation, LayerType, MoeConfig, NormPlacement, TransformerConfig};
use crate::{ModelError, Result};
use serde_json::Value;
use std::path::Path;

/// The `model_type`s rlft loads.
pub const SUPPORTED: [&str; 14] = [
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "smollm",
    "smollm2",
    "smollm3",
    "gemma2",
    "gemma3_text",
    "phi3",
    "olmo2",
    "qwen3_moe",
    "mixtral",
    "granite",
];

impl TransformerConfig {
    /// Reads `config.json`.
    pub fn from_hf_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io {
            path: path.into(),
            source,
        })?;
        Self::from_hf_json(&text).map_err(|e| match e {
            ModelError::Config { msg, .. } => ModelError::Config {
                path: path.into(),
                msg,
            },
            other => other,
        })
    }

    /// Parses the text of a Hugging Face `config.json` (either spelling, see the module docs).
    pub fn from_hf_json(text: &str) -> Result<Self> {
        let err = |msg: String| ModelError::Config {
            path: "<memory>".into(),
            msg,
        };
        let value: Value = serde_json::from_str(text).map_err(|e| err(e.to_string()))?;
        let Value::Object(map) = value else {
            return Err(err("config.json must hold a JSON object".into()));
        };
        let k = Keys {
            map: &map,
            err: &err,
        };
        let model_type = k.str("model_type").unwrap_or("llama").to_string();
        if !SUPPORTED.contains(&model_type.as_str()) {
            return Err(err(format!(
                "model_type '{model_type}' is not supported; supported: {}",
                SUPPORTED.join(", ")
            )));
        }
        let family = model_type.as_str();
        let gemma = matches!(family, "gemma2" | "gemma3_text");
        let act_name = k
            .str("hidden_activation")
            .or_else(|| k.str("hidden_act"))
            .unwrap_or(if gemma { "gelu_pytorch_tanh" } else { "silu" });
        let activation = Activation::from_hf(act_name).ok_or_else(|| {
            err(format!(
                "hidden_act '{act_name}' is not supported (supported: silu, gelu_pytorch_tanh)"
            ))
        })?;
        let hidden = k.need_usize("hidden_size")?;
        let heads = k.need_usize("num_attention_heads")?;
        let kv = k.usize("num_key_value_heads")?.unwrap_or(heads);
        if heads == 0 || kv == 0 || !heads.is_multiple_of(kv) {
            return Err(err(format!(
                "num_attention_heads ({heads}) must be a positive multiple of num_key_value_heads ({kv})"
            )));
        }
        let head_dim = match k.usize("head_dim")? {
            Some(d) => d,
            None if gemma => 256,
            None => hidden / heads,
        };
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(err(format!(
                "head_dim {head_dim} must be even and > 0 for RoPE"
            )));
        }
        let num_layers = k.need_usize("num_hidden_layers")?;

        // RoPE: 5.x `rope_parameters` (flat, or one entry per layer type) or 4.x `rope_scaling`.
        let params = k.get("rope_parameters");
        let per_type = params
            .and_then(Value::as_object)
            .is_some_and(|m| m.contains_key("full_attention"));
        let global = if per_type {
            parse_rope(params.and_then(|p| p.get("full_attention")), &err)?
        } else {
            let mut r = parse_rope(params, &err)?;
            let scaling = parse_rope(k.get("rope_scaling"), &err)?;
            let scaled = |r: &Rope| r.llama3.is_some() || r.linear.is_some();
            if scaled(&r)
                && scaled(&scaling)
                && (r.llama3 != scaling.llama3 || r.linear != scaling.linear)
            {
                return Err(err(
                    "'rope_parameters' and 'rope_scaling' are two spellings of the RoPE scaling \
                     and disagree; keep one of them, or give both the same scaling"
                        .into(),
                ));
            }
            if !scaled(&r) {
                r.llama3 = scaling.llama3;
                r.linear = scaling.linear;
            }
            r
        };
        let default_theta = match family {
            "gemma3_text" | "mixtral" => 1e6,
            _ => 1e4,
        };
        let rope_theta = k
            .agree(
                ("rope_theta", k.f64("rope_theta")?),
                (rope_key(per_type, "rope_theta"), global.theta),
            )?
            .unwrap_or(default_theta);
        let rope_local_theta = if family == "gemma3_text" {
            let local = if per_type {
                parse_rope(params.and_then(|p| p.get("sliding_attention")), &err)?.theta
            } else {
                None
            };
            let local = k.agree(
                ("rope_parameters.sliding_attention.rope_theta", local),
                ("rope_local_base_freq", k.f64("rope_local_base_freq")?),
            )?;
            Some(local.unwrap_or(1e4))
        } else {
            None
        };
        let partial_rotary_factor = k
            .agree(
                ("partial_rotary_factor", k.f64("partial_rotary_factor")?),
                (
                    rope_key(per_type, "partial_rotary_factor"),
                    global.partial_rotary_factor,
                ),
            )?
            .unwrap_or(1.0);
        if !(partial_rotary_factor > 0.0 && partial_rotary_factor <= 1.0) {
            return Err(err(format!(
                "partial_rotary_factor {partial_rotary_factor} must be in (0, 1]"
            )));
        }

        // Sliding windows.
        let qwen = matches!(family, "qwen2" | "qwen3" | "qwen3_moe");
        if qwen && k.bool("use_sliding_window")? == Some(true) {
            return Err(err(
                "use_sliding_window = true is not supported for Qwen models; set it to false \
                 (Qwen checkpoints ship with it off)"
                    .into(),
            ));
        }
        let window = match family {
            "gemma2" | "gemma3_text" => Some(k.usize("sliding_window")?.unwrap_or(4096)),
            "phi3" | "mixtral" | "mistral" => k.usize("sliding_window")?,
            _ => None,
        };
        if window == Some(0) {
            return Err(err("sliding_window must be at least 1".into()));
        }
        let layer_types = match (window, k.get("layer_types")) {
            (None, _) => Vec::new(),
            (Some(_), Some(Value::Array(list))) if gemma => {
                let types = list
                    .iter()
                    .map(|t| match t.as_str() {
                        Some("sliding_attention") => Ok(LayerType::Sliding),
                        Some("full_attention") => Ok(LayerType::Full),
                        _ => Err(err(format!(
                            "layer_types entry {t} is neither \"sliding_attention\" nor \"full_attention\""
                        ))),
                    })
                    .collect::<Result<Vec<_>>>()?;
                if types.len() != num_layers {
                    return Err(err(format!(
                        "layer_types lists {} layers but num_hidden_layers is {num_layers}",
                        types.len()
                    )));
                }
                types
            }
            (Some(_), _) if family == "gemma2" => (0..num_layers)
                .map(|i| {
                    if i % 2 == 0 {
                        LayerType::Sliding
                    } else {
                        LayerType::Full
                    }
                })
                .collect(),
            (Some(_), _) if family == "gemma3_text" => {
                let pattern = k
                    .usize_either("sliding_window_pattern", "_sliding_window_pattern")?
                    .unwrap_or(6);
                if pattern == 0 {
                    return Err(err("sliding_window_pattern must be at least 1".into()));
                }
                (0..num_layers)
                    .map(|i| {
                        if (i + 1) % pattern != 0 {
                            LayerType::Sliding
                        } else {
                            LayerType::Full
                        }
                    })
                    .collect()
            }
            (Some(_), _) => Vec::new(),
        };

        // Attention scale and soft-caps.
        let attention_multiplier = match family {
            "gemma2" | "gemma3_text" => {
                let s = k.f64("query_pre_attn_scalar")?.unwrap_or(256.0);
                if s <= 0.0 {
                    return Err(err(format!("query_pre_attn_scalar {s} must be positive")));
                }
                Some(s.powf(-0.5))
            }
            "granite" => Some(k.f64("attention_multiplier")?.unwrap_or(1.0)),
            _ => None,
        };
        let softcap = |key: &str, default: Option<f64>| -> Result<Option<f64>> {
            let v = match k.nullable_f64(key)? {
                None => default,
                Some(v) => v,
            };
            match v {
                Some(c) if c <= 0.0 => Err(err(format!("{key} {c} must be positive or null"))),
                v => Ok(v),
            }
        };
        let (attn_cap, final_cap) = match family {
            "gemma2" => (
                softcap("attn_logit_softcapping", Some(50.0))?,
                softcap("final_logit_softcapping", Some(30.0))?,
            ),
            // transformers' Gemma 3 never applies `attn_logit_softcapping`.
            "gemma3_text" => (None, softcap("final_logit_softcapping", None)?),
            _ => (None, None),
        };
        let granite = |key: &str| -> Result<f64> {
            Ok(if family == "granite" {
                k.f64(key)?.unwrap_or(1.0)
            } else {
                1.0
            })
        };
        let logits_scaling = granite("logits_scaling")?;
        if logits_scaling == 0.0 {
            return Err(err("logits_scaling must not be 0".into()));
        }

        let moe = match family {
            "qwen3_moe" => {
                let experts = k
                    .usize_either("num_experts", "num_local_experts")?
                    .unwrap_or(128);
                let mlp_only = match k.get("mlp_only_layers") {
                    None | Some(Value::Null) => Vec::new(),
                    Some(Value::Array(v)) => v
                        .iter()
                        .map(|x| {
                            x.as_u64().map(|x| x as usize).ok_or_else(|| {
                                err(format!("mlp_only_layers entry {x} is not a layer index"))
                            })
                        })
                        .collect::<Result<Vec<_>>>()?,
                    Some(v) => return Err(err(format!("mlp_only_layers must be a list, got {v}"))),
                };
                Some(MoeConfig {
                    num_experts: experts,
                    experts_per_token: k.usize("num_experts_per_tok")?.unwrap_or(8),
                    expert_intermediate_size: k.usize("moe_intermediate_size")?.unwrap_or(768),
                    norm_topk_prob: k.bool("norm_topk_prob")?.unwrap_or(false),
                    mlp_only_layers: mlp_only,
                    decoder_sparse_step: k.usize("decoder_sparse_step")?.unwrap_or(1),
                })
            }
            "mixtral" => Some(MoeConfig {
                num_experts: k
                    .usize_either("num_local_experts", "num_experts")?
                    .unwrap_or(8),
                experts_per_token: k.usize("num_experts_per_tok")?.unwrap_or(2),
                expert_intermediate_size: k.need_usize("intermediate_size")?,
                norm_topk_prob: true,
                mlp_only_layers: Vec::new(),
                decoder_sparse_step: 1,
            }),
            _ => None,
        };
        if let Some(m) = &moe {
            if m.experts_per_token == 0 || m.experts_per_token > m.num_experts {
                return Err(err(format!(
                    "num_experts_per_tok ({}) must be between 1 and the number of experts ({})",
                    m.experts_per_token, m.num_experts
                )));
            }
            if m.expert_intermediate_size == 0 || m.decoder_sparse_step == 0 {
                return Err(err(
                    "moe_intermediate_size and decoder_sparse_step must be at least 1".into(),
                ));
            }
        }
        let intermediate_size = match family {
            "mixtral" => k.usize("intermediate_size")?.unwrap_or(0),
            _ => k.need_usize("intermediate_size")?,
        };
        let eps_default = match family {
            "phi3" | "mixtral" | "olmo2" => 1e-5,
            _ => 1e-6,
        };
        let cfg = TransformerConfig {
            model_type: model_type.clone(),
            vocab_size: k.need_usize("vocab_size")?,
            hidden_size: hidden,
            intermediate_size,
            num_layers,
            num_heads: heads,
            num_kv_heads: kv,
            head_dim,
            rms_norm_eps: k.f64("rms_norm_eps")?.unwrap_or(eps_default),
            rope_theta,
            rope_scaling: global.llama3,
            tie_word_embeddings: k.bool("tie_word_embeddings")?.unwrap_or(gemma),
            attention_bias: k.bool("attention_bias")?.unwrap_or(family == "qwen2")
                && !matches!(family, "phi3" | "mixtral"),
            qk_norm: matches!(family, "qwen3" | "qwen3_moe" | "gemma3_text" | "olmo2"),
            max_position_embeddings: k.usize("max_position_embeddings")?.unwrap_or(4096),
            norm_placement: match family {
                "gemma2" | "gemma3_text" => NormPlacement::Sandwich,
                "olmo2" => NormPlacement::Post,
                _ => NormPlacement::Pre,
            },
            norm_unit_offset: gemma,
            qk_norm_whole: family == "olmo2",
            activation,
            embedding_multiplier: if gemma {
                (hidden as f64).sqrt()
            } else {
                granite("embedding_multiplier")?
            },
            attention_multiplier,
            attn_logit_softcapping: attn_cap,
            final_logit_softcapping: final_cap,
            residual_multiplier: granite("residual_multiplier")?,
            logits_scaling,
            partial_rotary_factor,
            sliding_window: window,
            layer_types,
            rope_local_theta,
            rope_linear_factor: global.linear,
            moe,
        };
        if cfg.rotary_dim() < 2 {
            return Err(err(format!(
                "partial_rotary_factor {partial_rotary_factor} leaves fewer than 2 of head_dim \
                 {head_dim} dims rotating"
            )));
        }
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(model_type: &str, extra: &str) -> Result<TransformerConfig> {
        TransformerConfig::from_hf_json(&format!(
            r#"{{"model_type":"{model_type}","vocab_size":10,"hidden_size":16,"intermediate_size":24,
            "num_hidden_layers":4,"num_attention_heads":2,"num_key_value_heads":1{extra}}}"#
        ))
    }

    #[test]
    fn missing_keys_take_transformers_class_defaults() {
        let g2 = parse("gemma2", "").unwrap();
        assert_eq!(g2.attn_logit_softcapping, Some(50.0));
        assert_eq!(g2.final_logit_softcapping, Some(30.0));
        assert_eq!(g2.head_dim, 256);
        assert_eq!(g2.sliding_window, Some(4096));
        assert_eq!(g2.attention_multiplier, Some(1.0 / 16.0));
        assert!(g2.tie_word_embeddings && g2.norm_unit_offset);
        assert_eq!(g2.embedding_multiplier, 4.0);
        assert_eq!(
            (0..4).map(|i| g2.layer_type(i)).collect::<Vec<_>>(),
            [
                LayerType::Sliding,
                LayerType::Full,
                LayerType::Sliding,
                LayerType::Full
            ]
        );
        let off = parse(
            "gemma2",
            r#","attn_logit_softcapping":null,"final_logit_softcapping":null"#,
        )
        .unwrap();
        assert_eq!(off.attn_logit_softcapping, None);
        assert_eq!(off.final_logit_softcapping, None);
        let g3 = parse("gemma3_text", r#","attn_logit_softcapping":1.0"#).unwrap();
        assert_eq!(g3.attn_logit_softcapping, None, "Gemma 3 ignores it");
        assert_eq!((g3.rope_theta, g3.rope_local_theta), (1e6, Some(1e4)));
        let q = parse("qwen3_moe", r#","num_experts":16"#).unwrap();
        let m = q.moe.as_ref().unwrap();
        assert!(!m.norm_topk_prob && m.decoder_sparse_step == 1 && m.experts_per_token == 8);
        let granite = parse("granite", "").unwrap();
        assert_eq!(
            granite.attention_multiplier,
            Some(1.0),
            "scale 1, not 1/sqrt(d)"
        );
        let mixtral = parse("mixtral", "").unwrap();
        assert_eq!(mixtral.rope_theta, 1e6);
        assert_eq!(mixtral.moe.unwrap().experts_per_token, 2);
        assert_eq!(parse("olmo2", "").unwrap().rms_norm_eps, 1e-5);
    }

    #[test]
    fn two_spellings_that_disagree_are_refused_naming_both() {
        for (family, keys, names) in [
            (
                "qwen3_moe",
                r#","num_experts":8,"num_local_experts":4"#,
                ["'num_experts' (8)", "'num_local_experts' (4)"],
            ),
            (
                "mixtral",
                r#","num_experts":8,"num_local_experts":4"#,
                ["'num_local_experts' (4)", "'num_experts' (8)"],
            ),
            (
                "llama",
                r#","rope_theta":10000.0,"rope_parameters":{"rope_theta":500000.0}"#,
                ["'rope_theta'", "'rope_parameters.rope_theta'"],
            ),
            (
                "phi3",
                r#","partial_rotary_factor":0.5,"rope_parameters":{"partial_rotary_factor":0.75}"#,
                [
                    "'partial_rotary_factor'",
                    "'rope_parameters.partial_rotary_factor'",
                ],
            ),
            (
                "gemma3_text",
                r#","head_dim":8,"sliding_window_pattern":3,"_sliding_window_pattern":6"#,
                ["'sliding_window_pattern'", "'_sliding_window_pattern'"],
            ),
            (
                "gemma3_text",
                r#","head_dim":8,"rope_local_base_freq":1e4,
                "rope_parameters":{"full_attention":{"rope_theta":1e6},
                "sliding_attention":{"rope_theta":2e4}}"#,
                [
                    "'rope_parameters.sliding_attention.rope_theta'",
                    "'rope_local_base_freq'",
                ],
            ),
            (
                "llama",
                r#","rope_parameters":{"rope_type":"linear","factor":2.0},
                "rope_scaling":{"rope_type":"linear","factor":4.0}"#,
                ["'rope_parameters'", "'rope_scaling'"],
            ),
        ] {
            let e = parse(family, keys).unwrap_err().to_string();
            for n in names {
                assert!(e.contains(n), "{family} {keys}: {e}");
            }
            assert!(e.contains("disagree"), "{e}");
        }
        // Both spellings with one value are one setting.
        let both = parse("qwen3_moe", r#","num_experts":16,"num_local_experts":16"#).unwrap();
        assert_eq!(both.moe.unwrap().num_experts, 16);
        let both = parse(
            "llama",
            r#","rope_theta":5e5,"rope_parameters":{"rope_theta":5e5,"rope_type":"default"}"#,
        )
        .unwrap();
        assert_eq!(both.rope_theta, 5e5);
    }

    #[test]
    fn both_spellings_read_the_same() {
        let hub = parse(
            "gemma3_text",
            r#","head_dim":8,"rope_theta":1e6,"rope_local_base_freq":1e4,
            "rope_scaling":{"rope_type":"linear","factor":8.0},"sliding_window":6,
            "sliding_window_pattern":3"#,
        )
        .unwrap();
        let v5 = parse(
            "gemma3_text",
            r#","head_dim":8,"sliding_window":6,
            "layer_types":["sliding_attention","sliding_attention","full_attention","sliding_attention"],
            "rope_parameters":{"full_attention":{"rope_type":"linear","factor":8.0,"rope_theta":1e6},
            "sliding_attention":{"rope_type":"default","rope_theta":1e4}}"#,
        )
        .unwrap();
        assert_eq!(hub.layer_types, v5.layer_types);
        assert_eq!(hub, v5);
        assert_eq!(hub.rope_linear_factor, Some(8.0));
        let a = parse("qwen3_moe", r#","num_experts":8"#).unwrap();
        let b = parse("qwen3_moe", r#","num_local_experts":8"#).unwrap();
        assert_eq!(a, b);
        let a = parse("phi3", r#","partial_rotary_factor":0.5"#).unwrap();
        let b = parse(
            "phi3",
            r#","rope_parameters":{"rope_type":"default","rope_theta":10000.0,"partial_rotary_factor":0.5}"#,
        )
        .unwrap();
        assert_eq!(a, b);
        assert_eq!(a.rotary_dim(), 4);
        assert_eq!(a.inv_freq().len(), 2);
        // Written back and read again, every family keeps its settings.
        for cfg in [
            hub,
            a,
            parse("granite", r#","logits_scaling":2.0"#).unwrap(),
        ] {
            let again = TransformerConfig::from_hf_json(&cfg.to_hf_json().to_string()).unwrap();
            assert_eq!(again, cfg);
        }
    }

    #[test]
    fn unsupported_settings_are_errors_that_say_so() {
        let e = parse(
            "phi3",
            r#","rope_scaling":{"type":"longrope","short_factor":[1.0],"long_factor":[1.0]}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("longrope") && e.contains("not supported"), "{e}");
        let e = parse("qwen2", r#","use_sliding_window":true"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("use_sliding_window"), "{e}");
        let e = parse("mixtral", r#","num_experts_per_tok":9"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("num_experts_per_tok"), "{e}");
        let e = parse("gemma2", r#","layer_types":["sliding_attention"]"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("layer_types"), "{e}");
        let e = parse("gemma2", r#","hidden_activation":"relu""#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("relu"), "{e}");
    }
}
