//! Granite: Llama with four multipliers — on the embeddings, the attention scores, each
//! sub-layer's output before the residual add, and (dividing) the logits.
//!
//! In GGUF files (llama.cpp's rules): without `attention.scale` scores are scaled by
//! 1/√head_dim, and without `residual_scale` or `embedding_scale` they are not scaled;
//! `logit_scale` is required. llama.cpp's converter permutes q/k rows as for Llama.

use super::Family;
use crate::config::ConfigKeys;
use crate::config::GgufKeys;
use crate::{Result, TransformerConfig};
use serde_json::{Map, Value, json};

/// Granite (`GraniteForCausalLM`).
pub struct Granite;

impl Family for Granite {
    fn model_type(&self) -> &'static str {
        "granite"
    }

    fn hf_class(&self) -> &'static str {
        "GraniteForCausalLM"
    }

    /// Every multiplier defaults to 1 (transformers' `attention_multiplier` too: scale 1, not
    /// 1/√d).
    fn read_hf(&self, keys: &ConfigKeys<'_>, cfg: &mut TransformerConfig) -> Result<()> {
        let one = |key: &str| -> Result<f64> { Ok(keys.f64(key)?.unwrap_or(1.0)) };
        cfg.attention_multiplier = Some(one("attention_multiplier")?);
        cfg.embedding_multiplier = one("embedding_multiplier")?;
        cfg.residual_multiplier = one("residual_multiplier")?;
        cfg.logits_scaling = one("logits_scaling")?;
        Ok(())
    }

    fn write_hf(&self, cfg: &TransformerConfig, out: &mut Map<String, Value>) {
        for (key, v) in [
            ("embedding_multiplier", cfg.embedding_multiplier),
            ("attention_multiplier", cfg.attention_multiplier.unwrap_or(1.0)),
            ("residual_multiplier", cfg.residual_multiplier),
            ("logits_scaling", cfg.logits_scaling),
        ] {
            out.insert(key.into(), json!(v));
        }
    }

    fn gguf_arch(&self) -> Option<&'static str> {
        Some("granite")
    }

    fn gguf_to_hf(&self, meta: &GgufKeys<'_>, out: &mut Map<String, Value>) -> Result<()> {
        let head_dim = meta.head_dim()? as f64;
        let scale = meta.float("attention.scale")?;
        out.insert(
            "attention_multiplier".into(),
            json!(scale.unwrap_or(head_dim.powf(-0.5))),
        );
        for (key, gguf) in [
            ("embedding_multiplier", "embedding_scale"),
            ("residual_multiplier", "residual_scale"),
        ] {
            out.insert(key.into(), json!(meta.float(gguf)?.unwrap_or(1.0)));
        }
        let logit = meta.float("logit_scale")?.ok_or_else(|| {
            meta.error(format!(
                "'{}.logit_scale' is missing; llama.cpp requires it",
                meta.arch()
            ))
        })?;
        out.insert("logits_scaling".into(), json!(logit));
        Ok(())
    }

    fn gguf_permuted_qk(&self) -> bool {
        true
    }
}
