//! The parts of an architecture that differ between the supported families: where the norms
//! sit, the MLP's activation, sliding-window layers, mixture-of-experts blocks, and how each
//! family names its weights on disk.

use burn::config::Config;
use serde::{Deserialize, Serialize};

/// Where a decoder layer's RMSNorms sit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum NormPlacement {
    /// Before each sub-layer (Llama, Qwen, Phi-3, Mixtral, Granite):
    /// `h = x + attn(norm₁(x))`, `out = h + mlp(norm₂(h))`.
    Pre,
    /// Before and after each sub-layer (Gemma 2/3), four norms per layer:
    /// `h = x + norm₂(attn(norm₁(x)))`, `out = h + norm₄(mlp(norm₃(h)))`.
    Sandwich,
    /// After each sub-layer only (OLMo 2): `h = x + norm₁(attn(x))`, `out = h + norm₂(mlp(h))`.
    Post,
}

/// The gated MLP's activation: `down(act(gate(x)) · up(x))`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Activation {
    /// SiLU (SwiGLU).
    Silu,
    /// GELU, tanh approximation (`gelu_pytorch_tanh`: GeGLU in Gemma).
    GeluTanh,
}

impl Activation {
    /// The activation named by a config's `hidden_act` / `hidden_activation`.
    pub fn from_hf(name: &str) -> Option<Self> {
        match name {
            "silu" | "swish" => Some(Self::Silu),
            "gelu_pytorch_tanh" | "gelu_tanh" | "gelu_new" => Some(Self::GeluTanh),
            _ => None,
        }
    }

    /// transformers' name.
    pub fn hf_name(self) -> &'static str {
        match self {
            Self::Silu => "silu",
            Self::GeluTanh => "gelu_pytorch_tanh",
        }
    }
}

/// Which keys a layer's attention sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LayerType {
    /// Every earlier key (causal).
    Full,
    /// The last `sliding_window` positions of the token's own sequence, itself included.
    Sliding,
}

impl LayerType {
    /// transformers' `layer_types` spelling.
    pub fn hf_name(self) -> &'static str {
        match self {
            Self::Full => "full_attention",
            Self::Sliding => "sliding_attention",
        }
    }
}

/// How a family lays its weights out on disk (names and fusions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightLayout {
    /// `self_attn.{q,k,v,o}_proj`, `mlp.{gate,up,down}_proj`; Qwen3-MoE's experts as
    /// `mlp.gate` + `mlp.experts.E.{gate,up,down}_proj`.
    Llama,
    /// Phi-3: fused `self_attn.qkv_proj` (rows q, k, v) and `mlp.gate_up_proj` (rows gate, up).
    Phi3,
    /// Mixtral: `block_sparse_moe.gate` + `block_sparse_moe.experts.E.{w1,w3,w2}` (gate, up,
    /// down).
    Mixtral,
}

/// A sparse mixture-of-experts feed-forward block: a router picks `experts_per_token` of
/// `num_experts` SwiGLU experts per token.
#[derive(Config, Debug, PartialEq)]
pub struct MoeConfig {
    /// Experts per sparse layer.
    pub num_experts: usize,
    /// Experts each token is routed to (top-k).
    pub experts_per_token: usize,
    /// Inner width of one expert.
    pub expert_intermediate_size: usize,
    /// Renormalise the k chosen router probabilities to sum to 1.
    #[config(default = true)]
    pub norm_topk_prob: bool,
    /// Layers that keep a dense MLP (Qwen3-MoE's `mlp_only_layers`).
    #[config(default = "Vec::new()")]
    pub mlp_only_layers: Vec<usize>,
    /// Every `decoder_sparse_step`-th layer is sparse (Qwen3-MoE): layer `i` is iff
    /// `(i + 1) % step == 0`.
    #[config(default = 1)]
    pub decoder_sparse_step: usize,
}

impl MoeConfig {
    /// Whether layer `i` has experts (transformers' Qwen3-MoE rule; Mixtral: every layer).
    pub fn is_sparse(&self, layer: usize) -> bool {
        self.num_experts > 0
            && !self.mlp_only_layers.contains(&layer)
            && self.decoder_sparse_step > 0
            && (layer + 1).is_multiple_of(self.decoder_sparse_step)
    }
}
