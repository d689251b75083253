//! llama.cpp's names for the tensors of a Llama-family model, and its permutation of q/k
//! projection rows (`convert_hf_to_gguf.py`, `LlamaModel.permute`), shared by loading and
//! exporting GGUF files.

/// The GGUF tensor holding llama.cpp's per-frequency RoPE divisors.
pub(crate) const ROPE_FREQS: &str = "rope_freqs.weight";

/// HF tensor name → GGUF tensor name (llama.cpp's naming).
pub(crate) fn gguf_name(hf: &str) -> Option<String> {
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
    let g = GGUF_LAYER_NAMES.iter().find(|(h, _)| *h == module)?.1;
    Some(format!("blk.{layer}.{g}.{suffix}"))
}

/// GGUF tensor name → HF name (the inverse of [`gguf_name`]).
pub(crate) fn hf_name(gguf: &str) -> Option<String> {
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
    let h = GGUF_LAYER_NAMES.iter().find(|(_, g)| *g == module)?.0;
    Some(format!("model.layers.{layer}.{h}.{suffix}"))
}

const GGUF_LAYER_NAMES: [(&str, &str); 11] = [
    ("self_attn.q_proj", "attn_q"),
    ("self_attn.k_proj", "attn_k"),
    ("self_attn.v_proj", "attn_v"),
    ("self_attn.o_proj", "attn_output"),
    ("self_attn.q_norm", "attn_q_norm"),
    ("self_attn.k_norm", "attn_k_norm"),
    ("mlp.gate_proj", "ffn_gate"),
    ("mlp.up_proj", "ffn_up"),
    ("mlp.down_proj", "ffn_down"),
    ("input_layernorm", "attn_norm"),
    ("post_attention_layernorm", "ffn_norm"),
];

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
            let g = gguf_name(hf).unwrap();
            assert_eq!(hf_name(&g).as_deref(), Some(hf), "{g}");
        }
        assert_eq!(
            gguf_name("model.layers.1.self_attn.o_proj.weight").as_deref(),
            Some("blk.1.attn_output.weight")
        );
        assert_eq!(hf_name("rope_freqs.weight"), None);
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
