//! # rlft-model
//!
//! Policy and reference models for rlft: one Llama-family decoder-only transformer (Llama 1/2/3,
//! Mistral, Qwen2, Qwen3, SmolLM/SmolLM2) configured from a Hugging Face `config.json` or GGUF
//! metadata, loaded from safetensors or GGUF (dequantised), with its tokenizer and chat template,
//! LoRA adapters, and export back to an HF checkpoint; and the choice of backend from a device
//! string ([`device`]).

#![warn(missing_docs)]

mod chat;
mod config;
pub mod decode;
pub mod dequant;
pub mod device;
mod error;
mod export;
pub mod finite;
#[cfg(test)]
mod fuzz;
pub mod gguf;
pub mod host;
pub mod hostmem;
pub mod layers;
mod load;
pub mod model;
mod rope;
mod tokenizer;

pub use chat::{ChatMessage, ChatTemplate};
pub use config::families;
pub use config::{
    Activation, ConfigKeys, GgufKeys, LayerType, Llama3RopeScaling, MoeConfig, NormPlacement,
    TransformerConfig, WeightLayout,
};
pub use error::{ModelError, Result};
pub use export::{GgufFileType, HF_EXPORT_FILES, LORA_TARGETS, LoraConfig};
pub use finite::{NonFinite, first_non_finite};
pub use gguf::GgufFile;
pub use host::{DECODE_ROWS, HostKvCache, HostWeights};
pub use layers::{
    AttentionConfig, DecoderLayerConfig, FeedForward, LinearRows, MlpConfig, Norm, NormConfig,
    Routing, SparseMoe, SparseMoeConfig, TokenRouting,
};
pub use load::Pretrained;
pub use model::{ForwardInput, KvCache, RouterTrace, Transformer, ValueModel};
pub use rope::LLAMA3_ORIGINAL_CONTEXT;
pub use tokenizer::{TokenStream, Tokenizer};

/// Writes `bytes` to `path` crash-safely: a temporary file beside it is written and synced, then
/// renamed over `path`, and the folder is synced (on Unix), so a reader finds the old contents or
/// the new, never a part. Every file rlft writes goes through here.
///
/// # Errors
/// The I/O error of the step that failed (the temporary file is removed).
pub fn write_atomic(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut name = std::ffi::OsString::from(".");
    name.push(path.file_name().unwrap_or_default());
    name.push(".tmp");
    let tmp = path.with_file_name(name);
    let written = std::fs::File::create(&tmp).and_then(|mut f| {
        std::io::Write::write_all(&mut f, bytes)?;
        f.sync_all()
    });
    if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, path)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    sync_dir(path.parent().unwrap_or(std::path::Path::new(".")));
    Ok(())
}

/// Syncs a folder so that renames inside it are durable (Unix; elsewhere a no-op). The empty
/// path is the current folder.
pub fn sync_dir(dir: &std::path::Path) {
    let dir = if dir.as_os_str().is_empty() {
        std::path::Path::new(".")
    } else {
        dir
    };
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}
