//! # rlft-model
//!
//! Policy and reference models for rlft: one Llama-family decoder-only transformer (Llama 1/2/3,
//! Mistral, Qwen2, Qwen3, SmolLM/SmolLM2) configured from a Hugging Face `config.json` or GGUF
//! metadata, loaded from safetensors or GGUF (dequantised), with its tokenizer and chat template,
//! LoRA adapters, and export back to an HF checkpoint.

mod chat;
mod config;
pub mod decode;
pub mod dequant;
mod error;
mod export;
#[cfg(test)]
mod fuzz;
pub mod gguf;
pub mod host;
pub mod hostmem;
mod load;
pub mod model;
mod rope;
mod tokenizer;

pub use chat::{ChatMessage, ChatTemplate};
pub use config::{Llama3RopeScaling, TransformerConfig};
pub use error::{ModelError, Result};
pub use export::{LORA_TARGETS, LoraConfig};
pub use gguf::GgufFile;
pub use host::{DECODE_ROWS, HostKvCache, HostWeights};
pub use load::Pretrained;
pub use model::{ForwardInput, KvCache, Transformer, ValueModel};
pub use rope::LLAMA3_ORIGINAL_CONTEXT;
pub use tokenizer::{TokenStream, Tokenizer};
