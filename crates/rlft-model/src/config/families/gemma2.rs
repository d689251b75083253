//! Gemma 2: every second layer slides (4096 tokens by default, in GGUF files too), and
//! attention scores and logits are soft-capped (50 and 30 unless the config says otherwise).

use super::gemma::{self, GgufRules};
use super::{Family, HfDefaults};
use crate::config::ConfigKeys;
use crate::config::GgufKeys;
use crate::{LayerType, Result, TransformerConfig};
use serde_json::{Map, Value};

/// Gemma 2 (`Gemma2ForCausalLM`).
pub struct Gemma2;

impl Family for Gemma2 {
    fn model_type(&self) -> &'static str {
        "gemma2"
    }

    fn hf_class(&self) -> &'static str {
        "Gemma2ForCausalLM"
    }

    fn hf_defaults(&self) -> HfDefaults {
        gemma::DEFAULTS
    }

    fn read_hf(&self, keys: &ConfigKeys<'_>, cfg: &mut TransformerConfig) -> Result<()> {
        gemma::read_hf(keys, cfg, |_, layers| {
            Ok((0..layers)
                .map(|i| {
                    if i % 2 == 0 {
                        LayerType::Sliding
                    } else {
                        LayerType::Full
                    }
                })
                .collect())
        })?;
        cfg.attn_logit_softcapping = gemma::softcap(keys, "attn_logit_softcapping", Some(50.0))?;
        cfg.final_logit_softcapping =
            gemma::softcap(keys, "final_logit_softcapping", Some(30.0))?;
        Ok(())
    }

    fn write_hf(&self, cfg: &TransformerConfig, out: &mut Map<String, Value>) {
        gemma::write_hf(cfg, out);
    }

    fn gguf_arch(&self) -> Option<&'static str> {
        Some("gemma2")
    }

    fn gguf_to_hf(&self, meta: &GgufKeys<'_>, out: &mut Map<String, Value>) -> Result<()> {
        let rules = GgufRules {
            layers_27b: 46,
            period: 2,
            window: Some(4096),
        };
        gemma::gguf_to_hf(meta, out, rules)
    }
}
