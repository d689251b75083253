//! GGUF files seen through Hugging Face names: llama.cpp's tensor naming with its q/k row
//! permutation undone, Gemma's norm offset taken back out, experts unstacked, the architecture
//! from the metadata (read by the file's family: directly, or through the `config.json` form of
//! [`meta`]), and the Llama 3 RoPE scaling that llama.cpp's converter stores as per-frequency
//! divisors (`rope_freqs.weight`).

use super::names::on_disk;
use super::{WeightSource, build, check_shape, missing};
use crate::config::GgufKeys;
use crate::config::{NormPlacement, WeightLayout};
use crate::families::{self, GgufForm};
use crate::gguf::names::{
    NormNames, ROPE_FREQS, expert_names, expert_slot, gguf_name, hf_name, unpermute_rows,
};
use crate::gguf::{GgufFile, GgufValue};
use crate::model::Transformer;
use crate::rope::{LLAMA3_ORIGINAL_CONTEXT, divide};
use crate::{Llama3RopeScaling, ModelError, Result, TransformerConfig};
use burn::tensor::{DType, Device};
use std::cell::RefCell;
use std::path::Path;

mod meta;

/// A GGUF file seen through HF names.
struct GgufSource<'a> {
    file: &'a GgufFile,
    cfg: &'a TransformerConfig,
    /// q/k rows are stored in llama.cpp's permuted order.
    permuted: bool,
    /// The stacked expert tensor read last: experts are requested one by one.
    stacked: RefCell<Option<Stacked>>,
}

/// A stacked expert tensor: its GGUF name, shape and values.
type Stacked = (String, Vec<usize>, Vec<f32>);

impl<'a> GgufSource<'a> {
    fn new(file: &'a GgufFile, cfg: &'a TransformerConfig) -> Self {
        GgufSource {
            file,
            cfg,
            permuted: cfg.family().gguf_permuted_qk(),
            stacked: RefCell::new(None),
        }
    }

    /// How the family's layer norms are named.
    fn norms(&self) -> NormNames {
        match self.cfg.norm_placement {
            NormPlacement::Pre => NormNames::Llama,
            NormPlacement::Sandwich | NormPlacement::Post => NormNames::PostNorms,
        }
    }

    /// Experts per sparse layer and whether they take Mixtral's names.
    fn experts(&self) -> Option<(usize, bool)> {
        let mixtral = self.cfg.weight_layout() == WeightLayout::Mixtral;
        self.cfg.moe.as_ref().map(|m| (m.num_experts, mixtral))
    }

    /// Expert `e` of the stacked tensor `gname`, whose experts are `shape`.
    fn expert(&self, gname: &str, e: usize, shape: &[usize]) -> Result<Vec<f32>> {
        let mut cache = self.stacked.borrow_mut();
        if cache.as_ref().is_none_or(|(n, _, _)| n != gname) {
            let (got, values) = self
                .file
                .read_f32(gname)
                .ok_or_else(|| missing(gname, shape, self.root()))?;
            *cache = Some((gname.to_string(), got, values));
        }
        let Some((_, got, values)) = cache.as_ref() else {
            return Err(missing(gname, shape, self.root()));
        };
        let experts = self.experts().map_or(0, |(n, _)| n);
        let mut want = vec![experts];
        want.extend_from_slice(shape);
        check_shape(gname, got, &want)?;
        let n: usize = shape.iter().product();
        Ok(values[e * n..(e + 1) * n].to_vec())
    }
}

impl WeightSource for GgufSource<'_> {
    fn root(&self) -> &Path {
        self.file.path()
    }

    fn names(&self) -> Vec<String> {
        self.file
            .tensors
            .keys()
            .flat_map(|g| {
                if let Some(h) = hf_name(g, self.norms()) {
                    // In the family's own naming (Mixtral's router is `block_sparse_moe.gate`).
                    return match h.strip_suffix(".weight") {
                        Some(prefix) => vec![format!("{}.weight", on_disk(self.cfg, prefix).0)],
                        None => vec![h],
                    };
                }
                match self.experts() {
                    Some((n, mixtral)) => {
                        expert_names(g, n, mixtral).unwrap_or_else(|| vec![g.clone()])
                    }
                    None => vec![g.clone()],
                }
            })
            .collect()
    }

    fn get(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        if self.experts().is_some()
            && let Some((gname, e)) = expert_slot(name)
        {
            return self.expert(&gname, e, shape);
        }
        let gname =
            gguf_name(name, self.norms()).ok_or_else(|| missing(name, shape, self.root()))?;
        let (got, mut values) = self
            .file
            .read_f32(&gname)
            .ok_or_else(|| missing(&gname, shape, self.root()))?;
        check_shape(&gname, &got, shape)?;
        // llama.cpp's converter stores Gemma's `1 + w` norms with the 1 added.
        if self.cfg.norm_unit_offset && name.ends_with("norm.weight") {
            values.iter_mut().for_each(|v| *v -= 1.0);
        }
        let heads = match name {
            n if self.permuted && n.contains("self_attn.q_proj") => Some(self.cfg.num_heads),
            n if self.permuted && n.contains("self_attn.k_proj") => Some(self.cfg.num_kv_heads),
            _ => None,
        };
        Ok(match heads {
            Some(h) => {
                let row_len = if shape.len() == 2 { shape[1] } else { 1 };
                unpermute_rows(&values, h, row_len)
            }
            None => values,
        })
    }
}

impl Transformer {
    /// Loads a GGUF file: the architecture from its metadata, the weights dequantised to `dtype`.
    /// Returns the model and the configuration it was built from.
    pub fn from_gguf(
        file: &GgufFile,
        device: &Device,
        dtype: DType,
    ) -> Result<(Self, TransformerConfig)> {
        let cfg = TransformerConfig::from_gguf(file)?;
        let source = GgufSource::new(file, &cfg);
        let mut model = build(&cfg, &source, device, dtype, &[ROPE_FREQS])?;
        // Llama 3 GGUFs carry the rope scaling as per-frequency divisors: the model uses them
        // as they are; `cfg.rope_scaling` holds the parameters they were computed from.
        if let Some(inv_freq) = gguf_inv_freq(file, &cfg)? {
            model.rope_inv_freq = inv_freq;
        }
        Ok((model, cfg))
    }
}

impl TransformerConfig {
    /// The architecture described by a GGUF file's metadata, read by the family its
    /// `general.architecture` names ([`families::gguf_architectures`]; Mixtral is `llama` with
    /// experts).
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        let err = |msg: String| ModelError::Config {
            path: file.path().into(),
            msg,
        };
        let arch = file
            .require("general.architecture")?
            .as_str()
            .ok_or_else(|| err("general.architecture is not a string".into()))?;
        let family = families::by_gguf(file, arch).ok_or_else(|| {
            err(format!(
                "GGUF architecture '{arch}' is not supported; supported: {}",
                families::gguf_architectures().join(", ")
            ))
        })?;
        let meta = GgufKeys::new(file, arch);
        match family.gguf_form() {
            GgufForm::Direct => gguf_direct(&meta, family.model_type()),
            GgufForm::ConfigJson => meta::gguf_via_config_json(&meta, family),
        }
    }
}

/// The configuration of a GGUF file whose family reads its metadata directly (Llama and the
/// families that share its layout), as `model_type`.
fn gguf_direct(meta: &GgufKeys<'_>, model_type: &str) -> Result<TransformerConfig> {
    let (file, arch) = (meta.file(), meta.arch());
    let err = |msg: String| meta.error(msg);
    let int = |key: &str| -> Result<usize> {
        let k = format!("{arch}.{key}");
        file.require(&k)?
            .as_u64()
            .map(|v| v as usize)
            .ok_or_else(|| err(format!("'{k}' is not a non-negative integer")))
    };
    let opt_int = |key: &str| meta.get(key).and_then(GgufValue::as_u64);
    let opt_f = |key: &str| meta.get(key).and_then(GgufValue::as_f64);
    let d = int("embedding_length")?;
    let heads = int("attention.head_count")?;
    let kv = opt_int("attention.head_count_kv").map_or(heads, |v| v as usize);
    if heads == 0 || kv == 0 || !heads.is_multiple_of(kv) {
        return Err(err(format!(
            "head_count ({heads}) must be a positive multiple of head_count_kv ({kv})"
        )));
    }
    let head_dim = opt_int("attention.key_length").map_or(d / heads, |v| v as usize);
    let embd = file
        .tensors
        .get("token_embd.weight")
        .ok_or_else(|| missing("token_embd.weight", &[0, d], file.path()))?;
    let vocab = opt_int("vocab_size").map_or_else(|| embd.shape()[0], |v| v as usize);
    let mut cfg = TransformerConfig {
        model_type: model_type.into(),
        vocab_size: vocab,
        hidden_size: d,
        intermediate_size: int("feed_forward_length")?,
        num_layers: int("block_count")?,
        num_heads: heads,
        num_kv_heads: kv,
        head_dim,
        rms_norm_eps: opt_f("attention.layer_norm_rms_epsilon").unwrap_or(1e-6),
        rope_theta: opt_f("rope.freq_base").unwrap_or(10000.0),
        rope_scaling: None,
        tie_word_embeddings: !file.tensors.contains_key("output.weight"),
        attention_bias: file.tensors.contains_key("blk.0.attn_q.bias"),
        qk_norm: file.tensors.contains_key("blk.0.attn_q_norm.weight"),
        max_position_embeddings: opt_int("context_length").map_or(4096, |v| v as usize),
        ..TransformerConfig::new(vocab, d, 1, 1, heads, kv, head_dim)
    };
    cfg.rope_scaling = gguf_scaling(file, arch, &cfg)?;
    Ok(cfg)
}

/// The divisors in `file`'s `rope_freqs.weight`, if it has one, checked against `cfg`.
fn gguf_divisors(file: &GgufFile, cfg: &TransformerConfig) -> Result<Option<Vec<f64>>> {
    let Some((shape, values)) = file.read_f32(ROPE_FREQS) else {
        return Ok(None);
    };
    check_shape(ROPE_FREQS, &shape, &[cfg.head_dim / 2])?;
    if let Some((i, v)) = values
        .iter()
        .enumerate()
        .find(|(_, v)| !(v.is_finite() && **v > 0.0))
    {
        return Err(ModelError::Weights {
            path: file.path().into(),
            msg: format!(
                "{ROPE_FREQS}[{i}] is {v}; RoPE divisors must be positive and finite (the file \
                 is corrupt: convert it again)"
            ),
        });
    }
    Ok(Some(values.into_iter().map(f64::from).collect()))
}

/// The Llama 3 scaling behind `file`'s `rope_freqs.weight` (see
/// [`TransformerConfig::llama3_scaling_from_divisors`]). `None` without that tensor, and also
/// when its divisors are of another form: the model still loads with the file's frequencies
/// ([`gguf_inv_freq`]), and exporting it fails ([`crate::rope::check_exportable`]) instead of writing a
/// `config.json` that declares different ones.
pub(crate) fn gguf_scaling(
    file: &GgufFile,
    arch: &str,
    cfg: &TransformerConfig,
) -> Result<Option<Llama3RopeScaling>> {
    let Some(divisors) = gguf_divisors(file, cfg)? else {
        return Ok(None);
    };
    let orig = file
        .get(&format!("{arch}.rope.scaling.original_context_length"))
        .and_then(|v| v.as_f64())
        .filter(|v| v.is_finite() && *v > 0.0)
        .unwrap_or(LLAMA3_ORIGINAL_CONTEXT);
    Ok(cfg
        .llama3_scaling_from_divisors(&divisors, orig)
        .unwrap_or(None))
}

/// The RoPE frequencies llama.cpp uses for `file`: `cfg`'s unscaled ones divided by the
/// file's `rope_freqs.weight`, or `None` without that tensor.
pub(crate) fn gguf_inv_freq(file: &GgufFile, cfg: &TransformerConfig) -> Result<Option<Vec<f64>>> {
    Ok(gguf_divisors(file, cfg)?.map(|d| divide(&cfg.unscaled_inv_freq(), &d)))
}

#[cfg(test)]
mod rope_tests;
