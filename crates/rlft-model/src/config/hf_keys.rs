//! The typed reading of a `config.json` object ([`Keys`]: a missing key told from a `null`
//! one, two spellings of one setting that must agree) and of its RoPE parameter sets.

use super::Llama3RopeScaling;
use crate::{ModelError, Result};
use serde_json::{Map, Value};

/// A parsed `config.json`, with typed getters that tell a missing key from a `null` one.
pub(super) struct Keys<'a> {
    pub(super) map: &'a Map<String, Value>,
    pub(super) err: &'a dyn Fn(String) -> ModelError,
}

impl Keys<'_> {
    pub(super) fn get(&self, key: &str) -> Option<&Value> {
        self.map.get(key)
    }

    pub(super) fn usize(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v.as_u64().map(|v| Some(v as usize)).ok_or_else(|| {
                (self.err)(format!("'{key}' must be a non-negative integer, got {v}"))
            }),
        }
    }

    pub(super) fn need_usize(&self, key: &str) -> Result<usize> {
        self.usize(key)?
            .ok_or_else(|| (self.err)(format!("missing '{key}'")))
    }

    pub(super) fn f64(&self, key: &str) -> Result<Option<f64>> {
        opt_f64(self.get(key), key, self.err)
    }

    /// `Ok(None)` missing, `Ok(Some(None))` explicitly `null`.
    pub(super) fn nullable_f64(&self, key: &str) -> Result<Option<Option<f64>>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Null) => Ok(Some(None)),
            v => Ok(Some(opt_f64(v, key, self.err)?)),
        }
    }

    pub(super) fn bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err((self.err)(format!(
                "'{key}' must be true or false, got {v}"
            ))),
        }
    }

    pub(super) fn str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Value::as_str)
    }

    /// One setting under two spellings (transformers 5's and the hub's older one): either may
    /// be given, and both only with one value.
    pub(super) fn agree<T: PartialEq + std::fmt::Display>(
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

    /// A count under two spellings ([`Keys::agree`]).
    pub(super) fn usize_either(&self, a: &str, b: &str) -> Result<Option<usize>> {
        self.agree((a, self.usize(a)?), (b, self.usize(b)?))
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
