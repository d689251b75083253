//! What Gemma 2 and Gemma 3 share: GeGLU, 256-wide heads, tied embeddings scaled by √hidden,
//! `(1 + w)` norms before and after each sub-layer, scores scaled by
//! `query_pre_attn_scalar^−½`, sliding layers listed in `layer_types` (or following a
//! pattern), and logit soft-caps.
//!
//! In GGUF files (llama.cpp's rules): there is no `query_pre_attn_scalar`, so scores are
//! scaled by 1/√head_dim, or by 1/√(hidden/heads) for the 27B models; the per-layer attention
//! types come from `sliding_window_pattern` (a period, or one flag per layer), and without it
//! follow the family's period.

use super::{HfDefaults, SlidingWindow};
use crate::config::GgufKeys;
use crate::config::{ConfigKeys, MAX_LAYERS};
use crate::{Activation, LayerType, NormPlacement, Result, TransformerConfig};
use serde_json::{Map, Value, json};

/// transformers' defaults for Gemma's shared keys.
pub(super) const DEFAULTS: HfDefaults = HfDefaults {
    activation: Activation::GeluTanh,
    head_dim: Some(256),
    tie_word_embeddings: true,
    sliding_window: SlidingWindow::Default(4096),
    ..HfDefaults::LLAMA
};

/// Reads what both generations share into `cfg`; `pattern` gives the layer types when the
/// config does not list them.
pub(super) fn read_hf(
    keys: &ConfigKeys<'_>,
    cfg: &mut TransformerConfig,
    pattern: impl Fn(&ConfigKeys<'_>, usize) -> Result<Vec<LayerType>>,
) -> Result<()> {
    cfg.norm_placement = NormPlacement::Sandwich;
    cfg.norm_unit_offset = true;
    cfg.embedding_multiplier = (cfg.hidden_size as f64).sqrt();
    let scalar = keys.f64("query_pre_attn_scalar")?.unwrap_or(256.0);
    if scalar <= 0.0 {
        return Err(keys.error(format!("query_pre_attn_scalar {scalar} must be positive")));
    }
    cfg.attention_multiplier = Some(scalar.powf(-0.5));
    cfg.layer_types = match keys.get("layer_types") {
        Some(Value::Array(list)) => {
            let types = list
                .iter()
                .map(|t| match t.as_str() {
                    Some("sliding_attention") => Ok(LayerType::Sliding),
                    Some("full_attention") => Ok(LayerType::Full),
                    _ => Err(keys.error(format!(
                        "layer_types entry {t} is neither \"sliding_attention\" nor \"full_attention\""
                    ))),
                })
                .collect::<Result<Vec<_>>>()?;
            if types.len() != cfg.num_layers {
                return Err(keys.error(format!(
                    "layer_types lists {} layers but num_hidden_layers is {}",
                    types.len(),
                    cfg.num_layers
                )));
            }
            types
        }
        _ if cfg.num_layers > MAX_LAYERS => {
            return Err(keys.error(format!(
                "num_hidden_layers {} is more than rlft builds ({MAX_LAYERS}); the file is \
                 corrupt or not a decoder's config",
                cfg.num_layers
            )));
        }
        _ => pattern(keys, cfg.num_layers)?,
    };
    Ok(())
}

/// A logit soft-cap: `default` when the key is missing, off when it is `null`.
pub(super) fn softcap(
    keys: &ConfigKeys<'_>,
    key: &str,
    default: Option<f64>,
) -> Result<Option<f64>> {
    let v = match keys.nullable_f64(key)? {
        None => default,
        Some(v) => v,
    };
    match v {
        Some(c) if c <= 0.0 => Err(keys.error(format!("{key} {c} must be positive or null"))),
        v => Ok(v),
    }
}

/// Writes what both generations share.
pub(super) fn write_hf(cfg: &TransformerConfig, out: &mut Map<String, Value>) {
    let m = cfg.attention_multiplier.unwrap_or(1.0);
    let scalar = 1.0 / (m * m);
    let scalar = if (scalar - scalar.round()).abs() < 1e-9 * scalar.max(1.0) {
        json!(scalar.round() as u64)
    } else {
        json!(scalar)
    };
    for (key, v) in [
        ("hidden_activation", json!(cfg.activation.hf_name())),
        ("query_pre_attn_scalar", scalar),
        ("attn_logit_softcapping", json!(cfg.attn_logit_softcapping)),
        (
            "final_logit_softcapping",
            json!(cfg.final_logit_softcapping),
        ),
    ] {
        out.insert(key.into(), v);
    }
    if let Some(t) = cfg.rope_local_theta {
        out.insert("rope_local_base_freq".into(), json!(t));
    }
}

/// How a generation's GGUF files differ: the layer count of its 27B model, its period of
/// global layers, and its window when the file has none (`None`: no sliding layers).
pub(super) struct GgufRules {
    pub layers_27b: u64,
    pub period: u64,
    pub window: Option<u64>,
}

/// Writes the `config.json` keys both generations share for a GGUF file.
pub(super) fn gguf_to_hf(
    meta: &GgufKeys<'_>,
    out: &mut Map<String, Value>,
    rules: GgufRules,
) -> Result<()> {
    let (layers, hidden, heads) = (meta.layers()?, meta.hidden()?, meta.heads()?);
    let scalar = if layers == rules.layers_27b {
        hidden / heads
    } else {
        meta.head_dim()?
    };
    out.insert("query_pre_attn_scalar".into(), json!(scalar));
    out.insert(
        "hidden_activation".into(),
        json!(Activation::GeluTanh.hf_name()),
    );
    // Absent caps: each generation's transformers defaults, as in llama.cpp.
    for cap in ["attn_logit_softcapping", "final_logit_softcapping"] {
        if let Some(v) = meta.float(cap)? {
            out.insert(cap.into(), json!(v));
        }
    }
    let window = match meta.int("attention.sliding_window")? {
        None => rules.window,
        Some(_) => meta.sliding_window()?,
    };
    let sliding = match (window, meta.get("attention.sliding_window_pattern")) {
        // No window: every layer global.
        (None, _) => vec![false; layers as usize],
        (Some(_), Some(crate::gguf::GgufValue::Array(flags))) => flags
            .iter()
            .map(|f| {
                f.as_bool().ok_or_else(|| {
                    meta.error(format!(
                        "'{}.attention.sliding_window_pattern' must hold one boolean per layer",
                        meta.arch()
                    ))
                })
            })
            .collect::<Result<Vec<_>>>()?,
        (Some(_), p) => {
            let n = match p {
                None => rules.period,
                Some(v) => v.as_u64().ok_or_else(|| {
                    meta.error(format!(
                        "'{}.attention.sliding_window_pattern' is not an integer",
                        meta.arch()
                    ))
                })?,
            };
            // llama.cpp: a period of 0 makes every layer slide.
            (0..layers).map(|i| n == 0 || i % n < n - 1).collect()
        }
    };
    let types: Vec<&str> = sliding
        .iter()
        .map(|&s| {
            if s {
                LayerType::Sliding.hf_name()
            } else {
                LayerType::Full.hf_name()
            }
        })
        .collect();
    out.insert("sliding_window".into(), json!(window.unwrap_or(4096)));
    out.insert("layer_types".into(), json!(types));
    Ok(())
}
