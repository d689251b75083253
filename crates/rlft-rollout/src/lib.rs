//! # rlft-rollout
//!
//! The rollout side of RL fine-tuning: batched sampling on the KV-cache model with the behaviour
//! log-probs `log μ` of every sampled token, environments (single-turn and multi-turn tool use),
//! built-in tasks with verifiers, rewards (with ports of verl's reward scorers in [`scorers`] and
//! external scorer programs in [`command`]), and JSONL and Parquet datasets.

#![warn(missing_docs)]

pub mod command;
pub mod dataset;
pub mod env;
pub mod expr;
mod generator;
mod layout;
pub mod pool;
pub mod reward;
mod rollout;
mod sampler;
pub mod scorers;
pub mod task;

pub use command::{CommandReward, CommandTool, LineProcess};
pub use dataset::{Columns, DataCursor, DataLoader, DataRole, Dataset, Example, Prompt};
pub use env::{Calculator, EnvStep, Environment, NamedTool, SingleTurn, Tool, ToolEnv};
pub use generator::{Generated, Generator, InProcess};
pub use layout::{LearnerBatch, RoutingStats};
pub use pool::{JobOutcome, PoolStats, Ticket, WorkerPool, panic_message};
pub use reward::{
    AnswerFormat, ExactMatch, FormatReward, LengthPenalty, Named, OverlongShaping, RegexMatch,
    Reward, RewardInput, RewardOutcome, RewardSet,
};
pub use rollout::{
    Group, RolloutBatch, RolloutConfig, RolloutSetup, Trajectory, rollout, rollout_updating,
    rollout_with,
};
pub use sampler::{
    Completion, Draw, FinishReason, KvOnUpdate, SampleOn, Sampled, Sampler, SamplingConfig,
    Updated, Updates, WeightUpdate, draw_on_device, draw_on_host,
};
pub use scorers::{
    BySource, DapoScore, Gsm8kMethod, ParityReport, Scored, Scorer, check_golden,
    check_golden_file, gsm8k, math_boxed, math_dapo, qa_em,
};
pub use task::{Split, Task, TaskKind};

use std::path::PathBuf;

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
    /// Every worker of a reward or tool pool is stuck in a function that ran past its deadline
    /// and has not returned; the run stops instead of waiting forever.
    #[error(
        "all {workers} {pool} worker threads are stuck in calls past their deadline: {hung}. An \
         in-process {pool} function cannot be stopped, so the run stops instead of hanging: make \
         the {pool} function return (give it its own internal timeout), or raise the {pool} pool \
         size (`with_workers`) or the deadline (`with_timeout`/`timeout`)"
    )]
    WorkersStuck {
        /// Which pool: `reward` or `tool`.
        pool: String,
        /// Workers stuck (all of them).
        workers: usize,
        /// The hung functions, how many workers each holds, for how long.
        hung: String,
    },
    /// A reward function panicked: a bug in it, so the rollout stops (a reward that returns
    /// `Err` fails its sample only and the run goes on).
    #[error(
        "a reward function panicked: {msg}. A panic is a bug in the reward, so the run stops; \
         return Err(..) from `Reward::score` to fail one sample instead"
    )]
    RewardPanicked {
        /// The panic message.
        msg: String,
    },
    /// An inference server that samples a rollout's calls failed (no answer, an error, or an
    /// answer that is not the protocol's).
    #[error("rollout server: {0}")]
    Server(String),
    /// The caller ended a generation (its `on_token` returned `Break`: a client that went away).
    #[error("the generation was cancelled by its caller")]
    Cancelled,
    /// The model gave a non-finite logit (NaN or an infinity), so no token can be drawn and no
    /// `log μ` recorded.
    #[error(
        "the model gave a non-finite logit (NaN or an infinity) for row {row} at generated token          {position} (weight version {version}): its weights or activations are not finite; check          the checkpoint for NaN or infinite values, or compute in f32 instead of f16"
    )]
    NonFiniteLogits {
        /// The row (index in the batch).
        row: usize,
        /// The generated token's position (0: the first).
        position: usize,
        /// The weight version that computed it.
        version: u64,
    },
    /// From the model crate (tokenizer, weights).
    #[error(transparent)]
    Model(#[from] rlft_model::ModelError),
}

/// Result alias for rlft-rollout.
pub type Result<T, E = RolloutError> = std::result::Result<T, E>;
