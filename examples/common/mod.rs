//! Helpers shared by the model examples.

#![allow(dead_code)]

use anyhow::{Context, Result};
use burn::tensor::{DType, Device};
use rlft::algo::loss::{LossContext, LossTerms, PolicyLoss};
use rlft::cli::Args;
use rlft::model::{ChatMessage, Pretrained};
use std::path::Path;

/// rlft's allocator (mimalloc, freed memory kept): `rlft::alloc`.
#[global_allocator]
static GLOBAL: rlft::alloc::Allocator = rlft::alloc::Allocator;

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

/// A truncated-IS policy gradient `−sg(min(ρ, cap))·A·log πθ`: every token keeps its gradient
/// (like CISPO), the IS weight is only capped from above. Used by `custom_loss` and
/// `custom_reward`.
pub struct TruncatedIsPg {
    /// The cap on the IS weight.
    pub cap: f64,
}

impl PolicyLoss for TruncatedIsPg {
    fn terms(&self, ctx: &LossContext<'_>) -> rlft::algo::Result<LossTerms> {
        let ratio = ctx.ratio();
        let capped = ratio.clone().greater_elem(self.cap);
        let weight = ratio.clone().clamp_max(self.cap).detach();
        let loss = (weight * ctx.input.advantages.clone() * ctx.input.log_prob.clone()).neg();
        let mut terms = LossTerms::per_token(loss);
        terms.clip_frac_high = Some(ctx.fraction(capped));
        terms.ratio = Some(ratio);
        Ok(terms)
    }
}

/// The process's peak resident memory in MB (`VmHWM`; NaN where `/proc` is missing).
pub fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kb| kb / 1024.0)
}
