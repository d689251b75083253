//! A run's stored recipe: reading it back, and what may differ between it and the recipe a
//! resumed run asks for (or a `recipe.toml` someone edited in the run folder).

use super::Recipe;
use super::keys::{RESUMABLE_KEYS, flatten, resumable};
use crate::{Result, TrainError};
use serde_json::Value;

/// A key whose value differs between two recipes: (key, the first's value, the second's).
type Change = (String, Option<Value>, Option<Value>);

impl Recipe {
    /// A recipe stored by a run (a checkpoint's or a run folder's `recipe.toml`), as stored: no
    /// environment variables or overrides applied.
    ///
    /// # Errors
    /// If the text is not a recipe of this version of rlft.
    pub fn from_stored(text: &str) -> Result<Self> {
        let de = toml::Deserializer::parse(text)
            .map_err(|e| TrainError::Recipe(format!("stored recipe: {e}")))?;
        serde_path_to_error::deserialize(de).map_err(|e| {
            TrainError::Recipe(format!(
                "stored recipe: {}: {}; the run was written by another version of rlft",
                e.path(),
                e.inner()
            ))
        })
    }

    /// Checks the recipe asked for at resume (`self`) against the run's stored one: only the
    /// keys in [`RESUMABLE_KEYS`] may differ. `schedule.steps` extends or shortens the run, and
    /// the learning-rate schedule's horizon becomes the new total. `output_dir` is not compared:
    /// the run goes on in the folder `--resume` names.
    ///
    /// # Errors
    /// Naming every other key that differs, with both values.
    pub fn check_resume(&self, stored: &Recipe) -> Result<()> {
        let changed: Vec<String> = self
            .fixed_key_changes(stored)?
            .iter()
            .map(|(k, asked, was)| format!("{k} (stored {}, asked {})", show(was), show(asked)))
            .collect();
        if changed.is_empty() {
            return Ok(());
        }
        Err(TrainError::Recipe(format!(
            "a resumed run cannot change {}; only {} can change at resume. Drop the override (or \
             the recipe file) to resume as the run was, or start a new run in another output_dir",
            changed.join(", "),
            resumable_list()
        )))
    }

    /// The keys whose values differ between `self` and `other`, except those a resumed run may
    /// change ([`RESUMABLE_KEYS`]) and `output_dir` (the folder `--resume` names, however it is
    /// spelled).
    fn fixed_key_changes(&self, other: &Recipe) -> Result<Vec<Change>> {
        let (a, b) = (
            flatten(serde_json::to_value(self)?),
            flatten(serde_json::to_value(other)?),
        );
        let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
        Ok(keys
            .into_iter()
            .filter(|k| a.get(*k) != b.get(*k) && !resumable(k) && *k != "output_dir")
            .map(|k| (k.clone(), a.get(k).cloned(), b.get(k).cloned()))
            .collect())
    }
}

/// A value as an error message shows it.
fn show(v: &Option<Value>) -> String {
    v.as_ref()
        .map_or_else(|| "(unset)".to_string(), Value::to_string)
}

/// The keys a resumed run may change, as the messages list them.
fn resumable_list() -> String {
    RESUMABLE_KEYS
        .iter()
        .map(|k| {
            if k.contains('.') {
                k.to_string()
            } else {
                format!("{k}.*")
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Checks a `recipe.toml` copy in a run folder (`file`, its text `text`) against the recipe the
/// checkpoint was written with (`stored`, from its `state.json`): a copy edited after the run
/// started is refused, naming each changed key with both values, since the run would silently
/// train with the checkpoint's recipe and overwrite the edit.
///
/// # Errors
/// The copy cannot be read as a recipe, or differs in a key a resumed run cannot change.
pub fn check_stored_copy(file: &std::path::Path, text: &str, stored: &Recipe) -> Result<()> {
    let copy = Recipe::from_stored(text).map_err(|e| {
        TrainError::Recipe(format!(
            "{}: {e}; restore the file (the checkpoint's state.json holds the run's recipe)",
            file.display()
        ))
    })?;
    let changes = copy.fixed_key_changes(stored)?;
    if changes.is_empty() {
        return Ok(());
    }
    let list: Vec<String> = changes
        .iter()
        .map(|(k, file_v, ckpt_v)| {
            format!(
                "{k} = {} there, {} in the checkpoint",
                show(file_v),
                show(ckpt_v)
            )
        })
        .collect();
    Err(TrainError::Recipe(format!(
        "{} was edited after the run started: {}. A resumed run trains with the recipe its \
         checkpoint was written with; only {} can change at resume (with --set). Restore the \
         file, or start a new run in another output_dir",
        file.display(),
        list.join("; "),
        resumable_list()
    )))
}
