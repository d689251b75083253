//! Qwen3: Llama with an RMSNorm on each head's q and k before RoPE.

use super::{GgufForm, Family, GgufExport, qwen2};
use crate::config::ConfigKeys;
use crate::{Result, TransformerConfig};

/// Qwen3 (`Qwen3ForCausalLM`).
pub struct Qwen3;

impl Family for Qwen3 {
    fn model_type(&self) -> &'static str {
        "qwen3"
    }

    fn hf_class(&self) -> &'static str {
        "Qwen3ForCausalLM"
    }

    fn read_hf(&self, keys: &ConfigKeys<'_>, cfg: &mut TransformerConfig) -> Result<()> {
        qwen2::refuse_sliding_window(keys)?;
        cfg.qk_norm = true;
        Ok(())
    }

    fn gguf_arch(&self) -> Option<&'static str> {
        Some("qwen3")
    }

    fn gguf_form(&self) -> GgufForm {
        GgufForm::Direct
    }

    fn gguf_export(&self) -> Option<GgufExport> {
        Some(GgufExport {
            arch: "qwen3",
            permute_qk: false,
            qk_norm: true,
            rope_freqs: false,
        })
    }
}
