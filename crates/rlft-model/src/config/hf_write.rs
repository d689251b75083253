//! Writing a family's `config.json` back: the keys transformers reads for it, in the spelling
//! both transformers 5 and older releases accept.

use super::TransformerConfig;
use serde_json::{Value, json};

impl TransformerConfig {
    /// The `config.json` transformers and vLLM read for this architecture.
    pub fn to_hf_json(&self) -> Value {
        let family = self.model_type.as_str();
        let (arch, model_type) = match family {
            "qwen2" => ("Qwen2ForCausalLM", "qwen2"),
            "qwen3" => ("Qwen3ForCausalLM", "qwen3"),
            "mistral" => ("MistralForCausalLM", "mistral"),
            "gemma2" => ("Gemma2ForCausalLM", "gemma2"),
            "gemma3_text" => ("Gemma3ForCausalLM", "gemma3_text"),
            "phi3" => ("Phi3ForCausalLM", "phi3"),
            "olmo2" => ("Olmo2ForCausalLM", "olmo2"),
            "qwen3_moe" => ("Qwen3MoeForCausalLM", "qwen3_moe"),
            "mixtral" => ("MixtralForCausalLM", "mixtral"),
            "granite" => ("GraniteForCausalLM", "granite"),
            _ => ("LlamaForCausalLM", "llama"),
        };
        let mut rope = json!({"rope_type": "default", "rope_theta": self.rope_theta});
        if let Some(f) = self.rope_linear_factor {
            rope = json!({"rope_type": "linear", "rope_theta": self.rope_theta, "factor": f});
        }
        if let Some(s) = &self.rope_scaling {
            // transformers wants an integer here (and warns about 8192.0).
            let orig = s.original_max_position_embeddings;
            let orig = if orig.fract() == 0.0 && (0.0..9e15).contains(&orig) {
                json!(orig as u64)
            } else {
                json!(orig)
            };
            rope = json!({
                "rope_type": "llama3", "rope_theta": self.rope_theta, "factor": s.factor,
                "low_freq_factor": s.low_freq_factor, "high_freq_factor": s.high_freq_factor,
                "original_max_position_embeddings": orig,
            });
        }
        let scaled = self.rope_scaling.is_some() || self.rope_linear_factor.is_some();
        let mut out = json!({
            "architectures": [arch],
            "model_type": model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": self.activation.hf_name(),
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": if scaled { rope.clone() } else { Value::Null },
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "mlp_bias": false,
            "max_position_embeddings": self.max_position_embeddings,
            "torch_dtype": "float32",
            "dtype": "float32",
        });
        let o = out.as_object_mut().expect("an object");
        let mut set = |key: &str, v: Value| {
            o.insert(key.into(), v);
        };
        if family != "gemma3_text" {
            set("rope_parameters", rope);
        }
        if let Some(w) = self.sliding_window {
            set("sliding_window", json!(w));
            if !self.layer_types.is_empty() {
                let types: Vec<&str> = self.layer_types.iter().map(|t| t.hf_name()).collect();
                set("layer_types", json!(types));
            }
        } else if matches!(
            family,
            "gemma2" | "gemma3_text" | "phi3" | "mixtral" | "mistral"
        ) {
            set("sliding_window", Value::Null);
        }
        match family {
            "gemma2" | "gemma3_text" => {
                set("hidden_activation", json!(self.activation.hf_name()));
                let m = self.attention_multiplier.unwrap_or(1.0);
                let scalar = 1.0 / (m * m);
                let scalar = if (scalar - scalar.round()).abs() < 1e-9 * scalar.max(1.0) {
                    json!(scalar.round() as u64)
                } else {
                    json!(scalar)
                };
                set("query_pre_attn_scalar", scalar);
                set("attn_logit_softcapping", json!(self.attn_logit_softcapping));
                set(
                    "final_logit_softcapping",
                    json!(self.final_logit_softcapping),
                );
                if let Some(t) = self.rope_local_theta {
                    set("rope_local_base_freq", json!(t));
                }
            }
            "phi3" => set("partial_rotary_factor", json!(self.partial_rotary_factor)),
            "granite" => {
                set("embedding_multiplier", json!(self.embedding_multiplier));
                set(
                    "attention_multiplier",
                    json!(self.attention_multiplier.unwrap_or(1.0)),
                );
                set("residual_multiplier", json!(self.residual_multiplier));
                set("logits_scaling", json!(self.logits_scaling));
            }
            _ => {}
        }
        if let Some(m) = &self.moe {
            set("num_experts_per_tok", json!(m.experts_per_token));
            if family == "mixtral" {
                set("num_local_experts", json!(m.num_experts));
                set("intermediate_size", json!(m.expert_intermediate_size));
            } else {
                set("num_experts", json!(m.num_experts));
                set("moe_intermediate_size", json!(m.expert_intermediate_size));
                set("norm_topk_prob", json!(m.norm_topk_prob));
                set("mlp_only_layers", json!(m.mlp_only_layers));
                set("decoder_sparse_step", json!(m.decoder_sparse_step));
            }
        }
        out
    }
}
