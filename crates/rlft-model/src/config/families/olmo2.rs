//! OLMo 2: norms after each sub-layer only, and one q (k) norm over the whole projection.

use super::{Family, HfDefaults};
use crate::config::ConfigKeys;
use crate::{NormPlacement, Result, TransformerConfig};

/// OLMo 2 (`Olmo2ForCausalLM`).
pub struct Olmo2;

impl Family for Olmo2 {
    fn model_type(&self) -> &'static str {
        "olmo2"
    }

    fn hf_class(&self) -> &'static str {
        "Olmo2ForCausalLM"
    }

    fn hf_defaults(&self) -> HfDefaults {
        HfDefaults {
            rms_norm_eps: 1e-5,
            ..HfDefaults::LLAMA
        }
    }

    fn read_hf(&self, _keys: &ConfigKeys<'_>, cfg: &mut TransformerConfig) -> Result<()> {
        cfg.qk_norm = true;
        cfg.qk_norm_whole = true;
        cfg.norm_placement = NormPlacement::Post;
        Ok(())
    }

    fn gguf_arch(&self) -> Option<&'static str> {
        Some("olmo2")
    }
}
