use std::fmt;

/// Errors from rlft-algo. Each message names the offending input and how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum AlgoError {
    /// A setting given as text (a name list, a threshold spec) that cannot be used.
    #[error("invalid {name} = '{value}': {allowed}")]
    InvalidSpec {
        /// The setting's name.
        name: String,
        /// The value given.
        value: String,
        /// What is allowed, in words.
        allowed: String,
    },
    /// Two tensors that must agree in shape do not.
    #[error(
        "shape mismatch: `{name}` has shape {got:?} but {expected}; pass tensors of the same [batch, T] shape"
    )]
    ShapeMismatch {
        /// The argument whose shape is wrong.
        name: &'static str,
        /// What shape was expected, in words.
        expected: String,
        /// The shape that was given.
        got: Vec<usize>,
    },
    /// A name that is not in a registry (loss, estimator, aggregation, ...).
    #[error("unknown {kind} '{name}'; registered: {}", Names(.known))]
    UnknownName {
        /// What kind of thing was looked up.
        kind: &'static str,
        /// The name given.
        name: String,
        /// The names that are known.
        known: Vec<String>,
    },
    /// A numeric setting outside its allowed range.
    #[error("invalid {name} = {value}: {allowed}")]
    InvalidSetting {
        /// The setting's name.
        name: &'static str,
        /// The value given.
        value: f64,
        /// What is allowed, in words.
        allowed: &'static str,
    },
    /// A loss's own setting (`[algorithm.<section>]` of a recipe) that cannot be used.
    #[error("{section}{}{key}: {message}", if .key.is_empty() { "" } else { "." })]
    LossSetting {
        /// The settings' section (`vespo`).
        section: String,
        /// The key inside it (`pos`); empty for the section as a whole.
        key: String,
        /// What is wrong and what is allowed.
        message: String,
    },
    /// A loss was asked for an input it needs but was not given.
    #[error("loss '{loss}' needs `{input}`: {hint}")]
    MissingInput {
        /// The loss or function that needs the input.
        loss: String,
        /// The missing input.
        input: &'static str,
        /// How to provide it.
        hint: &'static str,
    },
    /// Group indices that do not fit the batch.
    #[error(
        "group index has {got} entries but the batch has {batch} rows; give one group id per row"
    )]
    GroupIndex {
        /// Number of group ids given.
        got: usize,
        /// Number of rows in the batch.
        batch: usize,
    },
    /// Reading a tensor back from its device failed.
    #[error("could not read tensor data back from the device: {0}")]
    Readback(String),
}

/// Result alias for rlft-algo.
pub type Result<T, E = AlgoError> = std::result::Result<T, E>;

struct Names<'a>(&'a [String]);

impl fmt::Display for Names<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.join(", "))
    }
}

impl AlgoError {
    pub(crate) fn unknown(kind: &'static str, name: &str, known: &[&str]) -> Self {
        AlgoError::UnknownName {
            kind,
            name: name.to_string(),
            known: known.iter().map(|s| s.to_string()).collect(),
        }
    }
}

/// Implements `Display` (the first name of a variant), `FromStr` (any name, after `normalise`)
/// and `JsonSchema` (a string of the table's names) for a `Copy + PartialEq` enum from a
/// `[(variant, name); N]` table. Unknown names are an
/// [`AlgoError::UnknownName`] listing every accepted name.
macro_rules! impl_names {
    ($ty:ty, $table:expr, $kind:literal, $normalise:expr) => {
        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                let name = $table.iter().find(|(v, _)| v == self).map(|(_, n)| *n);
                f.write_str(name.unwrap_or("?"))
            }
        }

        impl std::str::FromStr for $ty {
            type Err = $crate::AlgoError;
            fn from_str(s: &str) -> $crate::Result<Self> {
                let normalise: fn(&str) -> String = $normalise;
                let key = normalise(s);
                $table
                    .iter()
                    .find(|(_, n)| *n == key)
                    .map(|(v, _)| *v)
                    .ok_or_else(|| {
                        let known: Vec<&str> = $table.iter().map(|(_, n)| *n).collect();
                        $crate::AlgoError::unknown($kind, s, &known)
                    })
            }
        }

        /// A string, one of the table's names (for recipe references and JSON Schema users).
        impl schemars::JsonSchema for $ty {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                stringify!($ty).into()
            }
            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                let mut names: Vec<&str> = Vec::new();
                for (_, n) in $table.iter() {
                    if !names.contains(n) {
                        names.push(n);
                    }
                }
                schemars::json_schema!({ "type": "string", "enum": names })
            }
        }
    };
}
pub(crate) use impl_names;
