//! # rlft-rollout
//!
//! The rollout side of RL fine-tuning: batched sampling on the KV-cache model with the behaviour
//! log-probs `log μ` of every sampled token, environments (single-turn and multi-turn tool use),
//! built-in tasks with verifiers, rewards, and JSONL datasets.

pub mod dataset;
pub mod env;
pub mod expr;
mod layout;
pub mod learner;
pub mod reward;
mod rollout;
mod sampler;
pub mod task;

pub use dataset::{DataCursor, DataLoader, Dataset, Example, Prompt};
pub use env::{Calculator, EnvStep, Environment, SingleTurn, Tool, ToolEnv};
pub use layout::LearnerBatch;
pub use reward::{
    AnswerFormat, ExactMatch, FormatReward, LengthPenalty, OverlongShaping, Reward, RewardInput,
    RewardOutcome, RewardSet,
};
pub use rollout::{Group, RolloutBatch, RolloutConfig, Trajectory, rollout};
pub use sampler::{Completion, FinishReason, Sampler, SamplingConfig};
pub use task::{Split, Task, TaskKind};

use std::path::PathBuf;

/// Runs `f` on its own thread and returns a receiver for its result, `None` if it panicked. A
/// caller waits with `recv_timeout` and abandons the thread on timeout (rewards and tools run
/// user code that may hang).
pub(crate) fn spawn_guarded<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> std::sync::mpsc::Receiver<Option<T>> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).ok();
        let _ = tx.send(r);
    });
    rx
}

/// Errors from rlft-rollout.
#[derive(Debug, thiserror::Error)]
pub enum RolloutError {
    /// A setting out of range.
    #[error("invalid rollout setting: {0}")]
    Config(String),
    /// Bad input (empty prompt, ...).
    #[error("{0}")]
    Input(String),
    /// A dataset line that cannot be used (`line` 0: the file as a whole).
    #[error("{}:{line}: {msg}", path.display())]
    Dataset {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong and what was expected.
        msg: String,
    },
    /// From the model crate (tokenizer, weights).
    #[error(transparent)]
    Model(#[from] rlft_model::ModelError),
}

/// Result alias for rlft-rollout.
pub type Result<T, E = RolloutError> = std::result::Result<T, E>;
