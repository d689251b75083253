//! The rollout side of training: where a step's batch comes from and how stale it may be.
//!
//! - [`collect`]: one batch — G samples per prompt with their behaviour log-probs μ, rewards,
//!   environment turns, dynamic sampling — inline on the learner's thread or on a worker.
//! - [`admission`]: which batch may start on which weights (AReaL's rule with the bound η,
//!   `async.max_staleness`), what happens to a group older than η (`async.on_stale`), and the
//!   one definition of a group's staleness ([`admission::staleness`]) that every metric uses.
//! - [`workers`]: async mode's rollout threads, each sampling with its own copy of the newest
//!   weights it was given.
//! - [`lagged`]: the lagged testbed's policy snapshots, `lag` versions old.
//! - [`servers`]: `rollout.servers`, the inference servers the sampler calls go to instead
//!   of this process, and the weight versions pushed to them.
//!
//! - [`feed`]: which of these a run uses (`Feed`: inline, lagged or async), the one
//!   owner of its admission controller, snapshots and workers.
//!
//! The trainer's collect stage (`feed.rs`) takes each step's batch from the feed and publishes
//! new weights back.

pub mod admission;
pub mod collect;
pub mod feed;
pub mod lagged;
pub mod servers;
pub mod workers;
