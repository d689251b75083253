//! Phi-3 and Phi-4-mini: fused q/k/v and gate/up matrices, no biases, an optional sliding
//! window, and (Phi-4-mini) RoPE on part of each head.
//!
//! llama.cpp disables Phi-3's sliding window when it loads a GGUF (with a warning that results
//! may suffer); rlft keeps the file's window, as transformers does.

use super::{Family, HfDefaults, SlidingWindow};
use crate::config::GgufKeys;
use crate::{Result, TransformerConfig, WeightLayout};
use serde_json::{Map, Value, json};

/// Phi-3 (`Phi3ForCausalLM`).
pub struct Phi3;

impl Family for Phi3 {
    fn model_type(&self) -> &'static str {
        "phi3"
    }

    fn hf_class(&self) -> &'static str {
        "Phi3ForCausalLM"
    }

    fn hf_defaults(&self) -> HfDefaults {
        HfDefaults {
            rms_norm_eps: 1e-5,
            attention_bias: None,
            sliding_window: SlidingWindow::Optional,
            ..HfDefaults::LLAMA
        }
    }

    fn write_hf(&self, cfg: &TransformerConfig, out: &mut Map<String, Value>) {
        out.insert(
            "partial_rotary_factor".into(),
            json!(cfg.partial_rotary_factor),
        );
    }

    fn weight_layout(&self) -> WeightLayout {
        WeightLayout::Phi3
    }

    fn gguf_arch(&self) -> Option<&'static str> {
        Some("phi3")
    }

    fn gguf_to_hf(&self, meta: &GgufKeys<'_>, out: &mut Map<String, Value>) -> Result<()> {
        out.insert("sliding_window".into(), json!(meta.sliding_window()?));
        Ok(())
    }

    fn gguf_partial_rotary(&self) -> bool {
        true
    }
}
