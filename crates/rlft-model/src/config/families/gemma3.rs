//! Gemma 3 (text): five sliding layers to one global (`sliding_window_pattern`), q/k norms,
//! RoPE θ = 10⁶ on global layers and its own unscaled base on sliding ones
//! (`rope_local_base_freq`), and only the final logits soft-capped (transformers never applies
//! `attn_logit_softcapping`). A GGUF file slides only when it has a window.

use super::gemma::{self, GgufRules};
use super::{Family, HfDefaults};
use crate::config::ConfigKeys;
use crate::config::GgufKeys;
use crate::{LayerType, Result, TransformerConfig};
use serde_json::{Map, Value, json};

/// Gemma 3 (`Gemma3ForCausalLM`, `model_type` `gemma3_text`).
pub struct Gemma3;

impl Family for Gemma3 {
    fn model_type(&self) -> &'static str {
        "gemma3_text"
    }

    fn hf_class(&self) -> &'static str {
        "Gemma3ForCausalLM"
    }

    fn hf_defaults(&self) -> HfDefaults {
        HfDefaults {
            rope_theta: 1e6,
            ..gemma::DEFAULTS
        }
    }

    fn read_hf(&self, keys: &ConfigKeys<'_>, cfg: &mut TransformerConfig) -> Result<()> {
        gemma::read_hf(keys, cfg, |keys, layers| {
            let pattern = keys
                .usize_either("sliding_window_pattern", "_sliding_window_pattern")?
                .unwrap_or(6);
            if pattern == 0 {
                return Err(keys.error("sliding_window_pattern must be at least 1".into()));
            }
            Ok((0..layers)
                .map(|i| {
                    if (i + 1) % pattern != 0 {
                        LayerType::Sliding
                    } else {
                        LayerType::Full
                    }
                })
                .collect())
        })?;
        cfg.qk_norm = true;
        cfg.final_logit_softcapping = gemma::softcap(keys, "final_logit_softcapping", None)?;
        let local = keys.agree(
            (
                "rope_parameters.sliding_attention.rope_theta",
                keys.layer_type_rope_theta(LayerType::Sliding.hf_name())?,
            ),
            ("rope_local_base_freq", keys.f64("rope_local_base_freq")?),
        )?;
        cfg.rope_local_theta = Some(local.unwrap_or(1e4));
        Ok(())
    }

    /// The hub's spelling only: a flat `rope_parameters` would give sliding layers the global
    /// base.
    fn write_hf(&self, cfg: &TransformerConfig, out: &mut Map<String, Value>) {
        out.remove("rope_parameters");
        gemma::write_hf(cfg, out);
    }

    fn gguf_arch(&self) -> Option<&'static str> {
        Some("gemma3")
    }

    fn gguf_to_hf(&self, meta: &GgufKeys<'_>, out: &mut Map<String, Value>) -> Result<()> {
        out.insert(
            "rope_local_base_freq".into(),
            json!(meta.float("rope.freq_base_swa")?.unwrap_or(10_000.0)),
        );
        let rules = GgufRules {
            layers_27b: 62,
            period: 6,
            window: None,
        };
        gemma::gguf_to_hf(meta, out, rules)
    }
}
