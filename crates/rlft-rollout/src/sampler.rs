//! Batched sampling on the KV-cache model, recording the behaviour log-probs `log μ` of every
//! sampled token.
//!
//! Prompts are prefilled on the model's device. On a CPU device (flex, ndarray) with AVX-512, steps
//! of at most [`DECODE_ROWS`] rows then run on the host ([`HostWeights::decode_step`] over the
//! cache moved there once), and tokens are drawn on the host from the logits. On other devices
//! (or with [`SampleOn::Device`]) every step runs on the device and the draw too ([`device`]):
//! only the sampled ids and their log-probs leave it. Rows that finish are dropped from the
//! batch and from the KV cache, so they stop costing compute.

use crate::{LearnerBatch, Result, RolloutError};
use burn::tensor::{Int, Tensor, TensorData};
use rlft_model::{ForwardInput, HostWeights, TokenRouting, Tokenizer, Transformer};
use serde::{Deserialize, Serialize};
use std::ops::ControlFlow;

mod config;
mod decode;
mod device;
mod host;
mod routing;

pub use config::{SampleOn, SamplingConfig};
pub use device::draw_on_device;
pub use host::draw_on_host;
#[cfg(test)]
use host::{argmax, sample};

/// One drawn token.
#[derive(Debug, Clone, PartialEq)]
pub struct Draw {
    /// The token id.
    pub token: usize,
    /// `log μ(token)`: its log-prob under the distribution it was drawn from — the tempered
    /// softmax, or with top-k / min-p / top-p the filtered, renormalised one (greedy decoding:
    /// the softmax at temperature 1).
    pub logprob: f32,
    /// With filters, `log S`: the log of the probability mass the filters kept (≤ 0; the
    /// full-softmax log-prob is `logprob + log_kept_mass`). 0 without filters.
    pub log_kept_mass: f64,
    /// With filters and [`SamplingConfig::kept_ids_max`] > 0: the kept token ids (the sampling
    /// mask, most likely first), or `None` when more than `kept_ids_max` were kept.
    pub kept_ids: Option<Vec<u32>>,
}

/// One token as the sampler chooses it ([`Sampler::generate_with`]).
#[derive(Debug)]
pub struct Sampled<'d> {
    /// The row: its index in the caller's batch.
    pub row: usize,
    /// The draw: the token, its `log μ`, and with filters `log S` and the kept ids.
    pub draw: &'d Draw,
    /// The weight version that sampled it.
    pub version: u64,
    /// On the row's last token: why it stopped.
    pub finish: Option<FinishReason>,
}

/// Why a row stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// An EOS token.
    Eos,
    /// A stop token id or stop string.
    Stop,
    /// `max_new_tokens` reached.
    Length,
}

/// One sampled completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Completion {
    /// Generated token ids (the EOS / stop token included).
    pub tokens: Vec<u32>,
    /// `log μ(token)` under the distribution each token was drawn from ([`Draw::logprob`]):
    /// the softmax after temperature, filtered and renormalised when top-k / min-p / top-p are
    /// on (for greedy decoding, the softmax at temperature 1).
    pub logprobs: Vec<f32>,
    /// With sampling filters, `log S` of each token ([`Draw::log_kept_mass`]); empty without.
    #[serde(default)]
    pub log_kept_mass: Vec<f32>,
    /// With sampling filters and [`SamplingConfig::kept_ids_max`] > 0, each token's sampling
    /// mask ([`Draw::kept_ids`]: `None` where more were kept); empty otherwise.
    #[serde(default)]
    pub kept_ids: Vec<Option<Vec<u32>>>,
    /// Why it stopped.
    pub finish_reason: FinishReason,
    /// A mixture of experts' routing of every token the sampler forwarded for this row: the
    /// prompt, then each generated token but the last (it is never forwarded); `None` for a
    /// dense model.
    #[serde(default)]
    pub routing: Option<TokenRouting>,
}

impl Completion {
    /// Cut off by `max_new_tokens` rather than ending on its own.
    pub fn truncated(&self) -> bool {
        self.finish_reason == FinishReason::Length
    }
}

/// New weights that reach a generation between two decode steps (interruptible generation).
pub struct WeightUpdate {
    /// Their policy version.
    pub version: u64,
    /// The weights (frozen, on the sampler's device).
    pub model: Transformer,
}

/// What a generation does with its KV cache when new weights arrive.
#[derive(
    schemars::JsonSchema, Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum KvOnUpdate {
    /// Keep the keys and values the old weights computed (cheap; later tokens attend to them).
    #[default]
    Keep,
    /// Recompute them for every row's context with the new weights (one prefill).
    Recompute,
}

/// Where an interruptible generation looks for new weights, and which version it starts with.
pub struct Updates<'u> {
    /// The version of the sampler's own weights.
    pub version: u64,
    /// What to do with the KV cache on an update.
    pub kv: KvOnUpdate,
    /// Called before every decode step; `Some` switches the generation to those weights.
    pub poll: &'u mut dyn FnMut() -> Option<WeightUpdate>,
}

/// What an interruptible generation produced.
pub struct Updated {
    /// One completion per prompt.
    pub completions: Vec<Completion>,
    /// Per completion, the policy version that sampled each token.
    pub versions: Vec<Vec<u64>>,
    /// The newest weights it switched to, if any (later turns continue with them).
    pub latest: Option<WeightUpdate>,
}

/// Batched generator over one model.
pub struct Sampler<'a> {
    model: &'a Transformer,
    tokenizer: Option<&'a Tokenizer>,
    eos_ids: Vec<u32>,
    pad_id: u32,
    /// Host copies of the weights for the CPU decode kernels, made at the first decode on a CPU
    /// device (`None` inside: another device).
    host: std::sync::OnceLock<Option<HostWeights>>,
}

/// Per-row decoding state.
struct Row {
    /// Index in the caller's batch.
    index: usize,
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
    /// `log S` of each token (with sampling filters).
    log_kept_mass: Vec<f32>,
    /// Each token's kept ids (with sampling filters and `kept_ids_max`).
    kept_ids: Vec<Option<Vec<u32>>>,
    /// The policy version that sampled each token.
    versions: Vec<u64>,
    /// The experts of every token forwarded so far (mixtures of experts).
    routing: Option<TokenRouting>,
    position: i64,
    /// Completion text decoded so far (only with stop strings).
    text: String,
}

impl Row {
    /// The token sampled last (the next step's input).
    fn last_token(&self) -> u32 {
        *self
            .tokens
            .last()
            .expect("a row is decoded after its first sample")
    }

    /// Position of [`Row::last_token`].
    fn next_position(&self) -> i64 {
        self.position + self.tokens.len() as i64 - 1
    }
}

impl<'a> Sampler<'a> {
    /// A sampler stopping at the tokenizer's EOS ids (pass `None` to never stop early and to
    /// disable stop strings).
    pub fn new(model: &'a Transformer, tokenizer: Option<&'a Tokenizer>) -> Self {
        let eos_ids = tokenizer.map(|t| t.eos_ids.clone()).unwrap_or_default();
        let pad_id = tokenizer
            .and_then(|t| t.pad_id.or(t.eos_ids.first().copied()))
            .unwrap_or(0);
        Self {
            model,
            tokenizer,
            eos_ids,
            pad_id,
            host: std::sync::OnceLock::new(),
        }
    }

    /// Samples one completion per prompt (prompts may differ in length: they are left-padded).
    ///
    /// # Errors
    /// A setting out of range, an empty prompt, stop strings without a tokenizer, a model that
    /// gives a non-finite logit ([`RolloutError::NonFiniteLogits`]).
    pub fn generate(&self, prompts: &[Vec<u32>], cfg: &SamplingConfig) -> Result<Vec<Completion>> {
        self.generate_with(prompts, cfg, |_| ControlFlow::Continue(()))
    }

    /// As [`Sampler::generate`], calling `on_token` as each token is chosen (in row order within
    /// a step, a row's last token with its [`Sampled::finish`]). A `Break` from it ends the
    /// generation at once with [`RolloutError::Cancelled`] (a client that went away).
    ///
    /// # Errors
    /// As [`Sampler::generate`], and [`RolloutError::Cancelled`].
    pub fn generate_with(
        &self,
        prompts: &[Vec<u32>],
        cfg: &SamplingConfig,
        on_token: impl FnMut(&Sampled<'_>) -> ControlFlow<()>,
    ) -> Result<Vec<Completion>> {
        Ok(self.run(prompts, cfg, on_token, None)?.completions)
    }

    /// As [`Sampler::generate`], switching to new weights when `updates.poll` returns them
    /// (checked before every decode step): the rows go on with the new weights, keeping or
    /// recomputing their KV cache, and each token's log-prob μ and version are those of the
    /// weights that sampled it.
    ///
    /// # Errors
    /// As [`Sampler::generate`]; `cfg.rescore` cannot be combined with updates (one pass cannot
    /// rescore tokens sampled by different weights).
    pub fn generate_updating(
        &self,
        prompts: &[Vec<u32>],
        cfg: &SamplingConfig,
        updates: &mut Updates<'_>,
    ) -> Result<Updated> {
        if cfg.rescore {
            return Err(RolloutError::Config(
                "rescore cannot be combined with weight updates during generation: each token's \
                 μ must come from the weights that sampled it"
                    .into(),
            ));
        }
        self.run(prompts, cfg, |_| ControlFlow::Continue(()), Some(updates))
    }

    fn run(
        &self,
        prompts: &[Vec<u32>],
        cfg: &SamplingConfig,
        on_token: impl FnMut(&Sampled<'_>) -> ControlFlow<()>,
        updates: Option<&mut Updates<'_>>,
    ) -> Result<Updated> {
        cfg.validate()?;
        if prompts.is_empty() {
            return Ok(Updated {
                completions: Vec::new(),
                versions: Vec::new(),
                latest: None,
            });
        }
        if let Some(i) = prompts.iter().position(Vec::is_empty) {
            return Err(RolloutError::Input(format!("prompt {i} is empty")));
        }
        if !cfg.stop_strings.is_empty() && self.tokenizer.is_none() {
            return Err(RolloutError::Config(
                "stop strings need a tokenizer to decode completions".into(),
            ));
        }
        let version = updates.as_ref().map_or(0, |u| u.version);
        decode::Decode::new(self, prompts, cfg, version).run(on_token, updates)
    }

    /// The host weight copies when the model is on a CPU device (made once per sampler).
    fn host_weights(&self) -> Result<Option<&HostWeights>> {
        if let Some(h) = self.host.get() {
            return Ok(h.as_ref());
        }
        let made = if HostWeights::suits_model(self.model) {
            Some(HostWeights::new(self.model).map_err(model_err)?)
        } else {
            None
        };
        Ok(self.host.get_or_init(|| made).as_ref())
    }

    /// Replaces each completion's log-probs by those of one forward pass over the rows
    /// `prompt | completion` in the learner's layout ([`LearnerBatch`]); with sampling filters,
    /// minus each token's `log S` from the draw (the renormalisation).
    fn rescore(
        &self,
        prompts: &[Vec<u32>],
        done: &mut [Completion],
        temperature: f64,
    ) -> Result<()> {
        let device = self.model.embed_tokens.weight.device();
        let rows: Vec<Vec<u32>> = prompts
            .iter()
            .zip(done.iter())
            .map(|(p, c)| [&p[..], &c.tokens[..]].concat())
            .collect();
        let rows: Vec<(&[u32], usize)> = rows
            .iter()
            .zip(prompts)
            .map(|(r, p)| (&r[..], p.len()))
            .collect();
        let batch = LearnerBatch::new(&rows, self.pad_id as i64, &device);
        let lp = batch
            .logprobs(self.model, Some(temperature))
            .map_err(|e| RolloutError::Input(format!("rescoring: {e}")))?
            .into_data()
            .convert::<f32>()
            .try_into_vec::<f32>()
            .map_err(|e| RolloutError::Input(format!("log-probs to host: {e:?}")))?;
        for (i, c) in done.iter_mut().enumerate() {
            c.logprobs = batch.unpack(&lp, i, c.tokens.len());
            for (l, m) in c.logprobs.iter_mut().zip(&c.log_kept_mass) {
                *l -= m;
            }
        }
        Ok(())
    }

    /// Decodes the row's newest token and checks whether the completion now contains a stop
    /// string (including one spanning several tokens).
    fn hits_stop_string(&self, row: &mut Row, cfg: &SamplingConfig) -> Result<bool> {
        let Some(tok) = self.tokenizer.filter(|_| !cfg.stop_strings.is_empty()) else {
            return Ok(false);
        };
        let before = row.text.len();
        row.text = tok.decode(&row.tokens, false)?;
        let longest = cfg.stop_strings.iter().map(String::len).max().unwrap_or(0);
        // Only a window that includes the new text can hold a new match.
        let mut from = before.saturating_sub(longest);
        while !row.text.is_char_boundary(from) {
            from -= 1;
        }
        let tail = &row.text[from..];
        Ok(cfg.stop_strings.iter().any(|s| tail.contains(s.as_str())))
    }
}

/// A model error met while sampling, as the sampler's error.
fn model_err(e: rlft_model::ModelError) -> RolloutError {
    RolloutError::Input(e.to_string())
}

/// One decode step's last-position logits: on the host, or still on the device.
enum StepLogits {
    /// Row-major `[rows, vocab]`.
    Host(Vec<f32>),
    /// `[rows, vocab]` (boxed: a tensor handle is far larger than a `Vec`).
    Device(Box<Tensor<2>>),
}

/// Sequences left-padded into one prefill input (positions from 0 at each sequence's first
/// real token; an attention mask when their lengths differ).
fn padded_input(
    seqs: &[impl AsRef<[u32]>],
    pad_id: u32,
    device: &burn::tensor::Device,
) -> ForwardInput {
    let (b, lp) = (
        seqs.len(),
        seqs.iter().map(|s| s.as_ref().len()).max().unwrap_or(0),
    );
    let mut ids = Vec::with_capacity(b * lp);
    let mut mask = Vec::with_capacity(b * lp);
    let mut pos = Vec::with_capacity(b * lp);
    for p in seqs {
        let p = p.as_ref();
        let pad = lp - p.len();
        ids.extend(std::iter::repeat_n(pad_id as i64, pad));
        ids.extend(p.iter().map(|&t| t as i64));
        mask.extend(std::iter::repeat_n(0i64, pad).chain(std::iter::repeat_n(1, p.len())));
        pos.extend(std::iter::repeat_n(0i64, pad).chain(0..p.len() as i64));
    }
    let int2 = |v: Vec<i64>| Tensor::<2, Int>::from_data(TensorData::new(v, [b, lp]), device);
    let padded = seqs.iter().any(|p| p.as_ref().len() < lp);
    ForwardInput {
        input_ids: int2(ids),
        position_ids: int2(pos),
        attention_mask: padded.then(|| int2(mask)),
        segment_ids: None,
        prefix_ids: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_norm(p: &[f64]) -> Vec<f32> {
        let s: f64 = p.iter().sum();
        p.iter().map(|x| (x / s).ln() as f32).collect()
    }

    #[test]
    fn filters_follow_their_definitions() {
        let lp = log_norm(&[0.05, 0.5, 0.3, 0.15]);
        let base = SamplingConfig::new();
        // Inverse CDF: u just below 0.05 picks token 0, just above picks 1.
        assert_eq!(sample(&lp, &base, 0.049), 0);
        assert_eq!(sample(&lp, &base, 0.051), 1);
        assert_eq!(sample(&lp, &base, 0.999), 3);
        let k1 = base.clone().with_top_k(1);
        assert!((0..10).all(|i| sample(&lp, &k1, i as f64 / 10.0) == 1));
        // top_p 0.8: {0.5, 0.3} — 0.5 + 0.3 reaches it.
        let p = base.clone().with_top_p(0.8);
        let picks: std::collections::BTreeSet<usize> = (0..100)
            .map(|i| sample(&lp, &p, i as f64 / 100.0))
            .collect();
        assert_eq!(picks, [1, 2].into());
        // min_p 0.5: tokens with p ≥ 0.25 → {0.5, 0.3}.
        let m = base.with_min_p(0.5);
        let picks: std::collections::BTreeSet<usize> = (0..100)
            .map(|i| sample(&lp, &m, i as f64 / 100.0))
            .collect();
        assert_eq!(picks, [1, 2].into());
        assert_eq!(argmax(&lp), 1);
    }

    #[test]
    fn config_ranges_are_checked() {
        assert!(SamplingConfig::new().with_top_p(0.0).validate().is_err());
        assert!(
            SamplingConfig::new()
                .with_temperature(-1.0)
                .validate()
                .is_err()
        );
        assert!(
            SamplingConfig::new()
                .with_max_new_tokens(0)
                .validate()
                .is_err()
        );
        assert!(SamplingConfig::new().validate().is_ok());
    }
}
