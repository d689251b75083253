//! Reading a Hugging Face `config.json`, in both transformers 5's spelling
//! (`rope_parameters`, `layer_types`, `num_local_experts`) and the hub's older one (top-level
//! `rope_theta` + `rope_scaling`, `sliding_window_pattern`, `num_experts`). The keys every
//! family shares are read here; a family's own keys, and the values transformers gives the
//! shared ones it omits (not always neutral: Gemma 2's soft-caps, Granite's
//! `attention_multiplier`), come from its module in [`crate::families`].

use super::TransformerConfig;
use super::families::{self, HfDefaults, SlidingWindow};
use super::hf_keys::{ConfigKeys, Rope, parse_rope, rope_key};
use crate::{Activation, ModelError, Result};
use serde_json::Value;
use std::path::Path;

impl TransformerConfig {
    /// Reads `config.json`.
    pub fn from_hf_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io {
            path: path.into(),
            source,
        })?;
        Self::from_hf_json(&text).map_err(|e| match e {
            ModelError::Config { msg, .. } => ModelError::Config {
                path: path.into(),
                msg,
            },
            other => other,
        })
    }

    /// Parses the text of a Hugging Face `config.json` (either spelling, see the module docs).
    pub fn from_hf_json(text: &str) -> Result<Self> {
        let err = |msg: String| ModelError::Config {
            path: "<memory>".into(),
            msg,
        };
        let value: Value = serde_json::from_str(text).map_err(|e| err(e.to_string()))?;
        let Value::Object(map) = value else {
            return Err(err("config.json must hold a JSON object".into()));
        };
        let k = ConfigKeys::new(&map, &err);
        let model_type = k
            .str("model_type")
            .unwrap_or(families::default_family().model_type());
        let family = families::by_model_type(model_type).ok_or_else(|| {
            err(format!(
                "model_type '{model_type}' is not supported; supported: {}",
                families::model_types().join(", ")
            ))
        })?;
        let mut cfg = read_shared(&k, model_type, &family.hf_defaults())?;
        family.read_hf(&k, &mut cfg)?;
        check(&cfg, &k)?;
        Ok(cfg)
    }
}

/// The most decoder layers for which a per-layer setting is built from the count alone (a
/// pattern of sliding layers): far above any released model, and low enough that the list
/// stays small whatever a file claims.
pub(crate) const MAX_LAYERS: usize = 1 << 16;

/// The keys every family shares, missing ones taking the family's `defaults`.
fn read_shared(
    k: &ConfigKeys<'_>,
    model_type: &str,
    defaults: &HfDefaults,
) -> Result<TransformerConfig> {
    let err = |msg: String| k.error(msg);
    let activation = match k.str("hidden_activation").or_else(|| k.str("hidden_act")) {
        None => defaults.activation,
        Some(name) => Activation::from_hf(name).ok_or_else(|| {
            err(format!(
                "hidden_act '{name}' is not supported (supported: silu, gelu_pytorch_tanh)"
            ))
        })?,
    };
    let hidden = k.need_usize("hidden_size")?;
    let heads = k.need_usize("num_attention_heads")?;
    let kv = k.usize("num_key_value_heads")?.unwrap_or(heads);
    if heads == 0 || kv == 0 || !heads.is_multiple_of(kv) {
        return Err(err(format!(
            "num_attention_heads ({heads}) must be a positive multiple of num_key_value_heads ({kv})"
        )));
    }
    let head_dim = match k.usize("head_dim")? {
        Some(d) => d,
        None => defaults.head_dim.unwrap_or(hidden / heads),
    };
    if head_dim == 0 || !head_dim.is_multiple_of(2) {
        return Err(err(format!(
            "head_dim {head_dim} must be even and > 0 for RoPE"
        )));
    }
    let num_layers = k.need_usize("num_hidden_layers")?;
    let rope = read_rope(k)?;
    let sliding_window = match defaults.sliding_window {
        SlidingWindow::Never => None,
        SlidingWindow::Optional => k.usize("sliding_window")?,
        SlidingWindow::Default(w) => Some(k.usize("sliding_window")?.unwrap_or(w)),
    };
    if sliding_window == Some(0) {
        return Err(err("sliding_window must be at least 1".into()));
    }
    let intermediate_size = match defaults.intermediate_size {
        Some(d) => k.usize("intermediate_size")?.unwrap_or(d),
        None => k.need_usize("intermediate_size")?,
    };
    let attention_bias = k.bool("attention_bias")?;
    let vocab = k.need_usize("vocab_size")?;
    Ok(TransformerConfig {
        model_type: model_type.to_string(),
        rms_norm_eps: k.f64("rms_norm_eps")?.unwrap_or(defaults.rms_norm_eps),
        rope_theta: rope.theta.unwrap_or(defaults.rope_theta),
        rope_scaling: rope.llama3,
        rope_linear_factor: rope.linear,
        partial_rotary_factor: rope.partial_rotary_factor.unwrap_or(1.0),
        tie_word_embeddings: k
            .bool("tie_word_embeddings")?
            .unwrap_or(defaults.tie_word_embeddings),
        attention_bias: defaults
            .attention_bias
            .is_some_and(|d| attention_bias.unwrap_or(d)),
        max_position_embeddings: k.usize("max_position_embeddings")?.unwrap_or(4096),
        activation,
        sliding_window,
        ..TransformerConfig::new(
            vocab,
            hidden,
            intermediate_size,
            num_layers,
            heads,
            kv,
            head_dim,
        )
    })
}

/// The global RoPE parameter set: transformers 5's `rope_parameters` (flat, or one set per
/// layer type) or the hub's top-level `rope_theta` + `rope_scaling`, spellings checked to
/// agree. θ is `None` when neither spelling gives one; the partial rotary factor is checked,
/// 1 when not given.
fn read_rope(k: &ConfigKeys<'_>) -> Result<Rope> {
    let err = k.err;
    let params = k.get("rope_parameters");
    let per_type = k.rope_per_layer_type();
    let mut global = if per_type {
        parse_rope(params.and_then(|p| p.get("full_attention")), err)?
    } else {
        let mut r = parse_rope(params, err)?;
        let scaling = parse_rope(k.get("rope_scaling"), err)?;
        let scaled = |r: &Rope| r.llama3.is_some() || r.linear.is_some();
        if scaled(&r)
            && scaled(&scaling)
            && (r.llama3 != scaling.llama3 || r.linear != scaling.linear)
        {
            return Err(err(
                "'rope_parameters' and 'rope_scaling' are two spellings of the RoPE scaling \
                 and disagree; keep one of them, or give both the same scaling"
                    .into(),
            ));
        }
        if !scaled(&r) {
            r.llama3 = scaling.llama3;
            r.linear = scaling.linear;
        }
        r
    };
    global.theta = k.agree(
        ("rope_theta", k.f64("rope_theta")?),
        (rope_key(per_type, "rope_theta"), global.theta),
    )?;
    let partial = k
        .agree(
            ("partial_rotary_factor", k.f64("partial_rotary_factor")?),
            (
                rope_key(per_type, "partial_rotary_factor"),
                global.partial_rotary_factor,
            ),
        )?
        .unwrap_or(1.0);
    if !(partial > 0.0 && partial <= 1.0) {
        return Err(err(format!(
            "partial_rotary_factor {partial} must be in (0, 1]"
        )));
    }
    global.partial_rotary_factor = Some(partial);
    Ok(global)
}

/// What must hold whichever family set it.
fn check(cfg: &TransformerConfig, k: &ConfigKeys<'_>) -> Result<()> {
    let err = |msg: String| k.error(msg);
    if cfg.logits_scaling == 0.0 {
        return Err(err("logits_scaling must not be 0".into()));
    }
    if let Some(m) = &cfg.moe {
        if m.experts_per_token == 0 || m.experts_per_token > m.num_experts {
            return Err(err(format!(
                "num_experts_per_tok ({}) must be between 1 and the number of experts ({})",
                m.experts_per_token, m.num_experts
            )));
        }
        if m.expert_intermediate_size == 0 || m.decoder_sparse_step == 0 {
            return Err(err(
                "moe_intermediate_size and decoder_sparse_step must be at least 1".into(),
            ));
        }
    }
    if cfg.rotary_dim() < 2 {
        return Err(err(format!(
            "partial_rotary_factor {} leaves fewer than 2 of head_dim {} dims rotating",
            cfg.partial_rotary_factor, cfg.head_dim
        )));
    }
    Ok(())
}
