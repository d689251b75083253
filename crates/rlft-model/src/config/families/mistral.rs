//! Mistral: Llama with an optional sliding window.

use super::{GgufForm, Family, HfDefaults, SlidingWindow};

/// Mistral (`MistralForCausalLM`).
pub struct Mistral;

impl Family for Mistral {
    fn model_type(&self) -> &'static str {
        "mistral"
    }

    fn hf_class(&self) -> &'static str {
        "MistralForCausalLM"
    }

    fn hf_defaults(&self) -> HfDefaults {
        HfDefaults {
            sliding_window: SlidingWindow::Optional,
            ..HfDefaults::LLAMA
        }
    }

    fn gguf_arch(&self) -> Option<&'static str> {
        Some("mistral")
    }

    fn gguf_form(&self) -> GgufForm {
        GgufForm::Direct
    }
}
