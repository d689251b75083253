//! Helpers shared by the model examples.

#![allow(dead_code)]

use anyhow::{Context, Result};
use burn::tensor::{DType, Device};
use rlft::cli::Args;
use rlft::model::{ChatMessage, Pretrained};
use std::path::Path;

/// `--device` (else `RLFT_DEVICE`, else the build's default backend).
pub fn device(args: &Args) -> Result<Device> {
    Ok(rlft::device::resolve(args.value("device"))?)
}

/// Loads `--model` (an HF folder or a `.gguf` file) in f32.
pub fn load(args: &Args, device: &Device) -> Result<Pretrained> {
    let path = args.require("model").map_err(anyhow::Error::msg)?;
    Pretrained::load(Path::new(path), device, DType::F32)
        .with_context(|| format!("loading model {path}"))
}

/// Token ids for `text`, rendered as one user turn with the chat template when `chat` is set.
pub fn prompt_ids(p: &Pretrained, text: &str, chat: bool) -> Result<Vec<u32>> {
    let text = if chat {
        p.tokenizer
            .apply_chat_template(&[ChatMessage::user(text)], true)?
    } else {
        text.to_string()
    };
    Ok(p.tokenizer.encode(&text)?)
}
