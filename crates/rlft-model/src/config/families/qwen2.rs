//! Qwen2 (and Qwen2.5): Llama with q/k/v biases, which transformers turns on by default.

use super::{GgufForm, Family, GgufExport, HfDefaults};
use crate::config::ConfigKeys;
use crate::{Result, TransformerConfig};

/// Qwen2 (`Qwen2ForCausalLM`).
pub struct Qwen2;

impl Family for Qwen2 {
    fn model_type(&self) -> &'static str {
        "qwen2"
    }

    fn hf_class(&self) -> &'static str {
        "Qwen2ForCausalLM"
    }

    fn hf_defaults(&self) -> HfDefaults {
        HfDefaults {
            attention_bias: Some(true),
            ..HfDefaults::LLAMA
        }
    }

    fn read_hf(&self, keys: &ConfigKeys<'_>, _cfg: &mut TransformerConfig) -> Result<()> {
        refuse_sliding_window(keys)
    }

    fn gguf_arch(&self) -> Option<&'static str> {
        Some("qwen2")
    }

    fn gguf_form(&self) -> GgufForm {
        GgufForm::Direct
    }

    fn gguf_export(&self) -> Option<GgufExport> {
        Some(GgufExport {
            arch: "qwen2",
            permute_qk: false,
            qk_norm: false,
            rope_freqs: false,
        })
    }
}

/// Qwen's configs carry a `sliding_window` that transformers applies only under
/// `use_sliding_window = true`, which rlft does not support.
pub(super) fn refuse_sliding_window(keys: &ConfigKeys<'_>) -> Result<()> {
    if keys.bool("use_sliding_window")? == Some(true) {
        return Err(keys.error(
            "use_sliding_window = true is not supported for Qwen models; set it to false \
             (Qwen checkpoints ship with it off)"
                .into(),
        ));
    }
    Ok(())
}
