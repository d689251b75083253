//! The typed reading of a `config.json` object ([`ConfigKeys`]: a missing key told from a
//! `null` one, two spellings of one setting that must agree) and of its RoPE parameter sets.

use super::Llama3RopeScaling;
use crate::{ModelError, Result};
use serde_json::{Map, Value};

/// A parsed `config.json`, with typed getters that tell a missing key from a `null` one. Every
/// error names the file.
pub struct ConfigKeys<'a> {
    map: &'a Map<String, Value>,
    pub(super) err: &'a dyn Fn(String) -> ModelError,
}

impl<'a> ConfigKeys<'a> {
    pub(super) fn new(map: &'a Map<String, Value>, err: &'a dyn Fn(String) -> ModelError) -> Self {
        Self { map, err }
    }

    /// A configuration error naming the file.
    pub fn error(&self, msg: String) -> ModelError {
        (self.err)(msg)
    }

    /// The raw value of `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.map.get(key)
    }

    /// A non-negative integer; `None` when missing or `null`.
    pub fn usize(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v.as_u64().map(|v| Some(v as usize)).ok_or_else(|| {
                (self.err)(format!("'{key}' must be a non-negative integer, got {v}"))
            }),
        }
    }

    /// A non-negative integer that must be there.
    pub fn need_usize(&self, key: &str) -> Result<usize> {
        self.usize(key)?
            .ok_or_else(|| (self.err)(format!("missing '{key}'")))
    }

    /// A finite number; `None` when missing or `null`.
    pub fn f64(&self, key: &str) -> Result<Option<f64>> {
        opt_f64(self.get(key), key, self.err)
    }

    /// A finite number or `null`: `Ok(None)` missing, `Ok(Some(None))` explicitly `null`.
    pub fn nullable_f64(&self, key: &str) -> Result<Option<Option<f64>>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Null) => Ok(Some(None)),
            v => Ok(Some(opt_f64(v, key, self.err)?)),
        }
    }

    /// `true` or `false`; `None` when missing or `null`.
    pub fn bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err((self.err)(format!(
                "'{key}' must be true or false, got {v}"
            ))),
        }
    }

    /// A string; `None` when missing or not a string.
    pub fn str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Value::as_str)
    }

    /// One setting under two spellings (transformers 5's and the hub's older one): either may
    /// be given, and both only with one value.
    pub fn agree<T: PartialEq + std::fmt::Display>(
        &self,
        (a, x): (&str, Option<T>),
        (b, y): (&str, Option<T>),
    ) -> Result<Option<T>> {
        match (x, y) {
            (Some(x), Some(y)) if x != y => Err((self.err)(format!(
                "'{a}' ({x}) and '{b}' ({y}) are two spellings of one setting and disagree; keep \
                 one of them, or give both the same value"
            ))),
            (x, y) => Ok(x.or(y)),
        }
    }

    /// A count under two spellings ([`ConfigKeys::agree`]).
    pub fn usize_either(&self, a: &str, b: &str) -> Result<Option<usize>> {
        self.agree((a, self.usize(a)?), (b, self.usize(b)?))
    }

    /// Whether `rope_parameters` holds one parameter set per layer type (transformers 5's
    /// spelling for models with sliding layers) rather than one set.
    pub(super) fn rope_per_layer_type(&self) -> bool {
        self.get("rope_parameters")
            .and_then(Value::as_object)
            .is_some_and(|m| m.contains_key("full_attention"))
    }

    /// θ of the RoPE parameter set of `layer_type` (`rope_parameters.<layer_type>`), when
    /// `rope_parameters` has one set per layer type.
    pub fn layer_type_rope_theta(&self, layer_type: &str) -> Result<Option<f64>> {
        if !self.rope_per_layer_type() {
            return Ok(None);
        }
        let set = self.get("rope_parameters").and_then(|p| p.get(layer_type));
        Ok(parse_rope(set, self.err)?.theta)
    }
}

fn opt_f64(
    v: Option<&Value>,
    key: &str,
    err: &dyn Fn(String) -> ModelError,
) -> Result<Option<f64>> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_f64() {
            Some(x) if x.is_finite() => Ok(Some(x)),
            _ => Err(err(format!("'{key}' must be a finite number, got {v}"))),
        },
    }
}

/// Where `rope_parameters` keeps `key`: at its top, or under `full_attention` when it has one
/// set per layer type.
pub(super) fn rope_key(per_type: bool, key: &str) -> &'static str {
    match (per_type, key) {
        (false, "rope_theta") => "rope_parameters.rope_theta",
        (true, "rope_theta") => "rope_parameters.full_attention.rope_theta",
        (false, _) => "rope_parameters.partial_rotary_factor",
        (true, _) => "rope_parameters.full_attention.partial_rotary_factor",
    }
}

/// One RoPE parameter set: θ and a scaling.
#[derive(Default)]
pub(super) struct Rope {
    pub(super) theta: Option<f64>,
    pub(super) llama3: Option<Llama3RopeScaling>,
    pub(super) linear: Option<f64>,
    pub(super) partial_rotary_factor: Option<f64>,
}

pub(super) fn parse_rope(v: Option<&Value>, err: &dyn Fn(String) -> ModelError) -> Result<Rope> {
    let Some(Value::Object(m)) = v else {
        return Ok(Rope::default());
    };
    let f = |k: &str| opt_f64(m.get(k), k, err);
    let kind = m
        .get("rope_type")
        .or_else(|| m.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let mut rope = Rope {
        theta: f("rope_theta")?,
        partial_rotary_factor: f("partial_rotary_factor")?,
        ..Rope::default()
    };
    match kind {
        "default" => {}
        "linear" => {
            let factor = f("factor")?
                .filter(|x| *x > 0.0)
                .ok_or_else(|| err("linear rope scaling needs a positive 'factor'".into()))?;
            rope.linear = Some(factor);
        }
        "llama3" => {
            let need = |name: &str| {
                f(name)?.ok_or_else(|| err(format!("llama3 rope scaling needs '{name}'")))
            };
            rope.llama3 = Some(Llama3RopeScaling {
                factor: need("factor")?,
                low_freq_factor: need("low_freq_factor")?,
                high_freq_factor: need("high_freq_factor")?,
                original_max_position_embeddings: need("original_max_position_embeddings")?,
            });
        }
        "longrope" | "su" => {
            return Err(err(format!(
                "rope_type '{kind}' (Phi-3.5 / Phi-4-mini long-context scaling) is not \
                 supported; supported: default, linear, llama3"
            )));
        }
        other => {
            return Err(err(format!(
                "rope_type '{other}' is not supported (supported: default, linear, llama3)"
            )));
        }
    }
    Ok(rope)
}
