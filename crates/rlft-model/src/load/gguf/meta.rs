//! The families read through their `config.json` form: the GGUF metadata every family shares
//! turned into the keys transformers would read, the family's own added by its
//! [`Family::gguf_to_hf`], and the result parsed by [`TransformerConfig::from_hf_json`], so
//! one parser applies every family's rules.
//!
//! A GGUF file does not carry everything a `config.json` does. Where a key is missing, the file
//! means what llama.cpp computes from it; each family's module states those rules. Where the
//! file stores a value, it is used even if llama.cpp ignores it.

use crate::config::GgufKeys;
use crate::families::Family;
use crate::gguf::GgufValue;
use crate::{ModelError, Result, TransformerConfig};
use serde_json::{Map, Value, json};

/// The configuration of a GGUF file read through its `config.json` form (see the module docs).
pub(crate) fn gguf_via_config_json(
    meta: &GgufKeys<'_>,
    family: &dyn Family,
) -> Result<TransformerConfig> {
    let json = config_json(meta, family)?;
    TransformerConfig::from_hf_json(&json.to_string()).map_err(|e| match e {
        ModelError::Config { msg, .. } => meta.error(msg),
        other => other,
    })
}

/// The `config.json` equivalent of the file's metadata for `family`.
fn config_json(meta: &GgufKeys<'_>, family: &dyn Family) -> Result<Value> {
    let model_type = family.model_type();
    let arch = meta.arch();
    let err = |msg: String| meta.error(msg);
    let (hidden, heads, layers) = (meta.hidden()?, meta.heads()?, meta.layers()?);
    let head_dim = meta.head_dim()?;
    let embd = meta
        .file()
        .tensors
        .get("token_embd.weight")
        .ok_or_else(|| err("the file has no token_embd.weight".into()))?;
    let vocab = match meta.int("vocab_size")? {
        Some(v) => v,
        None => embd.shape().first().copied().unwrap_or(0) as u64,
    };
    let mut c = Map::new();
    let mut set = |k: &str, v: Value| {
        c.insert(k.into(), v);
    };
    set("model_type", json!(model_type));
    set("vocab_size", json!(vocab));
    set("hidden_size", json!(hidden));
    set("num_hidden_layers", json!(layers));
    set("num_attention_heads", json!(heads));
    set(
        "num_key_value_heads",
        json!(meta.int("attention.head_count_kv")?.unwrap_or(heads)),
    );
    set("head_dim", json!(head_dim));
    set(
        "tie_word_embeddings",
        json!(!meta.has_tensor("output.weight")),
    );
    set(
        "attention_bias",
        json!(meta.has_tensor("blk.0.attn_q.bias")),
    );
    if let Some(v) = meta.int("context_length")? {
        set("max_position_embeddings", json!(v));
    }
    if let Some(v) = meta.float("attention.layer_norm_rms_epsilon")? {
        set("rms_norm_eps", json!(v));
    }
    // llama.cpp's default base when a file has none.
    set(
        "rope_theta",
        json!(meta.float("rope.freq_base")?.unwrap_or(10_000.0)),
    );
    match meta.get("rope.scaling.type").and_then(GgufValue::as_str) {
        None | Some("none") => {}
        Some("linear") => {
            let factor = meta.float("rope.scaling.factor")?.unwrap_or(1.0);
            set(
                "rope_scaling",
                json!({"rope_type": "linear", "factor": factor}),
            );
        }
        Some(other) => {
            return Err(err(format!(
                "'{arch}.rope.scaling.type' = '{other}' is not supported for {model_type} \
                 (supported: none, linear)"
            )));
        }
    }
    if meta.has_tensor("rope_factors_long.weight") {
        return Err(err(format!(
            "the file carries LongRoPE factors (rope_factors_long.weight); {model_type} with \
             longrope scaling is not supported: use a model without it (the 4k-context \
             Phi-3 variants)"
        )));
    }
    let rotary = meta.int("rope.dimension_count")?.unwrap_or(head_dim);
    if rotary != head_dim {
        if !family.gguf_partial_rotary() || head_dim == 0 {
            return Err(err(format!(
                "'{arch}.rope.dimension_count' is {rotary} but heads are {head_dim} wide; \
                 partial rotary is supported for {} only",
                partial_rotary_families()
            )));
        }
        set(
            "partial_rotary_factor",
            json!(rotary as f64 / head_dim as f64),
        );
    }
    if let Some(ff) = meta.int("feed_forward_length")? {
        set("intermediate_size", json!(ff));
    }
    family.gguf_to_hf(meta, &mut c)?;
    Ok(Value::Object(c))
}

/// The families whose GGUF files may rotate part of each head, for error messages.
fn partial_rotary_families() -> String {
    crate::families::FAMILIES
        .iter()
        .filter(|f| f.gguf_partial_rotary())
        .map(|f| f.model_type())
        .collect::<Vec<_>>()
        .join(", ")
}
