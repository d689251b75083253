//! The model families rlft reads and writes, one module each. A family says everything that
//! sets it apart from the shared decoder ([`crate::TransformerConfig`]): its `model_type`
//! spellings, the defaults transformers gives the keys its `config.json` may omit, its own keys
//! (read and written), its tensor layout on disk, its GGUF architecture with llama.cpp's rules
//! for what a GGUF file omits, and whether rlft exports it to GGUF.
//!
//! No code outside this folder matches on a family's name: the readers and writers ask the
//! family found by [`by_model_type`] or [`by_gguf`]. Adding a family is one file here and one
//! line in the list at the bottom of this module (docs/adding-a-model-family.md walks through
//! it).

mod gemma;
mod gguf_vocab;

pub(crate) use gguf_vocab::{
    BYTE_LEVEL_BPE, GGUF_PRES, SENTENCEPIECE, gguf_pre_tokenizer, pre_tokenizer_names,
};

use super::{ConfigKeys, GgufKeys};
use crate::gguf::GgufFile;
use crate::{Activation, Result, TransformerConfig, WeightLayout};
use serde_json::{Map, Value};

/// Whether and how a family's `config.json` gives sliding-window attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlidingWindow {
    /// The family has none; a `sliding_window` key is ignored.
    Never,
    /// `sliding_window` turns it on; missing or `null`, every layer attends fully.
    Optional,
    /// Always on, this many tokens when the key is missing.
    Default(usize),
}

/// The values transformers' config class gives the shared keys when a `config.json` omits
/// them. Not always neutral: Gemma's head width, Mixtral's RoPE base.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HfDefaults {
    /// `hidden_act` / `hidden_activation`.
    pub activation: Activation,
    /// `head_dim`; `None`: `hidden_size / num_attention_heads`.
    pub head_dim: Option<usize>,
    /// `rope_theta`.
    pub rope_theta: f64,
    /// `rms_norm_eps`.
    pub rms_norm_eps: f64,
    /// `tie_word_embeddings`.
    pub tie_word_embeddings: bool,
    /// `attention_bias`; `None`: the family has no q/k/v biases and the key is ignored.
    pub attention_bias: Option<bool>,
    /// `sliding_window`.
    pub sliding_window: SlidingWindow,
    /// `intermediate_size`; `None`: required (a family whose experts are its only MLP may go
    /// without).
    pub intermediate_size: Option<usize>,
}

impl HfDefaults {
    /// `LlamaConfig`'s: SiLU, `hidden / heads` wide heads, θ = 10⁴, ε = 10⁻⁶, untied, no
    /// biases, no window.
    pub const LLAMA: Self = Self {
        activation: Activation::Silu,
        head_dim: None,
        rope_theta: 1e4,
        rms_norm_eps: 1e-6,
        tie_word_embeddings: false,
        attention_bias: Some(false),
        sliding_window: SlidingWindow::Never,
        intermediate_size: None,
    };
}

/// How rlft reads a family's GGUF metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgufForm {
    /// Directly into the shared decoder's settings (Llama's layout: the keys llama.cpp's
    /// `llama`, `mistral`, `qwen2` and `qwen3` share).
    Direct,
    /// Turned into the `config.json` transformers would read ([`Family::gguf_to_hf`]) and
    /// read as one, so that the family's `config.json` rules apply.
    ConfigJson,
}

/// How a family is written as a GGUF file llama.cpp loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GgufExport {
    /// llama.cpp's `general.architecture`.
    pub arch: &'static str,
    /// q/k rows are stored in llama.cpp's permuted order (its converter does this for Llama).
    pub permute_qk: bool,
    /// The architecture has per-head q/k norms.
    pub qk_norm: bool,
    /// The architecture reads per-frequency RoPE divisors (`rope_freqs.weight`).
    pub rope_freqs: bool,
}

/// One model family. Every method but the names has the Llama behaviour as its default, so a
/// family states only where it differs.
pub trait Family: Sync {
    /// transformers' `model_type`, written on export.
    fn model_type(&self) -> &'static str;

    /// Further `model_type` spellings read as this family.
    fn aliases(&self) -> &'static [&'static str] {
        &[]
    }

    /// transformers' model class, written as `architectures` in `config.json`.
    fn hf_class(&self) -> &'static str;

    /// The values of shared keys a `config.json` omits.
    fn hf_defaults(&self) -> HfDefaults {
        HfDefaults::LLAMA
    }

    /// Reads the family's own keys into `cfg`, whose shared keys are read already, and sets
    /// what the family fixes (norm placement, q/k norms, ...).
    fn read_hf(&self, _keys: &ConfigKeys<'_>, _cfg: &mut TransformerConfig) -> Result<()> {
        Ok(())
    }

    /// Writes the family's own keys into `config.json` (the shared ones are there already).
    fn write_hf(&self, _cfg: &TransformerConfig, _out: &mut Map<String, Value>) {}

    /// How the family names and fuses its weights on disk.
    fn weight_layout(&self) -> WeightLayout {
        WeightLayout::Llama
    }

    /// llama.cpp's `general.architecture` for this family, when rlft reads its GGUF files.
    fn gguf_arch(&self) -> Option<&'static str> {
        None
    }

    /// Whether a GGUF file of architecture `arch` holds this family (Mixtral is llama.cpp's
    /// `llama` with experts).
    fn reads_gguf(&self, _file: &GgufFile, arch: &str) -> bool {
        self.gguf_arch() == Some(arch)
    }

    /// How a GGUF file of this family is read.
    fn gguf_form(&self) -> GgufForm {
        GgufForm::ConfigJson
    }

    /// Writes into `out` the family's `config.json` keys for a GGUF file, by llama.cpp's rules
    /// where the file omits them (the shared keys are there already).
    fn gguf_to_hf(&self, _meta: &GgufKeys<'_>, _out: &mut Map<String, Value>) -> Result<()> {
        Ok(())
    }

    /// A GGUF file may rotate only part of each head (`rope.dimension_count` < head width).
    fn gguf_partial_rotary(&self) -> bool {
        false
    }

    /// llama.cpp's converter stored this family's q/k rows permuted.
    fn gguf_permuted_qk(&self) -> bool {
        false
    }

    /// How rlft writes this family as GGUF; `None`: it does not.
    fn gguf_export(&self) -> Option<GgufExport> {
        None
    }
}

/// The family of `model_type` (any of its spellings).
pub fn by_model_type(model_type: &str) -> Option<&'static dyn Family> {
    FAMILIES
        .iter()
        .copied()
        .find(|f| f.model_type() == model_type || f.aliases().contains(&model_type))
}

/// The family of a GGUF file whose `general.architecture` is `arch`.
pub fn by_gguf(file: &GgufFile, arch: &str) -> Option<&'static dyn Family> {
    FAMILIES.iter().copied().find(|f| f.reads_gguf(file, arch))
}

/// The family of a `config.json` without `model_type`, and of a configuration whose
/// `model_type` names none: Llama.
pub fn default_family() -> &'static dyn Family {
    &Llama
}

/// Every `model_type` spelling rlft reads, in the registry's order.
pub fn model_types() -> Vec<&'static str> {
    FAMILIES
        .iter()
        .flat_map(|f| std::iter::once(f.model_type()).chain(f.aliases().iter().copied()))
        .collect()
}

/// Every GGUF `general.architecture` rlft reads, once each.
pub fn gguf_architectures() -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for arch in FAMILIES.iter().filter_map(|f| f.gguf_arch()) {
        if !out.contains(&arch) {
            out.push(arch);
        }
    }
    out
}

/// The `model_type`s rlft exports to GGUF.
pub fn gguf_exports() -> Vec<&'static str> {
    FAMILIES
        .iter()
        .filter(|f| f.gguf_export().is_some())
        .map(|f| f.model_type())
        .collect()
}

/// Declares each family's module, re-exports its type, and lists it in [`FAMILIES`].
macro_rules! families {
    ($($module:ident :: $family:ident),* $(,)?) => {
        $(mod $module; pub use $module::$family;)*
        /// Every family, in the order error messages list them.
        pub static FAMILIES: &[&dyn Family] = &[$(&$module::$family),*];
    };
}

families! {
    llama::Llama,
    mistral::Mistral,
    qwen2::Qwen2,
    qwen3::Qwen3,
    gemma2::Gemma2,
    gemma3::Gemma3,
    phi3::Phi3,
    olmo2::Olmo2,
    qwen3_moe::Qwen3Moe,
    mixtral::Mixtral,
    granite::Granite,
}

#[cfg(test)]
mod gguf_tests;
#[cfg(test)]
mod hf_tests;
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spelling_finds_one_family_and_names_are_unique() {
        let names = model_types();
        for (i, n) in names.iter().enumerate() {
            assert!(!names[..i].contains(n), "{n} is listed twice");
            assert!(by_model_type(n).is_some(), "{n}");
        }
        assert!(by_model_type("gpt2").is_none());
        assert_eq!(default_family().model_type(), Llama.model_type());
        for f in FAMILIES {
            let spellings: Vec<_> = FAMILIES
                .iter()
                .filter(|g| g.hf_class() == f.hf_class())
                .collect();
            assert_eq!(spellings.len(), 1, "{} shares its class", f.hf_class());
        }
    }

    /// Every registered family, its missing keys defaulted, writes a `config.json` it reads
    /// back as the same configuration, under its own `model_type`.
    #[test]
    fn every_family_reads_back_what_it_writes() {
        for f in FAMILIES {
            let json = format!(
                r#"{{"model_type":"{}","vocab_size":10,"hidden_size":16,"intermediate_size":24,
                "num_hidden_layers":4,"num_attention_heads":2,"num_key_value_heads":1,
                "head_dim":8}}"#,
                f.model_type()
            );
            let cfg = TransformerConfig::from_hf_json(&json).unwrap();
            assert_eq!(cfg.family().model_type(), f.model_type());
            let written = cfg.to_hf_json();
            assert_eq!(written["architectures"][0], f.hf_class());
            let again = TransformerConfig::from_hf_json(&written.to_string()).unwrap();
            assert_eq!(again, cfg, "{}", f.model_type());
        }
    }
}
