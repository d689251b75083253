//! # rlft-train
//!
//! The product a user runs: a [`Recipe`] (TOML + `RLFT__…` environment + `--set` overrides)
//! drives the synchronous RL loop — rollouts, rewards, DAPO dynamic sampling, advantages,
//! π_old / reference log-probs, the registry loss with KL and entropy terms under gradient
//! accumulation with global token normalisation, AdamW with grad-norm clipping and an LR
//! schedule — with an optional SFT warm-up, a PPO critic, atomic checkpoints with exact resume,
//! `metrics.jsonl`, a progress bar and plots.

#![warn(missing_docs)]

pub mod algorithm;
pub mod batch;
pub mod checkpoint;
pub mod chunked;
mod demos;
pub mod distributed;
mod eval;
pub mod export;
pub mod fault;
pub mod follower;
pub mod launch;
mod learner;
mod models;
pub mod offpolicy;
pub mod optim;
pub mod recipe;
#[cfg(test)]
mod recipe_fuzz;
pub mod rollout_side;
mod sources;
mod step;
pub mod telemetry;
pub mod trainer;

pub use algorithm::Extensions;
pub use optim::clip_grads;
pub use recipe::Recipe;
pub use recipe::correction;
#[cfg(feature = "plots")]
pub use telemetry::plot;
pub use telemetry::{events, metrics, report, sim, tensorboard};
pub use trainer::RunSummary;
pub use trainer::Trainer;

use burn::tensor::Tensor;
use std::path::PathBuf;

/// A tensor's values on the host, as f32.
pub(crate) fn host<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .unwrap_or_default()
}

/// Errors from rlft-train. Each says what was wrong and how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The recipe is invalid (unknown key, value out of range, unreadable file).
    #[error("recipe: {0}")]
    Recipe(String),
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A checkpoint cannot be used.
    #[error("checkpoint {path}: {msg}")]
    Checkpoint {
        /// The checkpoint folder.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// Training diverged (NaN/Inf losses or gradients several steps in a row).
    #[error("{0}")]
    Diverged(String),
    /// From rlft-algo.
    #[error(transparent)]
    Algo(#[from] rlft_algo::AlgoError),
    /// From rlft-model.
    #[error(transparent)]
    Model(#[from] rlft_model::ModelError),
    /// From rlft-rollout.
    #[error(transparent)]
    Rollout(#[from] rlft_rollout::RolloutError),
    /// A command line that cannot be run. Exit status 2 ([`TrainError::exit_code`]).
    #[error("{0}")]
    Usage(String),
    /// A rollout worker of the asynchronous pipeline failed: its reward, environment or model
    /// returned an error or panicked while generating a batch. The run stops (its last
    /// checkpoint stays); exit status 3 ([`TrainError::exit_code`]).
    #[error("rollout worker {worker} failed: {msg}")]
    Worker {
        /// The worker's index (`rlft-rollout-N` threads, `rollout/N` in the timeline).
        worker: usize,
        /// What went wrong.
        msg: String,
    },
    /// The asynchronous pipeline cannot go on (its workers are gone).
    #[error("asynchronous pipeline: {0}")]
    Pipeline(String),
    /// The rollout servers (`rollout.servers`) did not answer a request or refused new weights.
    /// The run stops (its last checkpoint stays); exit status 4 ([`TrainError::exit_code`]).
    #[error("rollout servers: {0}")]
    Servers(String),
    /// JSON (de)serialisation.
    #[error("JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// The learner's process ranks (`[distributed] backend = "mpi"`) cannot go on: a rank
    /// stopped answering, the ranks' weights diverged, or a message between them was damaged.
    /// Exit status 5 ([`TrainError::exit_code`]).
    #[error("learner ranks: {0}")]
    Ranks(String),
}

impl TrainError {
    /// The process exit status the `rlft` program gives for this error: 2 for a command line
    /// that cannot be run ([`TrainError::Usage`]), 3 for a failed rollout worker
    /// ([`TrainError::Worker`]), 4 for rollout servers that failed ([`TrainError::Servers`]),
    /// 5 for learner ranks that cannot go on ([`TrainError::Ranks`]), 1 for everything else.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Usage(_) => 2,
            Self::Worker { .. } => 3,
            Self::Servers(_) | Self::Rollout(rlft_rollout::RolloutError::Server(_)) => 4,
            Self::Ranks(_) => 5,
            _ => 1,
        }
    }
}

/// Result alias for rlft-train.
pub type Result<T, E = TrainError> = std::result::Result<T, E>;

/// Writes `bytes` to `path` crash-safely ([`rlft_model::write_atomic`]: temporary file, fsync,
/// rename, folder sync).
pub fn write_atomic(path: &std::path::Path, bytes: &[u8]) -> Result<()> {
    rlft_model::write_atomic(path, bytes).map_err(io_err(path))
}

/// A rayon pool of `threads` threads named by `name(k)` (the learner's and each rollout
/// worker's compute threads).
pub(crate) fn compute_pool(
    threads: usize,
    name: impl FnMut(usize) -> String + 'static,
) -> std::result::Result<rayon::ThreadPool, rayon::ThreadPoolBuildError> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(name)
        .build()
}

pub(crate) fn io_err(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> TrainError {
    let path = path.into();
    move |source| TrainError::Io { path, source }
}
