//! llama.cpp's names for the tensors of every family rlft reads from GGUF (norms named per
//! family, Phi-3's fused projections, experts stacked per projection), and its permutation of
//! q/k projection rows (`convert_hf_to_gguf.py`, `LlamaModel.permute`), shared by loading and
//! exporting GGUF files.

/// The GGUF tensor holding llama.cpp's per-frequency RoPE divisors.
pub(crate) const ROPE_FREQS: &str = "rope_freqs.weight";

/// How a family's layer norms are named in GGUF files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NormNames {
    /// Llama's two norms: `attn_norm` and `ffn_norm` (HF `post_attention_layernorm`).
    Llama,
    /// Gemma's and OLMo 2's norms after the attention and the MLP: `post_attention_norm`,
    /// `ffn_norm` (HF `pre_feedforward_layernorm`) and `post_ffw_norm`.
    PostNorms,
}

/// HF tensor name → GGUF tensor name (llama.cpp's naming). Experts, which GGUF stacks into one
/// tensor per projection, are [`expert_slot`]'s.
pub(crate) fn gguf_name(hf: &str, norms: NormNames) -> Option<String> {
    let fixed = match hf {
        "model.embed_tokens.weight" => Some("token_embd.weight"),
        "model.norm.weight" => Some("output_norm.weight"),
        "lm_head.weight" => Some("output.weight"),
        _ => None,
    };
    if let Some(n) = fixed {
        return Some(n.into());
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let (module, suffix) = rest.rsplit_once('.')?;
    let g = layer_names(norms).find(|(h, _)| *h == module)?.1;
    Some(format!("blk.{layer}.{g}.{suffix}"))
}

/// GGUF tensor name → HF name (the inverse of [`gguf_name`]).
pub(crate) fn hf_name(gguf: &str, norms: NormNames) -> Option<String> {
    let fixed = match gguf {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(n) = fixed {
        return Some(n.into());
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let (module, suffix) = rest.rsplit_once('.')?;
    let h = layer_names(norms).find(|(_, g)| *g == module)?.0;
    Some(format!("model.layers.{layer}.{h}.{suffix}"))
}

/// `(HF module, GGUF module)` of one layer's tensors.
fn layer_names(norms: NormNames) -> impl Iterator<Item = (&'static str, &'static str)> {
    let norm_names: &[(&str, &str)] = match norms {
        NormNames::Llama => &[("post_attention_layernorm", "ffn_norm")],
        NormNames::PostNorms => &[
            ("post_attention_layernorm", "post_attention_norm"),
            ("pre_feedforward_layernorm", "ffn_norm"),
            ("post_feedforward_layernorm", "post_ffw_norm"),
        ],
    };
    GGUF_LAYER_NAMES.iter().chain(norm_names).copied()
}

const GGUF_LAYER_NAMES: [(&str, &str); 14] = [
    ("self_attn.q_proj", "attn_q"),
    ("self_attn.k_proj", "attn_k"),
    ("self_attn.v_proj", "attn_v"),
    ("self_attn.qkv_proj", "attn_qkv"),
    ("self_attn.o_proj", "attn_output"),
    ("self_attn.q_norm", "attn_q_norm"),
    ("self_attn.k_norm", "attn_k_norm"),
    ("mlp.gate_proj", "ffn_gate"),
    ("mlp.up_proj", "ffn_up"),
    // Phi-3's fused gate and up rows, gate first, as in the HF tensor.
    ("mlp.gate_up_proj", "ffn_up"),
    ("mlp.down_proj", "ffn_down"),
    ("mlp.gate", "ffn_gate_inp"),
    ("block_sparse_moe.gate", "ffn_gate_inp"),
    ("input_layernorm", "attn_norm"),
];

/// The expert projections' names: `(Qwen3-MoE's, Mixtral's, GGUF's stacked tensor)`.
const EXPERT_NAMES: [(&str, &str, &str); 3] = [
    ("gate_proj", "w1", "ffn_gate_exps"),
    ("up_proj", "w3", "ffn_up_exps"),
    ("down_proj", "w2", "ffn_down_exps"),
];

/// Where an expert's projection (`model.layers.L.mlp.experts.E.gate_proj.weight`, or Mixtral's
/// `block_sparse_moe.experts.E.w1.weight`) lives in a GGUF file: the stacked tensor
/// (`blk.L.ffn_gate_exps.weight`, `[experts, out, in]`) and the expert's index in it.
pub(crate) fn expert_slot(hf: &str) -> Option<(String, usize)> {
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let rest = rest
        .strip_prefix("mlp.experts.")
        .or_else(|| rest.strip_prefix("block_sparse_moe.experts."))?;
    let (expert, rest) = rest.split_once('.')?;
    let proj = rest.strip_suffix(".weight")?;
    let g = EXPERT_NAMES
        .iter()
        .find(|(q, m, _)| *q == proj || *m == proj)?
        .2;
    Some((format!("blk.{layer}.{g}.weight"), expert.parse().ok()?))
}

/// The HF names of the experts stacked in GGUF tensor `gguf` (the inverse of [`expert_slot`]),
/// in Mixtral's naming or Qwen3-MoE's.
pub(crate) fn expert_names(gguf: &str, experts: usize, mixtral: bool) -> Option<Vec<String>> {
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let module = rest.strip_suffix(".weight")?;
    let (qwen, mix, _) = EXPERT_NAMES.iter().find(|(_, _, g)| *g == module)?;
    Some(
        (0..experts)
            .map(|e| {
                if mixtral {
                    format!("model.layers.{layer}.block_sparse_moe.experts.{e}.{mix}.weight")
                } else {
                    format!("model.layers.{layer}.mlp.experts.{e}.{qwen}.weight")
                }
            })
            .collect(),
    )
}

/// The llama.cpp row of HF row `r` of a q/k projection whose heads have `hd` rows: within each
/// head, llama.cpp interleaves the two rotary halves (HF row `h·hd + k·hd/2 + j` is stored at
/// `h·hd + 2j + k`).
fn llama_cpp_row(r: usize, hd: usize) -> usize {
    let (head, i) = (r / hd, r % hd);
    let (k, j) = (i / (hd / 2), i % (hd / 2));
    head * hd + 2 * j + k
}

/// The rows of `values` (`row_len` long, `heads` heads) moved into llama.cpp's order, or back
/// out of it.
fn reorder_rows(values: &[f32], heads: usize, row_len: usize, to_llama_cpp: bool) -> Vec<f32> {
    let rows = values.len() / row_len;
    let hd = rows / heads;
    let mut out = vec![0.0; values.len()];
    for r in 0..rows {
        let l = llama_cpp_row(r, hd);
        let (src, dst) = if to_llama_cpp { (r, l) } else { (l, r) };
        out[dst * row_len..(dst + 1) * row_len]
            .copy_from_slice(&values[src * row_len..(src + 1) * row_len]);
    }
    out
}

/// llama.cpp's `permute` of q/k projection rows (`convert_hf_to_gguf.py`,
/// `LlamaModel.permute`).
pub(crate) fn permute_rows(values: &[f32], heads: usize, row_len: usize) -> Vec<f32> {
    reorder_rows(values, heads, row_len, true)
}

/// Undoes llama.cpp's `permute` of q/k projection rows ([`permute_rows`]).
pub(crate) fn unpermute_rows(values: &[f32], heads: usize, row_len: usize) -> Vec<f32> {
    reorder_rows(values, heads, row_len, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gguf_names_round_trip() {
        for hf in [
            "model.embed_tokens.weight",
            "lm_head.weight",
            "model.norm.weight",
            "model.layers.3.self_attn.q_proj.weight",
            "model.layers.3.self_attn.q_proj.bias",
            "model.layers.12.self_attn.k_norm.weight",
            "model.layers.0.mlp.down_proj.weight",
            "model.layers.0.post_attention_layernorm.weight",
        ] {
            let g = gguf_name(hf, NormNames::Llama).unwrap();
            assert_eq!(hf_name(&g, NormNames::Llama).as_deref(), Some(hf), "{g}");
        }
        assert_eq!(
            gguf_name("model.layers.1.self_attn.o_proj.weight", NormNames::Llama).as_deref(),
            Some("blk.1.attn_output.weight")
        );
        assert_eq!(hf_name("rope_freqs.weight", NormNames::Llama), None);
    }

    #[test]
    fn post_norm_families_name_their_norms_as_gemma_does() {
        for (hf, g) in [
            ("post_attention_layernorm", "post_attention_norm"),
            ("pre_feedforward_layernorm", "ffn_norm"),
            ("post_feedforward_layernorm", "post_ffw_norm"),
            ("input_layernorm", "attn_norm"),
        ] {
            let hf = format!("model.layers.2.{hf}.weight");
            let got = gguf_name(&hf, NormNames::PostNorms).unwrap();
            assert_eq!(got, format!("blk.2.{g}.weight"));
            assert_eq!(hf_name(&got, NormNames::PostNorms), Some(hf));
        }
        assert_eq!(
            gguf_name(
                "model.layers.0.pre_feedforward_layernorm.weight",
                NormNames::Llama
            ),
            None
        );
    }

    #[test]
    fn experts_map_to_their_stacked_tensor_and_back() {
        let (g, e) = expert_slot("model.layers.3.mlp.experts.5.up_proj.weight").unwrap();
        assert_eq!((g.as_str(), e), ("blk.3.ffn_up_exps.weight", 5));
        let (g, e) = expert_slot("model.layers.1.block_sparse_moe.experts.7.w2.weight").unwrap();
        assert_eq!((g.as_str(), e), ("blk.1.ffn_down_exps.weight", 7));
        let names = expert_names("blk.1.ffn_down_exps.weight", 8, true).unwrap();
        assert_eq!(names.len(), 8);
        assert_eq!(
            names[7],
            "model.layers.1.block_sparse_moe.experts.7.w2.weight"
        );
        let names = expert_names("blk.3.ffn_up_exps.weight", 6, false).unwrap();
        assert_eq!(names[5], "model.layers.3.mlp.experts.5.up_proj.weight");
        assert_eq!(expert_slot("model.layers.3.mlp.gate.weight"), None);
        assert_eq!(expert_names("blk.3.ffn_up.weight", 6, false), None);
    }

    #[test]
    fn permute_is_what_the_loader_undoes() {
        let (heads, cols) = (3, 5);
        let v: Vec<f32> = (0..heads * 8 * cols).map(|i| i as f32).collect();
        let p = permute_rows(&v, heads, cols);
        assert_ne!(p, v);
        assert_eq!(unpermute_rows(&p, heads, cols), v);
    }

    #[test]
    fn unpermute_inverts_llama_cpp_permute() {
        // llama.cpp: w.reshape(heads, 2, hd/2, cols).swapaxes(1, 2).reshape(rows, cols)
        let (heads, hd, cols) = (2, 4, 3);
        let hf: Vec<f32> = (0..heads * hd * cols).map(|i| i as f32).collect();
        let mut permuted = vec![0.0; hf.len()];
        for h in 0..heads {
            for k in 0..2 {
                for j in 0..hd / 2 {
                    let src = h * hd + k * hd / 2 + j;
                    let dst = h * hd + j * 2 + k;
                    permuted[dst * cols..(dst + 1) * cols]
                        .copy_from_slice(&hf[src * cols..(src + 1) * cols]);
                }
            }
        }
        assert_ne!(permuted, hf);
        assert_eq!(permute_rows(&hf, heads, cols), permuted);
        assert_eq!(unpermute_rows(&permuted, heads, cols), hf);
    }
}
