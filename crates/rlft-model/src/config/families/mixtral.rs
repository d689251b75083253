//! Mixtral: Llama whose every MLP is a mixture of experts named
//! `block_sparse_moe.experts.E.{w1,w3,w2}`, with an optional sliding window. In GGUF files it
//! is llama.cpp's `llama` with experts, q/k rows permuted as for Llama.

use super::{Family, HfDefaults, SlidingWindow};
use crate::config::ConfigKeys;
use crate::gguf::{GgufFile, GgufValue};
use crate::config::GgufKeys;
use crate::{MoeConfig, Result, TransformerConfig, WeightLayout};
use serde_json::{Map, Value, json};

/// Mixtral (`MixtralForCausalLM`).
pub struct Mixtral;

/// Whether a GGUF file of architecture `arch` has experts.
pub(super) fn has_experts(file: &GgufFile, arch: &str) -> bool {
    file.get(&format!("{arch}.expert_count"))
        .and_then(GgufValue::as_u64)
        .unwrap_or(0)
        > 0
}

impl Family for Mixtral {
    fn model_type(&self) -> &'static str {
        "mixtral"
    }

    fn hf_class(&self) -> &'static str {
        "MixtralForCausalLM"
    }

    /// `intermediate_size` is the experts' width: there is no dense MLP to size.
    fn hf_defaults(&self) -> HfDefaults {
        HfDefaults {
            rope_theta: 1e6,
            rms_norm_eps: 1e-5,
            attention_bias: None,
            sliding_window: SlidingWindow::Optional,
            intermediate_size: Some(0),
            ..HfDefaults::LLAMA
        }
    }

    fn read_hf(&self, keys: &ConfigKeys<'_>, cfg: &mut TransformerConfig) -> Result<()> {
        cfg.moe = Some(MoeConfig {
            num_experts: keys
                .usize_either("num_local_experts", "num_experts")?
                .unwrap_or(8),
            experts_per_token: keys.usize("num_experts_per_tok")?.unwrap_or(2),
            expert_intermediate_size: keys.need_usize("intermediate_size")?,
            norm_topk_prob: true,
            mlp_only_layers: Vec::new(),
            decoder_sparse_step: 1,
        });
        Ok(())
    }

    fn write_hf(&self, cfg: &TransformerConfig, out: &mut Map<String, Value>) {
        let Some(m) = &cfg.moe else { return };
        out.insert("num_experts_per_tok".into(), json!(m.experts_per_token));
        out.insert("num_local_experts".into(), json!(m.num_experts));
        out.insert("intermediate_size".into(), json!(m.expert_intermediate_size));
    }

    fn weight_layout(&self) -> WeightLayout {
        WeightLayout::Mixtral
    }

    fn gguf_arch(&self) -> Option<&'static str> {
        Some("llama")
    }

    fn reads_gguf(&self, file: &GgufFile, arch: &str) -> bool {
        self.gguf_arch() == Some(arch) && has_experts(file, arch)
    }

    fn gguf_to_hf(&self, meta: &GgufKeys<'_>, out: &mut Map<String, Value>) -> Result<()> {
        out.insert("num_local_experts".into(), json!(meta.need("expert_count")?));
        out.insert(
            "num_experts_per_tok".into(),
            json!(meta.need("expert_used_count")?),
        );
        out.insert("sliding_window".into(), json!(meta.sliding_window()?));
        Ok(())
    }

    fn gguf_permuted_qk(&self) -> bool {
        true
    }
}
