//! The loss tables of a recipe, `[algorithm.<section>]`: each is read and range-checked by the
//! settings type its loss declared in the [`LossRegistry`], so a loss registered by a downstream
//! trainer has recipe settings of its own like a built-in one.

use super::AlgorithmSection;
use crate::{Result, TrainError};
use rlft_algo::AlgoError;
use rlft_algo::loss::{LossRegistry, PolicyLoss};
use std::sync::Arc;

/// `algorithm.<e>` for a loss setting, `algorithm.loss: <e>` otherwise.
fn recipe_error(e: AlgoError) -> TrainError {
    match e {
        AlgoError::LossSetting { .. } => TrainError::Recipe(format!("algorithm.{e}")),
        other => TrainError::Recipe(format!("algorithm.loss: {other}")),
    }
}

/// The registered losses, for messages: `name ([algorithm.section])` where it has settings.
pub(crate) fn registered_losses(registry: &LossRegistry) -> String {
    registry
        .names()
        .iter()
        .map(|n| match registry.section_of(n) {
            Ok(Some(s)) => format!("{n} ([algorithm.{s}])"),
            _ => n.clone(),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The error for a table no loss in `registry` reads.
pub(crate) fn unknown_section(section: &str, registry: &LossRegistry) -> TrainError {
    TrainError::Recipe(format!(
        "algorithm.{section}: no loss registered in this binary reads [algorithm.{section}]; the \
         registered losses are {}. A loss a downstream trainer registers is known to that \
         trainer's binary, which loads the recipe with Recipe::load_with and its registry",
        registered_losses(registry)
    ))
}

/// Reads and range-checks every loss table, whichever loss the run names.
///
/// # Errors
/// A table that is not a table, that no registered loss reads, or whose key does not read or is
/// out of range (naming the dotted key).
pub(crate) fn check_tables(a: &AlgorithmSection, registry: &LossRegistry) -> Result<()> {
    for (section, table) in &a.settings {
        if !table.is_object() {
            return Err(TrainError::Recipe(format!(
                "unknown key 'algorithm.{section}' (a value, not a loss's settings table)"
            )));
        }
        if registry.readers(section).is_empty() {
            return Err(unknown_section(section, registry));
        }
        registry
            .check_section(section, table)
            .map_err(recipe_error)?;
    }
    Ok(())
}

/// The run's loss, built from its table (its defaults without one).
///
/// # Errors
/// As [`check_tables`]; a table of another loss than the run's (naming both).
pub(crate) fn build_policy(
    a: &AlgorithmSection,
    registry: &LossRegistry,
) -> Result<Arc<dyn PolicyLoss>> {
    check_tables(a, registry)?;
    let own = registry.section_of(&a.loss).map_err(recipe_error)?;
    for (section, table) in &a.settings {
        if Some(section.as_str()) == own {
            continue;
        }
        let readers = registry.readers(section);
        let key = match table.as_object().and_then(|t| t.keys().next()) {
            Some(k) => format!("algorithm.{section}.{k}"),
            None => format!("algorithm.{section}"),
        };
        let readers = readers
            .iter()
            .map(|r| format!("\"{r}\""))
            .collect::<Vec<_>>()
            .join(" or ");
        return Err(TrainError::Recipe(format!(
            "{key}: [algorithm.{section}] holds the settings of loss = {readers}, not of the \
             run's loss '{}'; remove it or choose that loss",
            a.loss
        )));
    }
    let table = own.and_then(|s| a.settings.get(s));
    registry.build(&a.loss, table).map_err(recipe_error)
}
