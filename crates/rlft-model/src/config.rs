//! Model configuration from a Hugging Face `config.json` (Llama 1/2/3, Mistral, Qwen2, Qwen3,
//! SmolLM/SmolLM2).

use crate::{ModelError, Result};
use burn::config::Config;
use serde::Deserialize;
use std::path::Path;

/// Llama 3 RoPE frequency scaling (`rope_type = "llama3"`).
#[derive(Config, Debug, PartialEq)]
pub struct Llama3RopeScaling {
    /// Overall scale factor.
    pub factor: f64,
    /// Low-frequency factor.
    pub low_freq_factor: f64,
    /// High-frequency factor.
    pub high_freq_factor: f64,
    /// Context length the base model was trained with.
    pub original_max_position_embeddings: f64,
}

/// The resolved architecture of a decoder-only transformer.
#[derive(Config, Debug, PartialEq)]
pub struct TransformerConfig {
    /// HF `model_type` written on export (`llama`, `mistral`, `qwen2`, `qwen3`, ...).
    #[config(default = "String::from(\"llama\")")]
    pub model_type: String,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Model width `d`.
    pub hidden_size: usize,
    /// SwiGLU inner width.
    pub intermediate_size: usize,
    /// Number of decoder layers.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (grouped-query attention when fewer than `num_heads`).
    pub num_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// RMSNorm ε.
    #[config(default = 1e-6)]
    pub rms_norm_eps: f64,
    /// RoPE base θ.
    #[config(default = 10000.0)]
    pub rope_theta: f64,
    /// Llama 3 RoPE scaling, if any.
    pub rope_scaling: Option<Llama3RopeScaling>,
    /// The output head shares the embedding matrix.
    #[config(default = false)]
    pub tie_word_embeddings: bool,
    /// q/k/v projections have biases (Qwen2).
    #[config(default = false)]
    pub attention_bias: bool,
    /// RMSNorm on q and k per head before RoPE (Qwen3).
    #[config(default = false)]
    pub qk_norm: bool,
    /// Longest supported context.
    #[config(default = 4096)]
    pub max_position_embeddings: usize,
}

#[derive(Debug, Deserialize)]
struct RopeParameters {
    rope_theta: Option<f64>,
    rope_type: Option<String>,
    #[serde(rename = "type")]
    kind: Option<String>,
    factor: Option<f64>,
    low_freq_factor: Option<f64>,
    high_freq_factor: Option<f64>,
    original_max_position_embeddings: Option<f64>,
}

#[derive(Debug, Deserialize)]
struct HfConfig {
    model_type: Option<String>,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    rope_parameters: Option<RopeParameters>,
    rope_scaling: Option<RopeParameters>,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    max_position_embeddings: Option<usize>,
    hidden_act: Option<String>,
}

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

    /// Parses the text of a Hugging Face `config.json`. Accepts both a top-level `rope_theta`
    /// and transformers 5's `rope_parameters`.
    pub fn from_hf_json(text: &str) -> Result<Self> {
        let err = |msg: String| ModelError::Config {
            path: "<memory>".into(),
            msg,
        };
        let hf: HfConfig = serde_json::from_str(text).map_err(|e| err(e.to_string()))?;
        let model_type = hf.model_type.clone().unwrap_or_else(|| "llama".into());
        let known = [
            "llama", "mistral", "qwen2", "qwen3", "smollm", "smollm2", "smollm3",
        ];
        if !known.contains(&model_type.as_str()) {
            return Err(err(format!(
                "model_type '{model_type}' is not supported; supported: {}",
                known.join(", ")
            )));
        }
        if let Some(act) = &hf.hidden_act
            && act != "silu"
        {
            return Err(err(format!(
                "hidden_act '{act}' is not supported (only silu/SwiGLU)"
            )));
        }
        let heads = hf.num_attention_heads;
        let kv = hf.num_key_value_heads.unwrap_or(heads);
        if heads == 0 || kv == 0 || !heads.is_multiple_of(kv) {
            return Err(err(format!(
                "num_attention_heads ({heads}) must be a positive multiple of num_key_value_heads ({kv})"
            )));
        }
        let head_dim = hf.head_dim.unwrap_or(hf.hidden_size / heads);
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(err(format!(
                "head_dim {head_dim} must be even and > 0 for RoPE"
            )));
        }
        let rope = hf.rope_parameters.as_ref().or(hf.rope_scaling.as_ref());
        let rope_theta = hf
            .rope_theta
            .or_else(|| rope.and_then(|r| r.rope_theta))
            .unwrap_or(10000.0);
        let rope_type = rope.and_then(|r| r.rope_type.clone().or_else(|| r.kind.clone()));
        let rope_scaling = match rope_type.as_deref() {
            None | Some("default") => None,
            Some("llama3") => {
                let r = rope.ok_or_else(|| err("llama3 rope scaling without parameters".into()))?;
                let need = |v: Option<f64>, name: &str| {
                    v.ok_or_else(|| err(format!("llama3 rope scaling needs '{name}'")))
                };
                Some(Llama3RopeScaling {
                    factor: need(r.factor, "factor")?,
                    low_freq_factor: need(r.low_freq_factor, "low_freq_factor")?,
                    high_freq_factor: need(r.high_freq_factor, "high_freq_factor")?,
                    original_max_position_embeddings: need(
                        r.original_max_position_embeddings,
                        "original_max_position_embeddings",
                    )?,
                })
            }
            Some(other) => {
                return Err(err(format!(
                    "rope_type '{other}' is not supported (supported: default, llama3)"
                )));
            }
        };
        Ok(TransformerConfig {
            model_type: model_type.clone(),
            vocab_size: hf.vocab_size,
            hidden_size: hf.hidden_size,
            intermediate_size: hf.intermediate_size,
            num_layers: hf.num_hidden_layers,
            num_heads: heads,
            num_kv_heads: kv,
            head_dim,
            rms_norm_eps: hf.rms_norm_eps.unwrap_or(1e-6),
            rope_theta,
            rope_scaling,
            tie_word_embeddings: hf.tie_word_embeddings.unwrap_or(false),
            attention_bias: hf.attention_bias.unwrap_or(model_type == "qwen2"),
            qk_norm: model_type == "qwen3",
            max_position_embeddings: hf.max_position_embeddings.unwrap_or(4096),
        })
    }

    /// The `config.json` transformers and vLLM read for this architecture.
    pub fn to_hf_json(&self) -> serde_json::Value {
        let (arch, model_type) = match self.model_type.as_str() {
            "qwen2" => ("Qwen2ForCausalLM", "qwen2"),
            "qwen3" => ("Qwen3ForCausalLM", "qwen3"),
            "mistral" => ("MistralForCausalLM", "mistral"),
            _ => ("LlamaForCausalLM", "llama"),
        };
        let mut rope = serde_json::json!({"rope_type": "default", "rope_theta": self.rope_theta});
        if let Some(s) = &self.rope_scaling {
            // transformers wants an integer here (and warns about 8192.0).
            let orig = s.original_max_position_embeddings;
            let orig = if orig.fract() == 0.0 && (0.0..9e15).contains(&orig) {
                serde_json::json!(orig as u64)
            } else {
                serde_json::json!(orig)
            };
            rope = serde_json::json!({
                "rope_type": "llama3", "rope_theta": self.rope_theta, "factor": s.factor,
                "low_freq_factor": s.low_freq_factor, "high_freq_factor": s.high_freq_factor,
                "original_max_position_embeddings": orig,
            });
        }
        serde_json::json!({
            "architectures": [arch],
            "model_type": model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": if self.rope_scaling.is_some() { rope.clone() } else { serde_json::Value::Null },
            "rope_parameters": rope,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "mlp_bias": false,
            "max_position_embeddings": self.max_position_embeddings,
            "torch_dtype": "float32",
            "dtype": "float32",
        })
    }

    /// RoPE inverse frequencies `θ^(−2i/d)`, with Llama 3 scaling applied when configured.
    pub fn inv_freq(&self) -> Vec<f64> {
        let d = self.head_dim as f64;
        let base: Vec<f64> = (0..self.head_dim / 2)
            .map(|i| 1.0 / self.rope_theta.powf(2.0 * i as f64 / d))
            .collect();
        let Some(s) = &self.rope_scaling else {
            return base;
        };
        let low_wavelen = s.original_max_position_embeddings / s.low_freq_factor;
        let high_wavelen = s.original_max_position_embeddings / s.high_freq_factor;
        base.into_iter()
            .map(|f| {
                let wavelen = 2.0 * std::f64::consts::PI / f;
                if wavelen < high_wavelen {
                    f
                } else if wavelen > low_wavelen {
                    f / s.factor
                } else {
                    let smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor)
                        / (s.high_freq_factor - s.low_freq_factor);
                    (1.0 - smooth) * f / s.factor + smooth * f
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_both_rope_theta_spellings() {
        let base = r#"{"model_type":"qwen2","vocab_size":10,"hidden_size":8,"intermediate_size":16,
            "num_hidden_layers":1,"num_attention_heads":2,"num_key_value_heads":1"#;
        let a = TransformerConfig::from_hf_json(&format!("{base},\"rope_theta\":1e6}}")).unwrap();
        let b = TransformerConfig::from_hf_json(&format!(
            "{base},\"rope_parameters\":{{\"rope_theta\":1e6,\"rope_type\":\"default\"}}}}"
        ))
        .unwrap();
        assert_eq!(a, b);
        assert_eq!(a.rope_theta, 1e6);
        assert!(a.attention_bias && a.head_dim == 4);
    }

    #[test]
    fn rejects_bad_configs() {
        let e = TransformerConfig::from_hf_json(r#"{"model_type":"gpt2"}"#).unwrap_err();
        assert!(e.to_string().contains("invalid model config"), "{e}");
        let e = TransformerConfig::from_hf_json(
            r#"{"model_type":"llama","vocab_size":10,"hidden_size":8,"intermediate_size":16,
            "num_hidden_layers":1,"num_attention_heads":3,"num_key_value_heads":2}"#,
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("multiple of num_key_value_heads"),
            "{e}"
        );
    }
}
