//! # rlft-model
//!
//! Policy and reference models for rlft: one Llama-family decoder-only transformer (Llama 1/2/3,
//! Mistral, Qwen2, Qwen3, SmolLM/SmolLM2) configured from a Hugging Face `config.json` and
//! loaded from safetensors checkpoints.

mod config;
mod error;
mod load;
pub mod model;

pub use config::{Llama3RopeScaling, TransformerConfig};
pub use error::{ModelError, Result};
pub use model::{ForwardInput, KvCache, Transformer, ValueModel};
