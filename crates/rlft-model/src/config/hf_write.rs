//! Writing a family's `config.json` back: the keys every family shares here, the family's own
//! from its [`crate::families::Family::write_hf`], in the spelling both transformers 5 and
//! older releases accept.

use super::TransformerConfig;
use super::families::SlidingWindow;
use serde_json::{Value, json};

impl TransformerConfig {
    /// The `config.json` transformers and vLLM read for this architecture.
    pub fn to_hf_json(&self) -> Value {
        let family = self.family();
        let rope = self.rope_parameters();
        let scaled = self.rope_scaling.is_some() || self.rope_linear_factor.is_some();
        let mut out = json!({
            "architectures": [family.hf_class()],
            "model_type": family.model_type(),
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
            "rope_parameters": rope,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "mlp_bias": false,
            "max_position_embeddings": self.max_position_embeddings,
            "torch_dtype": "float32",
            "dtype": "float32",
        });
        if let Value::Object(o) = &mut out {
            if let Some(w) = self.sliding_window {
                o.insert("sliding_window".into(), json!(w));
                if !self.layer_types.is_empty() {
                    let types: Vec<&str> = self.layer_types.iter().map(|t| t.hf_name()).collect();
                    o.insert("layer_types".into(), json!(types));
                }
            } else if family.hf_defaults().sliding_window != SlidingWindow::Never {
                o.insert("sliding_window".into(), Value::Null);
            }
            family.write_hf(self, o);
        }
        out
    }

    /// The RoPE parameter set, as `rope_parameters` (and `rope_scaling` when scaled) spell it.
    fn rope_parameters(&self) -> Value {
        if let Some(s) = &self.rope_scaling {
            // transformers wants an integer here (and warns about 8192.0).
            let orig = s.original_max_position_embeddings;
            let orig = if orig.fract() == 0.0 && (0.0..9e15).contains(&orig) {
                json!(orig as u64)
            } else {
                json!(orig)
            };
            return json!({
                "rope_type": "llama3", "rope_theta": self.rope_theta, "factor": s.factor,
                "low_freq_factor": s.low_freq_factor, "high_freq_factor": s.high_freq_factor,
                "original_max_position_embeddings": orig,
            });
        }
        if let Some(f) = self.rope_linear_factor {
            return json!({"rope_type": "linear", "rope_theta": self.rope_theta, "factor": f});
        }
        json!({"rope_type": "default", "rope_theta": self.rope_theta})
    }
}
