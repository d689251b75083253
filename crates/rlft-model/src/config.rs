//! Model configuration from a Hugging Face `config.json`: the Llama family (Llama 1/2/3,
//! Mistral, Qwen2, Qwen3, SmolLM/SmolLM2), Gemma 2/3, Phi-3/Phi-4-mini, OLMo 2, Granite, and the
//! mixtures of experts Qwen3-MoE and Mixtral.

pub mod families;
mod gguf_keys;
mod hf;
mod hf_keys;
mod hf_write;
mod parts;

use burn::config::Config;
use families::Family;
pub use gguf_keys::GgufKeys;
pub(crate) use hf::MAX_LAYERS;
pub use hf_keys::ConfigKeys;
pub use parts::{Activation, LayerType, MoeConfig, NormPlacement, WeightLayout};

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
    /// HF `model_type`, which names the family ([`crate::families`]): Llama's by default.
    #[config(default = "families::default_family().model_type().to_string()")]
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
    /// Where each layer's norms sit.
    #[config(default = "NormPlacement::Pre")]
    pub norm_placement: NormPlacement,
    /// RMSNorms scale by `1 + w` (Gemma) instead of the stored `w`.
    #[config(default = false)]
    pub norm_unit_offset: bool,
    /// With `qk_norm`: one norm over the whole q (k) projection (OLMo 2) instead of one per head.
    #[config(default = false)]
    pub qk_norm_whole: bool,
    /// The gated MLP's activation.
    #[config(default = "Activation::Silu")]
    pub activation: Activation,
    /// Input embeddings are multiplied by this (Gemma: √hidden; Granite's
    /// `embedding_multiplier`); the tied output head uses the raw matrix.
    #[config(default = 1.0)]
    pub embedding_multiplier: f64,
    /// Attention scores are multiplied by this; `None`: `1/√head_dim` (Gemma:
    /// `query_pre_attn_scalar^−½`; Granite: `attention_multiplier`).
    pub attention_multiplier: Option<f64>,
    /// Attention scores `s ← c·tanh(s/c)` before the mask (Gemma 2).
    pub attn_logit_softcapping: Option<f64>,
    /// Logits `z ← c·tanh(z/c)` after the head (Gemma 2/3).
    pub final_logit_softcapping: Option<f64>,
    /// Each sub-layer's output is multiplied by this before the residual add (Granite).
    #[config(default = 1.0)]
    pub residual_multiplier: f64,
    /// Logits are divided by this (Granite's `logits_scaling`).
    #[config(default = 1.0)]
    pub logits_scaling: f64,
    /// The fraction of each head's dims that rotate (Phi-4-mini: 0.75); the rest pass through.
    #[config(default = 1.0)]
    pub partial_rotary_factor: f64,
    /// Window of sliding-attention layers.
    pub sliding_window: Option<usize>,
    /// Attention type per layer; empty: every layer slides when `sliding_window` is set,
    /// otherwise none does.
    #[config(default = "Vec::new()")]
    pub layer_types: Vec<LayerType>,
    /// RoPE θ of sliding layers, unscaled (Gemma 3's `rope_local_base_freq`); `None`: as global.
    pub rope_local_theta: Option<f64>,
    /// Linear RoPE scaling: frequencies divided by this (on global layers only when
    /// `rope_local_theta` is set).
    pub rope_linear_factor: Option<f64>,
    /// Sparse mixture-of-experts blocks (Qwen3-MoE, Mixtral).
    pub moe: Option<MoeConfig>,
}

impl TransformerConfig {
    /// The family `model_type` names; Llama's for a `model_type` that names none (a
    /// configuration built in code).
    pub fn family(&self) -> &'static dyn Family {
        families::by_model_type(&self.model_type).unwrap_or(families::default_family())
    }

    /// This configuration as the family `family` (its `model_type`).
    pub fn with_family(self, family: &dyn Family) -> Self {
        self.with_model_type(family.model_type().to_string())
    }

    /// How this family names its weights on disk.
    pub fn weight_layout(&self) -> WeightLayout {
        self.family().weight_layout()
    }

    /// The attention type of layer `i`.
    pub fn layer_type(&self, i: usize) -> LayerType {
        match (self.sliding_window, self.layer_types.get(i)) {
            (None, _) => LayerType::Full,
            (Some(_), Some(t)) => *t,
            (Some(_), None) if self.layer_types.is_empty() => LayerType::Sliding,
            (Some(_), None) => LayerType::Full,
        }
    }

    /// The window of layer `i` (`None`: full causal attention).
    pub fn layer_window(&self, i: usize) -> Option<usize> {
        match self.layer_type(i) {
            LayerType::Full => None,
            LayerType::Sliding => self.sliding_window,
        }
    }

    /// Whether layer `i` has a mixture of experts.
    pub fn is_sparse_layer(&self, i: usize) -> bool {
        self.moe.as_ref().is_some_and(|m| m.is_sparse(i))
    }

    /// Dims of each head that rotate (even, at most `head_dim`).
    pub fn rotary_dim(&self) -> usize {
        let r = (self.head_dim as f64 * self.partial_rotary_factor) as usize;
        (r - r % 2).min(self.head_dim)
    }

    /// RoPE inverse frequencies of sliding layers when they use their own base (Gemma 3:
    /// `rope_local_base_freq`, unscaled); `None`: every layer uses [`TransformerConfig::inv_freq`].
    pub fn local_inv_freq(&self) -> Option<Vec<f64>> {
        let theta = self.rope_local_theta?;
        let r = self.rotary_dim();
        Some(
            (0..r / 2)
                .map(|i| 1.0 / theta.powf(2.0 * i as f64 / r as f64))
                .collect(),
        )
    }

    /// RoPE inverse frequencies `θ^(−2i/r)` over the `r` rotary dims, with Llama 3 or linear
    /// scaling applied when configured.
    pub fn inv_freq(&self) -> Vec<f64> {
        let r = self.rotary_dim();
        let d = r as f64;
        let linear = self.rope_linear_factor.unwrap_or(1.0);
        let base: Vec<f64> = (0..r / 2)
            .map(|i| 1.0 / self.rope_theta.powf(2.0 * i as f64 / d) / linear)
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
