//! Export to GGUF, for llama.cpp and Ollama: the families whose
//! [`crate::families::Family::gguf_export`] says how (Llama with q/k rows permuted as
//! llama.cpp's converter does, Qwen2 and Qwen3), with the hyperparameters llama.cpp reads and
//! the tokenizer as a byte-level BPE (`tokenizer.ggml.model = "gpt2"`) vocabulary.

use crate::Pretrained;
use crate::dequant::GgmlType;
use crate::families::{self, GGUF_PRES, GgufExport, gguf_pre_tokenizer};
use crate::gguf::GgufWriter;
use crate::gguf::names::{NormNames, ROPE_FREQS, gguf_name, permute_rows};
use crate::gguf::writer::Q8_0_BLOCK;
use crate::model::Transformer;
use crate::{ModelError, Result, Tokenizer, TransformerConfig};
use serde_json::Value;
use std::fmt;
use std::path::Path;
use std::str::FromStr;

/// How the weights of an exported GGUF are stored (llama.cpp's `general.file_type`). Vectors
/// (norms, biases) stay F32 in every type, as llama.cpp's converter keeps them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GgufFileType {
    /// Every tensor in f32: loads back bit for bit.
    #[default]
    F32,
    /// Matrices in f16.
    F16,
    /// Matrices in 8-bit blocks (Q8_0); a matrix whose rows are not a multiple of 32 long
    /// falls back to f16, as in llama.cpp's converter.
    Q8_0,
}

impl GgufFileType {
    /// llama.cpp's `LLAMA_FTYPE` id.
    fn id(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q8_0 => 7,
        }
    }

    /// The storage of a tensor of `shape`.
    fn storage(self, shape: &[usize]) -> GgmlType {
        match (self, shape) {
            (_, [] | [_]) | (Self::F32, _) => GgmlType::F32,
            (Self::F16, _) => GgmlType::F16,
            (Self::Q8_0, [.., row]) if row.is_multiple_of(Q8_0_BLOCK) => GgmlType::Q8_0,
            (Self::Q8_0, _) => GgmlType::F16,
        }
    }
}

impl FromStr for GgufFileType {
    type Err = ModelError;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Ok(Self::F32),
            "f16" => Ok(Self::F16),
            "q8_0" => Ok(Self::Q8_0),
            _ => Err(ModelError::Input(format!(
                "GGUF type '{s}' is not one rlft writes; choose f32, f16 or q8_0"
            ))),
        }
    }
}

impl fmt::Display for GgufFileType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::Q8_0 => "q8_0",
        })
    }
}

/// How `config` is written as GGUF, or why it cannot be.
fn architecture(config: &TransformerConfig) -> Result<GgufExport> {
    let refuse = |why: String| Err(ModelError::Export(why));
    let model_type = config.model_type.as_str();
    let Some(export) = families::by_model_type(model_type).and_then(|f| f.gguf_export()) else {
        return refuse(format!(
            "model_type '{model_type}' has no GGUF export: rlft writes {}, the families checked \
             against llama.cpp's own converter; export the Hugging Face checkpoint (rlft export \
             SOURCE --hf DIR) and convert it with llama.cpp's convert_hf_to_gguf.py",
            families::gguf_exports().join(", ")
        ));
    };
    let arch = export.arch;
    if config.qk_norm && !export.qk_norm {
        return refuse(format!(
            "llama.cpp's {arch} architecture has no q/k norms, and this model uses them"
        ));
    }
    // Settings of other families, set on one of these (a configuration built in code).
    let base = TransformerConfig::new(1, 1, 1, 1, 1, 1, 2);
    let extra = [
        ("a sliding window", config.sliding_window.is_some()),
        ("experts", config.moe.is_some()),
        (
            "norms placed otherwise",
            config.norm_placement != base.norm_placement,
        ),
        (
            "(1 + w) norms or whole-projection q/k norms",
            config.norm_unit_offset || config.qk_norm_whole,
        ),
        ("GeGLU", config.activation != base.activation),
        (
            "embedding, attention, residual or logit multipliers",
            config.embedding_multiplier != 1.0
                || config.attention_multiplier.is_some()
                || config.residual_multiplier != 1.0
                || config.logits_scaling != 1.0,
        ),
        (
            "soft-caps",
            config.attn_logit_softcapping.is_some() || config.final_logit_softcapping.is_some(),
        ),
        (
            "partial, linear-scaled or per-layer RoPE",
            config.partial_rotary_factor != 1.0
                || config.rope_linear_factor.is_some()
                || config.rope_local_theta.is_some(),
        ),
    ];
    if let Some((what, _)) = extra.iter().find(|(_, on)| *on) {
        return refuse(format!(
            "this {arch} model uses {what}, which llama.cpp's {arch} architecture cannot express"
        ));
    }
    Ok(export)
}

/// `rope_freqs.weight` for a model whose frequencies are scaled, or `None`.
///
/// # Errors
/// For an architecture that reads no per-frequency divisors, when the model's frequencies are
/// not the unscaled ones.
fn rope_divisors(
    model: &Transformer,
    config: &TransformerConfig,
    export: GgufExport,
) -> Result<Option<Vec<f32>>> {
    let unscaled = config.unscaled_inv_freq();
    let (worst, _) = crate::rope::max_rel_diff(&model.rope_inv_freq, &unscaled);
    if worst <= crate::rope::RTOL {
        return Ok(None);
    }
    if !export.rope_freqs {
        return Err(ModelError::Export(format!(
            "the model's RoPE frequencies are scaled, which llama.cpp's {} architecture \
             cannot express in a GGUF",
            export.arch
        )));
    }
    // The converter's divisors when the config declares the model's scaling; otherwise the
    // model's own frequencies as divisors of the unscaled ones.
    if crate::rope::check_exportable(&model.rope_inv_freq, config).is_ok()
        && let Some(d) = config.llama3_divisors()
    {
        return Ok(Some(d));
    }
    Ok(Some(
        unscaled
            .iter()
            .zip(&model.rope_inv_freq)
            .map(|(u, m)| (u / m) as f32)
            .collect(),
    ))
}

/// llama.cpp token types.
const NORMAL: i32 = 1;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const UNUSED: i32 = 5;

/// `v` with every `trim_offsets` removed (it changes offsets, not tokens).
fn without_trim_offsets(mut v: Value) -> Value {
    match &mut v {
        Value::Object(m) => {
            m.remove("trim_offsets");
            for x in m.values_mut() {
                *x = without_trim_offsets(x.take());
            }
        }
        Value::Array(a) => {
            for x in a.iter_mut() {
                *x = without_trim_offsets(x.take());
            }
        }
        _ => {}
    }
    v
}

/// The `tokenizer.ggml.pre` whose pre-tokenizer is `pre` (a serialised `tokenizers`
/// pre-tokenizer), offsets aside.
fn pre_name(pre: &Value) -> Option<&'static str> {
    use tokenizers::pre_tokenizers::PreTokenizerWrapper;
    let pre = without_trim_offsets(pre.clone());
    GGUF_PRES.into_iter().find(|name| {
        gguf_pre_tokenizer(name)
            .and_then(|v| serde_json::from_value::<PreTokenizerWrapper>(v).ok())
            .and_then(|p| serde_json::to_value(p).ok())
            .is_some_and(|v| without_trim_offsets(v) == pre)
    })
}

/// Writes `tok` as llama.cpp's `gpt2` tokenizer metadata, padded to `n_vocab` entries.
fn tokenizer_metadata(w: &mut GgufWriter, tok: &Tokenizer, n_vocab: usize) -> Result<()> {
    let refuse = |why: String| ModelError::Export(format!("the tokenizer: {why}"));
    let inner = tok.inner();
    let json = |v: std::result::Result<Value, serde_json::Error>| {
        v.map_err(|e| ModelError::Export(format!("the tokenizer does not serialise: {e}")))
    };
    let model = json(serde_json::to_value(inner.get_model()))?;
    if model.get("type").and_then(Value::as_str) != Some("BPE") {
        return Err(refuse(
            "GGUF export writes byte-level BPE tokenizers (llama.cpp's 'gpt2'); this one is not BPE"
                .into(),
        ));
    }
    let pre = json(serde_json::to_value(inner.get_pre_tokenizer()))?;
    let Some(pre_name) = pre_name(&pre) else {
        return Err(refuse(format!(
            "its pre-tokenizer {pre} is none of those llama.cpp names and rlft reads back \
             ({GGUF_PRES:?})"
        )));
    };
    match json(serde_json::to_value(inner.get_normalizer()))? {
        Value::Null => {}
        v if v.get("type").and_then(Value::as_str) == Some("NFC") => {}
        v => return Err(refuse(format!("its normalizer {v} has no GGUF equivalent"))),
    }
    let merges: Vec<String> = match model.get("merges").and_then(Value::as_array) {
        None => Vec::new(),
        Some(list) => list
            .iter()
            .map(|m| match m {
                Value::String(s) => Some(s.clone()),
                Value::Array(pair) => match pair.as_slice() {
                    [Value::String(a), Value::String(b)] => Some(format!("{a} {b}")),
                    _ => None,
                },
                _ => None,
            })
            .collect::<Option<Vec<String>>>()
            .ok_or_else(|| refuse("a merge is not a pair of strings".into()))?,
    };
    let vocab = inner.get_vocab(true);
    let largest = vocab.values().max().map_or(0, |&id| id as usize + 1);
    if largest > n_vocab {
        return Err(refuse(format!(
            "it has ids up to {} but the model's embedding has {n_vocab} rows",
            largest - 1
        )));
    }
    let mut tokens: Vec<Option<String>> = vec![None; n_vocab];
    for (t, &id) in &vocab {
        tokens[id as usize] = Some(t.clone());
    }
    let added = inner.get_added_tokens_decoder();
    let types: Vec<i32> = (0..n_vocab)
        .map(|id| match (&tokens[id], added.get(&(id as u32))) {
            (None, _) => UNUSED,
            (Some(_), Some(a)) if a.special => CONTROL,
            (Some(_), Some(_)) => USER_DEFINED,
            (Some(_), None) => NORMAL,
        })
        .collect();
    let tokens: Vec<String> = tokens
        .into_iter()
        .enumerate()
        .map(|(id, t)| t.unwrap_or_else(|| format!("[PAD{id}]")))
        .collect();
    w.string("tokenizer.ggml.model", families::BYTE_LEVEL_BPE);
    w.string("tokenizer.ggml.pre", pre_name);
    w.strings("tokenizer.ggml.tokens", &tokens);
    w.i32s("tokenizer.ggml.token_type", &types);
    w.strings("tokenizer.ggml.merges", &merges);
    if let Some(id) = tok.bos_id {
        w.u32("tokenizer.ggml.bos_token_id", id);
    }
    if let Some(&id) = tok.eos_ids.first() {
        w.u32("tokenizer.ggml.eos_token_id", id);
    }
    if let Some(id) = tok.pad_id {
        w.u32("tokenizer.ggml.padding_token_id", id);
    }
    // Whether encoding with special tokens puts BOS first (llama.cpp adds it itself).
    let adds_bos = tok.bos_id.is_some_and(|bos| {
        inner
            .encode("a", true)
            .is_ok_and(|e| e.get_ids().first() == Some(&bos))
    });
    w.bool("tokenizer.ggml.add_bos_token", adds_bos);
    if let Some(t) = &tok.chat_template {
        w.string("tokenizer.chat_template", t.source());
    }
    Ok(())
}

impl Transformer {
    /// Writes the model (LoRA merged) with `config` and `tokenizer` as a GGUF file llama.cpp
    /// and Ollama load, its matrices stored as `ty`. The file is written under a temporary name
    /// and renamed.
    ///
    /// # Errors
    /// [`ModelError::Export`], before anything is written, for an architecture other than
    /// llama, qwen2 and qwen3, RoPE scaling the architecture cannot express, or a tokenizer
    /// that is not a byte-level BPE llama.cpp can name; I/O errors.
    pub fn save_gguf(
        &self,
        config: &TransformerConfig,
        tokenizer: &Tokenizer,
        path: &Path,
        ty: GgufFileType,
    ) -> Result<()> {
        let export = architecture(config)?;
        let arch = export.arch;
        let divisors = rope_divisors(self, config, export)?;
        let mut w = GgufWriter::new();
        w.string("general.architecture", arch);
        w.u32("general.file_type", ty.id());
        w.u32("general.quantization_version", 2);
        let int = |v: usize| {
            u32::try_from(v).map_err(|_| ModelError::Export(format!("{v} does not fit GGUF's u32")))
        };
        let key = |k: &str| format!("{arch}.{k}");
        for (k, v) in [
            ("vocab_size", config.vocab_size),
            ("context_length", config.max_position_embeddings),
            ("embedding_length", config.hidden_size),
            ("block_count", config.num_layers),
            ("feed_forward_length", config.intermediate_size),
            ("attention.head_count", config.num_heads),
            ("attention.head_count_kv", config.num_kv_heads),
            ("attention.key_length", config.head_dim),
            ("attention.value_length", config.head_dim),
            ("rope.dimension_count", config.head_dim),
        ] {
            w.u32(&key(k), int(v)?);
        }
        w.f32(&key("rope.freq_base"), config.rope_theta as f32);
        w.f32(
            &key("attention.layer_norm_rms_epsilon"),
            config.rms_norm_eps as f32,
        );
        if let (Some(_), Some(s)) = (&divisors, &config.rope_scaling) {
            // A u32 in llama.cpp (which refuses a file with another type).
            let orig = s.original_max_position_embeddings;
            w.u32(
                &key("rope.scaling.original_context_length"),
                int(orig.round().clamp(0.0, f64::from(u32::MAX)) as usize)?,
            );
        }
        tokenizer_metadata(&mut w, tokenizer, config.vocab_size)?;
        for (name, shape, values) in self.hf_tensors() {
            let heads = match name.as_str() {
                n if export.permute_qk && n.contains("self_attn.q_proj") => Some(config.num_heads),
                n if export.permute_qk && n.contains("self_attn.k_proj") => {
                    Some(config.num_kv_heads)
                }
                _ => None,
            };
            let values = match heads {
                Some(h) => permute_rows(&values, h, if shape.len() == 2 { shape[1] } else { 1 }),
                None => values,
            };
            let gname = gguf_name(&name, NormNames::Llama).ok_or_else(|| {
                ModelError::Export(format!("tensor {name} has no llama.cpp name"))
            })?;
            w.tensor(&gname, &shape, ty.storage(&shape), &values);
        }
        if let Some(d) = divisors {
            w.tensor(ROPE_FREQS, &[d.len()], GgmlType::F32, &d);
        }
        crate::write_atomic(path, &w.to_bytes()).map_err(|source| ModelError::Io {
            path: path.into(),
            source,
        })
    }
}

impl Pretrained {
    /// Exports as a GGUF file (see [`Transformer::save_gguf`]).
    pub fn save_gguf(&self, path: &Path, ty: GgufFileType) -> Result<()> {
        self.model
            .save_gguf(&self.config, &self.tokenizer, path, ty)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::families::Family;

    #[test]
    fn types_parse_and_choose_storage() {
        for t in [GgufFileType::F32, GgufFileType::F16, GgufFileType::Q8_0] {
            assert_eq!(t.to_string().parse::<GgufFileType>().unwrap(), t);
        }
        assert_eq!("Q8_0".parse::<GgufFileType>().unwrap(), GgufFileType::Q8_0);
        let e = "q4_k".parse::<GgufFileType>().unwrap_err().to_string();
        assert!(e.contains("f32, f16 or q8_0"), "{e}");
        assert_eq!(GgufFileType::Q8_0.storage(&[64]), GgmlType::F32);
        assert_eq!(GgufFileType::Q8_0.storage(&[8, 64]), GgmlType::Q8_0);
        assert_eq!(GgufFileType::Q8_0.storage(&[8, 48]), GgmlType::F16);
        assert_eq!(GgufFileType::F16.storage(&[8, 48]), GgmlType::F16);
        assert_eq!(GgufFileType::F32.storage(&[8, 48]), GgmlType::F32);
    }

    #[test]
    fn each_pre_tokenizer_is_named_as_the_loader_reads_it() {
        use tokenizers::pre_tokenizers::PreTokenizerWrapper;
        for name in GGUF_PRES {
            // As `tokenizers` serialises it when loaded from a tokenizer.json.
            let wrapper: PreTokenizerWrapper =
                serde_json::from_value(gguf_pre_tokenizer(name).unwrap()).unwrap();
            let v = serde_json::to_value(wrapper).unwrap();
            assert_eq!(pre_name(&v), Some(name));
        }
        assert_eq!(pre_name(&Value::Null), None);
        let whitespace = serde_json::json!({"type": "Whitespace"});
        assert_eq!(pre_name(&whitespace), None);
    }

    #[test]
    fn other_families_are_refused() {
        use crate::families::{Llama, Mistral, Qwen2};
        let cfg = TransformerConfig::new(16, 8, 16, 1, 2, 1, 4).with_family(&Mistral);
        let e = architecture(&cfg).unwrap_err().to_string();
        assert!(e.contains("llama, qwen2, qwen3"), "{e}");
        let cfg = cfg.with_family(&Llama).with_qk_norm(true);
        assert!(architecture(&cfg).is_err());
        let plain = TransformerConfig::new(16, 8, 16, 1, 2, 1, 4).with_family(&Qwen2);
        assert_eq!(architecture(&plain).unwrap(), Qwen2.gguf_export().unwrap());
        let windowed = plain.clone().with_sliding_window(Some(4));
        let e = architecture(&windowed).unwrap_err().to_string();
        assert!(e.contains("sliding window"), "{e}");
        let scaled = plain.with_logits_scaling(2.0);
        assert!(architecture(&scaled).is_err());
    }
}
