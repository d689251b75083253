//! Recipe keys: `--set` values parsed as TOML, the schema check of every key (naming the nearest
//! valid one), dotted-key views of a recipe and the keys a resumed run may change.

use crate::{Result, TrainError};

/// Keys (or whole sections) a resumed run may change.
pub const RESUMABLE_KEYS: [&str; 10] = [
    "schedule.steps",
    "distributed",
    "eval",
    "checkpoint",
    "logging",
    "rollout.servers",
    "rollout.weights_dir",
    "rollout.server_timeout_s",
    "rollout.server_model",
    "rollout.server_protocol",
];

pub(super) fn resumable(key: &str) -> bool {
    RESUMABLE_KEYS
        .iter()
        .any(|a| key == *a || key.strip_prefix(a).is_some_and(|r| r.starts_with('.')))
}

/// A JSON object's leaves by dotted key (arrays are leaves).
pub(super) fn flatten(
    v: serde_json::Value,
) -> std::collections::BTreeMap<String, serde_json::Value> {
    fn go(
        prefix: &str,
        v: serde_json::Value,
        out: &mut std::collections::BTreeMap<String, serde_json::Value>,
    ) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    let key = if prefix.is_empty() {
                        k
                    } else {
                        format!("{prefix}.{k}")
                    };
                    go(&key, v, out);
                }
            }
            leaf => {
                out.insert(prefix.to_string(), leaf);
            }
        }
    }
    let mut out = std::collections::BTreeMap::new();
    go("", v, &mut out);
    out
}

/// Parses an override value as TOML (numbers, booleans, arrays, inline tables, quoted
/// strings), falling back to the raw string.
pub(super) fn toml_value(raw: &str) -> config::Value {
    let doc = format!("v = {raw}");
    match doc.parse::<toml::Table>() {
        Ok(t) => match t.get("v") {
            Some(v) => toml_to_config(v),
            None => raw.into(),
        },
        Err(_) => raw.into(),
    }
}

fn toml_to_config(v: &toml::Value) -> config::Value {
    match v {
        toml::Value::String(s) => s.clone().into(),
        toml::Value::Integer(i) => (*i).into(),
        toml::Value::Float(f) => (*f).into(),
        toml::Value::Boolean(b) => (*b).into(),
        toml::Value::Array(a) => a.iter().map(toml_to_config).collect::<Vec<_>>().into(),
        // Inline tables: `--set 'reward=[{kind = "exact"}]'`.
        toml::Value::Table(t) => t
            .iter()
            .map(|(k, v)| (k.clone(), toml_to_config(v)))
            .collect::<config::Map<String, config::Value>>()
            .into(),
        other => other.to_string().into(),
    }
}

/// Refuses every non-finite number (`nan`, `inf`) in the merged recipe, naming its key: JSON,
/// which the recipe passes through, has no such numbers, so one would otherwise turn into a
/// missing value (an optional key silently at its default) or a confusing type error.
pub(super) fn check_finite(value: &config::Value, key: &str) -> Result<(), String> {
    match &value.kind {
        config::ValueKind::Float(f) if !f.is_finite() => {
            Err(format!("{key}: must be a finite number, got {f}"))
        }
        config::ValueKind::Table(t) => t.iter().try_for_each(|(k, v)| {
            let full = if key.is_empty() {
                k.clone()
            } else {
                format!("{key}.{k}")
            };
            check_finite(v, &full)
        }),
        config::ValueKind::Array(a) => a
            .iter()
            .enumerate()
            .try_for_each(|(i, v)| check_finite(v, &format!("{key}[{i}]"))),
        _ => Ok(()),
    }
}

/// Checks `value`'s keys against the default recipe's (the schema), recursively, naming the
/// nearest valid key for an unknown one. (`config` lowercases environment keys, which all
/// recipe keys are anyway.)
pub(super) fn lowercase_keys_checked(
    value: serde_json::Value,
    schema: &serde_json::Value,
    path: &str,
) -> Result<serde_json::Value> {
    let (serde_json::Value::Object(map), serde_json::Value::Object(known)) = (&value, schema)
    else {
        return Ok(value);
    };
    let mut out = serde_json::Map::new();
    for (k, v) in map {
        let full = if path.is_empty() {
            k.clone()
        } else {
            format!("{path}.{k}")
        };
        let Some(s) = known.get(k) else {
            let nearest = known
                .keys()
                .map(|c| (strsim::levenshtein(c, k), c))
                .min()
                .map(|(_, c)| {
                    if path.is_empty() {
                        c.clone()
                    } else {
                        format!("{path}.{c}")
                    }
                })
                .unwrap_or_default();
            return Err(TrainError::Recipe(format!(
                "unknown key '{full}'; did you mean '{nearest}'?"
            )));
        };
        out.insert(k.clone(), lowercase_keys_checked(v.clone(), s, &full)?);
    }
    Ok(serde_json::Value::Object(out))
}
