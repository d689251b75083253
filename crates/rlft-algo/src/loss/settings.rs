//! A loss's own settings: the `[algorithm.<section>]` table of a recipe, declared by the loss as
//! a serde type with its defaults and range checks beside it.
//!
//! A loss with settings is registered with
//! [`LossRegistry::register_with_settings`](crate::loss::LossRegistry::register_with_settings):
//! the registry then knows the settings' section, schema and defaults, checks a recipe's table
//! against them and builds the loss from it. Settings travel as JSON values (what a recipe's TOML is merged into), so the registry
//! stays independent of any file format.

use super::PolicyLoss;
use crate::AlgoError;
use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use std::marker::PhantomData;
use std::sync::Arc;

/// The settings a loss reads from its recipe table `[algorithm.<SECTION>]`.
///
/// Implement it for a `#[derive(Serialize, Deserialize, JsonSchema)]` struct with
/// `#[serde(default, deny_unknown_fields)]` and doc comments on its fields: the doc comments
/// become the recipe reference, [`Default`] gives the defaults, and [`check`](Self::check) the
/// ranges.
pub trait LossSettings:
    Serialize + DeserializeOwned + JsonSchema + Default + Clone + Debug + Send + Sync + 'static
{
    /// The recipe table the settings are read from (`"vespo"` reads `[algorithm.vespo]`).
    const SECTION: &'static str;

    /// Range checks; the error names the field (`pos`, not `algorithm.vespo.pos`: the caller
    /// adds the section).
    ///
    /// # Errors
    /// The first value out of range.
    fn check(&self) -> Result<(), SettingError> {
        Ok(())
    }
}

/// A loss setting that cannot be used: which key (relative to the loss's section) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {message}")]
pub struct SettingError {
    /// The key inside the section (`pos`, `weights`); empty for the section as a whole.
    pub key: String,
    /// What is wrong and what is allowed.
    pub message: String,
}

impl SettingError {
    /// An error for `key`.
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            message: message.into(),
        }
    }

    /// The error as rlft-algo reports it, naming the settings' `section`.
    pub fn in_section(self, section: &str) -> AlgoError {
        AlgoError::LossSetting {
            section: section.to_string(),
            key: self.key,
            message: self.message,
        }
    }

    /// Refuses `value` of `key` unless it is finite and above `min` (or at least `min` with
    /// `inclusive`).
    ///
    /// # Errors
    /// `key: must be finite and > min, got value` (`≥` when inclusive).
    pub fn at_least(key: &str, value: f64, min: f64, inclusive: bool) -> Result<(), Self> {
        let ok = value.is_finite() && if inclusive { value >= min } else { value > min };
        if ok {
            Ok(())
        } else {
            let op = if inclusive { "≥" } else { ">" };
            Err(Self::new(
                key,
                format!("must be finite and {op} {min}, got {value}"),
            ))
        }
    }
}

/// A loss's settings with their type erased: what the registry keeps for a loss registered with
/// [`LossSettings`].
pub(crate) trait Configurable: Send + Sync {
    /// The recipe table.
    fn section(&self) -> &'static str;
    /// The settings' JSON schema (doc comments, types, enumerations).
    fn schema(&self) -> schemars::Schema;
    /// The default settings as JSON.
    fn defaults(&self) -> serde_json::Value;
    /// Reads and range-checks a table.
    fn check(&self, value: &serde_json::Value) -> Result<(), SettingError>;
    /// Reads a table (the defaults when `None`), checks it and builds the loss.
    fn build(&self, value: Option<&serde_json::Value>)
    -> Result<Arc<dyn PolicyLoss>, SettingError>;
}

/// [`Configurable`] for settings `S` and a builder `F`.
pub(crate) struct Builder<S, F> {
    build: F,
    settings: PhantomData<fn() -> S>,
}

impl<S, F> Builder<S, F> {
    pub(crate) fn new(build: F) -> Self {
        Self {
            build,
            settings: PhantomData,
        }
    }
}

/// Reads `value` as `S`, naming the key that does not fit, and range-checks it.
fn read<S: LossSettings>(value: &serde_json::Value) -> Result<S, SettingError> {
    let s: S = serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let key = if path == "." { String::new() } else { path };
        SettingError::new(key, e.inner().to_string())
    })?;
    s.check()?;
    Ok(s)
}

impl<S, L, F> Configurable for Builder<S, F>
where
    S: LossSettings,
    L: PolicyLoss + 'static,
    F: Fn(S) -> Result<L, SettingError> + Send + Sync,
{
    fn section(&self) -> &'static str {
        S::SECTION
    }

    fn schema(&self) -> schemars::Schema {
        schemars::schema_for!(S)
    }

    fn defaults(&self) -> serde_json::Value {
        serde_json::to_value(S::default()).unwrap_or(serde_json::Value::Null)
    }

    fn check(&self, value: &serde_json::Value) -> Result<(), SettingError> {
        read::<S>(value).map(|_| ())
    }

    fn build(
        &self,
        value: Option<&serde_json::Value>,
    ) -> Result<Arc<dyn PolicyLoss>, SettingError> {
        let settings = match value {
            Some(v) => read::<S>(v)?,
            None => S::default(),
        };
        Ok(Arc::new((self.build)(settings)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loss::{Dro, DroSettings};

    #[test]
    fn a_table_is_read_checked_and_named_key_by_key() {
        let b = Builder::new(|s: DroSettings| Ok(Dro { settings: s }));
        assert_eq!(b.section(), "dro");
        assert!(b.check(&serde_json::json!({"beta": 0.5})).is_ok());
        let e = b.check(&serde_json::json!({"beta": -1.0})).unwrap_err();
        assert_eq!(e.key, "beta");
        let e = b.check(&serde_json::json!({"beta": "high"})).unwrap_err();
        assert_eq!(e.key, "beta", "{e}");
        let e = b.check(&serde_json::json!({"betta": 1.0})).unwrap_err();
        assert!(e.message.contains("betta"), "{e}");
        assert_eq!(b.defaults(), serde_json::json!({"beta": 0.1}));
        assert!(b.build(None).is_ok());
    }
}
