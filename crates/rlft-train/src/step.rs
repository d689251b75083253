//! One RL step's stages, each a function over the parts it needs (not the whole trainer):
//! [`collect`] (a batch from the feed, its rewards scored on the rollout side) →
//! [`prepare`] (the learner's rows: shaping, π_old, π_ref, values, advantages, the correction
//! against μ) → [`learn`] (the optimiser steps) → [`publish`] (the new weights to the rollout
//! side). [`crate::Trainer`] runs them in that order and reports the step.

pub(crate) mod collect;
pub(crate) mod learn;
mod passes;
pub(crate) mod prepare;

use crate::Result;
use crate::rollout_side::feed::Feed;
use burn::module::Module;
use rlft_model::Transformer;

/// After the update of step `step`: hands `policy` (version `step + 1`) to the rollout
/// workers, and to the servers they sample on.
///
/// # Errors
/// A server that cannot take the weights.
pub(crate) fn publish(feed: &Feed, policy: &Transformer, step: usize) -> Result<()> {
    feed.publish(step as u64 + 1, || policy.valid())
}
