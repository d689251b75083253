//! Llama 1/2/3, and the checkpoints that name the same architecture otherwise (SmolLM's
//! `model_type`s): the family every other one departs from, read from GGUF metadata directly.

use super::{GgufForm, Family, GgufExport, mixtral};
use crate::gguf::GgufFile;

/// Llama (`LlamaForCausalLM`).
pub struct Llama;

impl Family for Llama {
    fn model_type(&self) -> &'static str {
        "llama"
    }

    fn aliases(&self) -> &'static [&'static str] {
        &["smollm", "smollm2", "smollm3"]
    }

    fn hf_class(&self) -> &'static str {
        "LlamaForCausalLM"
    }

    fn gguf_arch(&self) -> Option<&'static str> {
        Some("llama")
    }

    /// llama.cpp's `llama` without experts (with them it is Mixtral).
    fn reads_gguf(&self, file: &GgufFile, arch: &str) -> bool {
        self.gguf_arch() == Some(arch) && !mixtral::has_experts(file, arch)
    }

    fn gguf_form(&self) -> GgufForm {
        GgufForm::Direct
    }

    fn gguf_permuted_qk(&self) -> bool {
        true
    }

    fn gguf_export(&self) -> Option<GgufExport> {
        Some(GgufExport {
            arch: "llama",
            permute_qk: true,
            qk_norm: false,
            rope_freqs: true,
        })
    }
}
