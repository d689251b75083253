//! Qwen3-MoE: Qwen3 whose MLPs are sparse mixtures of experts (every `decoder_sparse_step`-th
//! layer, except `mlp_only_layers`), routed without renormalising the top-k probabilities
//! unless `norm_topk_prob`.
//!
//! In GGUF files (llama.cpp's rules): the top-k weights are always renormalised, and a layer
//! without a router tensor is dense (llama.cpp's converter writes none).

use super::{Family, qwen2};
use crate::config::ConfigKeys;
use crate::config::GgufKeys;
use crate::{MoeConfig, Result, TransformerConfig};
use serde_json::{Map, Value, json};

/// Qwen3-MoE (`Qwen3MoeForCausalLM`).
pub struct Qwen3Moe;

impl Family for Qwen3Moe {
    fn model_type(&self) -> &'static str {
        "qwen3_moe"
    }

    fn hf_class(&self) -> &'static str {
        "Qwen3MoeForCausalLM"
    }

    fn read_hf(&self, keys: &ConfigKeys<'_>, cfg: &mut TransformerConfig) -> Result<()> {
        qwen2::refuse_sliding_window(keys)?;
        cfg.qk_norm = true;
        let experts = keys
            .usize_either("num_experts", "num_local_experts")?
            .unwrap_or(128);
        let mlp_only = match keys.get("mlp_only_layers") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(v)) => v
                .iter()
                .map(|x| {
                    x.as_u64().map(|x| x as usize).ok_or_else(|| {
                        keys.error(format!("mlp_only_layers entry {x} is not a layer index"))
                    })
                })
                .collect::<Result<Vec<_>>>()?,
            Some(v) => {
                return Err(keys.error(format!("mlp_only_layers must be a list, got {v}")));
            }
        };
        cfg.moe = Some(MoeConfig {
            num_experts: experts,
            experts_per_token: keys.usize("num_experts_per_tok")?.unwrap_or(8),
            expert_intermediate_size: keys.usize("moe_intermediate_size")?.unwrap_or(768),
            norm_topk_prob: keys.bool("norm_topk_prob")?.unwrap_or(false),
            mlp_only_layers: mlp_only,
            decoder_sparse_step: keys.usize("decoder_sparse_step")?.unwrap_or(1),
        });
        Ok(())
    }

    fn write_hf(&self, cfg: &TransformerConfig, out: &mut Map<String, Value>) {
        let Some(m) = &cfg.moe else { return };
        for (key, v) in [
            ("num_experts_per_tok", json!(m.experts_per_token)),
            ("num_experts", json!(m.num_experts)),
            ("moe_intermediate_size", json!(m.expert_intermediate_size)),
            ("norm_topk_prob", json!(m.norm_topk_prob)),
            ("mlp_only_layers", json!(m.mlp_only_layers)),
            ("decoder_sparse_step", json!(m.decoder_sparse_step)),
        ] {
            out.insert(key.into(), v);
        }
    }

    fn gguf_arch(&self) -> Option<&'static str> {
        Some("qwen3moe")
    }

    fn gguf_to_hf(&self, meta: &GgufKeys<'_>, out: &mut Map<String, Value>) -> Result<()> {
        let dense: Vec<u64> = (0..meta.layers()?)
            .filter(|i| !meta.has_tensor(&format!("blk.{i}.ffn_gate_inp.weight")))
            .collect();
        let expert_ff = match meta.int("expert_feed_forward_length")? {
            Some(v) => v,
            None => meta.expert_rows()?,
        };
        for (key, v) in [
            ("num_local_experts", json!(meta.need("expert_count")?)),
            ("num_experts_per_tok", json!(meta.need("expert_used_count")?)),
            ("mlp_only_layers", json!(dense)),
            ("norm_topk_prob", json!(true)),
            ("moe_intermediate_size", json!(expert_ff)),
        ] {
            out.insert(key.into(), v);
        }
        Ok(())
    }
}
