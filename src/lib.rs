//! # rlft
//!
//! Reinforcement-learning fine-tuning of language models on burn 0.22: the algorithms of the
//! field (PPO, GRPO, Dr.GRPO, DAPO, GSPO, CISPO, CTPO) as recipes and as a library.
//!
//! This facade re-exports the workspace crates:
//! - [`algo`] (`rlft-algo`): log-probs, ratios, clipping, the policy-loss registry, aggregation,
//!   advantages, KL estimators, value loss, reward shaping, diagnostics.
//! - [`model`] (`rlft-model`): the Llama-family transformer, loaded from Hugging Face
//!   safetensors checkpoints or GGUF files, with tokenizer, chat template, LoRA and export.
//! - [`rollout`] (`rlft-rollout`): batched sampling with behaviour log-probs.
//! - [`train`] (`rlft-train`): recipes, the RL loop, checkpoints, metrics and plots.
//! - [`device`]: backend selection from a device string (`flex`, `wgpu:cpu`, `cuda:0`, ...).

#![warn(missing_docs)]

/// burn, the version rlft is built on: a trainer written against rlft uses these types.
pub use burn;
pub use rlft_algo as algo;
pub use rlft_model as model;
pub use rlft_model::device;
pub use rlft_rollout as rollout;
pub use rlft_train as train;

pub mod alloc;
pub mod cli;

/// The burn version rlft is built on.
pub const BURN_VERSION: &str = "0.22.1";
