//! Where each weight of the in-memory model lives in a family's checkpoint: the model names
//! its projections as Llama and Qwen3-MoE do (`self_attn.q_proj`, `mlp.gate`,
//! `mlp.experts.E.gate_proj`); Phi-3 fuses q/k/v and gate/up into one matrix each, and Mixtral
//! names its experts `block_sparse_moe.experts.E.w1/w3/w2`.

use crate::TransformerConfig;
use crate::config::WeightLayout;

/// A projection's rows inside a fused tensor on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rows {
    /// First row.
    pub start: usize,
    /// Rows of the whole fused tensor.
    pub total: usize,
}

/// The disk name of the projection `prefix` (a model name without `.weight`), and its rows
/// when the family fuses it with others.
pub(crate) fn on_disk(cfg: &TransformerConfig, prefix: &str) -> (String, Option<Rows>) {
    let Some((layer, rest)) = split_layer(prefix) else {
        return (prefix.into(), None);
    };
    match cfg.weight_layout() {
        WeightLayout::Llama => (prefix.into(), None),
        WeightLayout::Phi3 => {
            let hd = cfg.head_dim;
            let (q, kv) = (cfg.num_heads * hd, cfg.num_kv_heads * hd);
            let i = cfg.intermediate_size;
            let fused = |name: &str, start: usize, total: usize| {
                (format!("{layer}.{name}"), Some(Rows { start, total }))
            };
            match rest {
                "self_attn.q_proj" => fused("self_attn.qkv_proj", 0, q + 2 * kv),
                "self_attn.k_proj" => fused("self_attn.qkv_proj", q, q + 2 * kv),
                "self_attn.v_proj" => fused("self_attn.qkv_proj", q + kv, q + 2 * kv),
                "mlp.gate_proj" => fused("mlp.gate_up_proj", 0, 2 * i),
                "mlp.up_proj" => fused("mlp.gate_up_proj", i, 2 * i),
                _ => (prefix.into(), None),
            }
        }
        WeightLayout::Mixtral => {
            let Some(moe) = rest.strip_prefix("mlp.") else {
                return (prefix.into(), None);
            };
            let moe = moe
                .replace(".gate_proj", ".w1")
                .replace(".up_proj", ".w3")
                .replace(".down_proj", ".w2");
            (format!("{layer}.block_sparse_moe.{moe}"), None)
        }
    }
}

/// `model.layers.N` and the rest of a layer's weight name.
fn split_layer(name: &str) -> Option<(&str, &str)> {
    let rest = name.strip_prefix("model.layers.")?;
    let dot = rest.find('.')?;
    let cut = "model.layers.".len() + dot;
    Some((&name[..cut], &name[cut + 1..]))
}

/// The model's weights under their disk names: projections renamed, fused ones concatenated
/// by rows in their disk order. `tensors` are `(model name, shape, values)` with projections
/// `[out, in]`, in the model's order; the result keeps that order, a fused tensor taking the
/// place of its first part.
pub(crate) fn to_disk(
    cfg: &TransformerConfig,
    tensors: Vec<(String, Vec<usize>, Vec<f32>)>,
) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let mut out: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
    for (name, shape, values) in tensors {
        let prefix = name.strip_suffix(".weight").unwrap_or(&name);
        let (disk, rows) = on_disk(cfg, prefix);
        let disk = match name.strip_prefix(prefix) {
            Some(".weight") => format!("{disk}.weight"),
            _ => name.clone(),
        };
        match rows {
            Some(r) if r.start > 0 => {
                if let Some(fused) = out.iter_mut().find(|(n, _, _)| *n == disk) {
                    fused.1[0] += shape[0];
                    fused.2.extend(values);
                    continue;
                }
                out.push((disk, shape, values));
            }
            _ => out.push((disk, shape, values)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phi3_and_mixtral_names() {
        use crate::families::{Mixtral, Phi3};
        let cfg = TransformerConfig::new(10, 8, 12, 2, 2, 1, 4).with_family(&Phi3);
        let (n, r) = on_disk(&cfg, "model.layers.1.self_attn.k_proj");
        assert_eq!(n, "model.layers.1.self_attn.qkv_proj");
        assert_eq!(
            r,
            Some(Rows {
                start: 8,
                total: 16
            })
        );
        let (n, r) = on_disk(&cfg, "model.layers.0.mlp.up_proj");
        assert_eq!(n, "model.layers.0.mlp.gate_up_proj");
        assert_eq!(
            r,
            Some(Rows {
                start: 12,
                total: 24
            })
        );
        let cfg = cfg.with_family(&Mixtral);
        let (n, _) = on_disk(&cfg, "model.layers.2.mlp.experts.7.up_proj");
        assert_eq!(n, "model.layers.2.block_sparse_moe.experts.7.w3");
        let (n, _) = on_disk(&cfg, "model.layers.2.mlp.gate");
        assert_eq!(n, "model.layers.2.block_sparse_moe.gate");
        assert_eq!(on_disk(&cfg, "lm_head").0, "lm_head");
    }
}
