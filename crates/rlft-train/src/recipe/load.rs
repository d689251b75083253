//! Loading a recipe: the TOML file, then `RLFT__SECTION__KEY` environment variables, then
//! `--set a.b=value` overrides, merged with the `config` crate, checked key by key against the
//! schema and value by value against their ranges.

use super::Recipe;
use super::keys::{check_finite, lowercase_keys_checked, toml_value};
use crate::{Result, TrainError};
use rlft_algo::loss::LossRegistry;
use std::path::Path;

/// Prefix of recipe environment variables (`RLFT__ALGORITHM__KL_COEF=0.01`).
pub const ENV_PREFIX: &str = "RLFT";

impl Recipe {
    /// Loads `path`, applies `RLFT__…` environment variables and then `overrides`
    /// (`a.b=value`, value parsed as TOML, else taken as a string), checks every key and value,
    /// the loss tables (`[algorithm.<section>]`) against the built-in losses' settings.
    /// `algorithm.loss` is resolved later, against the loss registry the run uses
    /// ([`Recipe::validate_with`], which the trainer calls before it writes anything). A recipe
    /// with a table of a loss a downstream trainer registers loads with [`Recipe::load_with`].
    ///
    /// # Errors
    /// A missing file, an unknown key (naming the nearest valid one), a value of the wrong type
    /// or out of range (naming its key).
    pub fn load(path: &Path, overrides: &[String]) -> Result<Self> {
        Self::load_with(path, overrides, &LossRegistry::with_builtins())
    }

    /// As [`Recipe::load`], with the losses of `registry`: the tables of its losses' settings are
    /// recipe keys (checked, with their ranges), and a table no loss of it reads is refused,
    /// listing the registered losses.
    ///
    /// # Errors
    /// As [`Recipe::load`].
    pub fn load_with(path: &Path, overrides: &[String], registry: &LossRegistry) -> Result<Self> {
        if !path.exists() {
            return Err(TrainError::Recipe(format!(
                "{}: no such file",
                path.display()
            )));
        }
        let source = config::File::from(path).format(config::FileFormat::Toml);
        Self::build(source, &path.display().to_string(), overrides, registry)
    }

    /// As [`Recipe::load`], from TOML text (e.g. the recipe stored in a checkpoint).
    pub fn from_toml_str(text: &str, overrides: &[String]) -> Result<Self> {
        Self::from_toml_str_with(text, overrides, &LossRegistry::with_builtins())
    }

    /// As [`Recipe::load_with`], from TOML text.
    pub fn from_toml_str_with(
        text: &str,
        overrides: &[String],
        registry: &LossRegistry,
    ) -> Result<Self> {
        let source = config::File::from_str(text, config::FileFormat::Toml);
        Self::build(source, "<recipe>", overrides, registry)
    }

    /// The default recipe as JSON with the default tables of `registry`'s losses under
    /// `algorithm`: every key a recipe may set.
    fn key_schema(registry: &LossRegistry) -> Result<serde_json::Value> {
        let mut schema = serde_json::to_value(Recipe::default())?;
        if let Some(a) = schema.get_mut("algorithm").and_then(|a| a.as_object_mut()) {
            for s in registry.sections() {
                a.insert(s.name, s.defaults);
            }
        }
        Ok(schema)
    }

    fn build<S: config::Source + Send + Sync + 'static>(
        source: S,
        name: &str,
        overrides: &[String],
        registry: &LossRegistry,
    ) -> Result<Self> {
        let path = Path::new(name);
        let mut builder = config::Config::builder().add_source(source).add_source(
            config::Environment::with_prefix(ENV_PREFIX)
                .prefix_separator("__")
                .separator("__")
                .try_parsing(true),
        );
        for o in overrides {
            let (key, value) = o.split_once('=').ok_or_else(|| {
                TrainError::Recipe(format!(
                    "--set {o:?}: expected KEY=VALUE, e.g. algorithm.kl_coef=0.01"
                ))
            })?;
            // Dotted names only: the `config` crate would grow an array to a `key[N]` index.
            let ok_part = |p: &str| {
                !p.is_empty()
                    && p.chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            };
            if !key.trim().split('.').all(ok_part) {
                return Err(TrainError::Recipe(format!(
                    "--set {o:?}: the key must be a dotted name such as algorithm.kl_coef (set a \
                     list whole: task.ops=[\"+\", \"-\"])"
                )));
            }
            builder = builder
                .set_override(key.trim(), toml_value(value.trim()))
                .map_err(|e| TrainError::Recipe(format!("--set {o:?}: {e}")))?;
        }
        let merged = builder
            .build()
            .map_err(|e| TrainError::Recipe(format!("{}: {e}", path.display())))?;
        check_finite(&merged.cache, "")
            .map_err(|m| TrainError::Recipe(format!("{}: {m}", path.display())))?;
        let value: serde_json::Value = merged
            .try_deserialize()
            .map_err(|e| TrainError::Recipe(format!("{}: {e}", path.display())))?;
        let schema = Self::key_schema(registry)?;
        // A table under [algorithm] that no loss reads: say which losses there are.
        if let (Some(given), Some(known)) = (
            value.get("algorithm").and_then(|a| a.as_object()),
            schema.get("algorithm").and_then(|a| a.as_object()),
        ) && let Some((k, _)) = given
            .iter()
            .find(|(k, v)| v.is_object() && !known.contains_key(k.as_str()))
        {
            return Err(super::losses::unknown_section(k, registry));
        }
        let value = lowercase_keys_checked(value, &schema, "")?;
        // The path of a value that does not fit (an unknown enum name, a wrong type) is named.
        let recipe: Recipe = serde_path_to_error::deserialize(value).map_err(|e| {
            TrainError::Recipe(format!("{}: {}: {}", path.display(), e.path(), e.inner()))
        })?;
        recipe.check_values()?;
        super::losses::check_tables(&recipe.algorithm, registry)?;
        Ok(recipe)
    }

    /// The effective recipe as TOML (what checkpoints store).
    ///
    /// # Errors
    /// If a value cannot be written as TOML (which no validated recipe has).
    pub fn to_toml(&self) -> Result<String> {
        toml::to_string(self)
            .map_err(|e| TrainError::Recipe(format!("the recipe cannot be written as TOML: {e}")))
    }
}
