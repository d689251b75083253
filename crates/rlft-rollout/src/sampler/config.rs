//! How to sample ([`SamplingConfig`]) and where tokens are drawn ([`SampleOn`]).

use crate::{Result, RolloutError};
use burn::config::Config;
use serde::{Deserialize, Serialize};

/// Where tokens are drawn from the logits.
#[derive(
    schemars::JsonSchema, Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum SampleOn {
    /// On the host for a model in host memory (flex, ndarray: the host decode kernels where
    /// the CPU has them), else on the device.
    #[default]
    Auto,
    /// Logits move to the host every step and tokens are drawn there.
    Host,
    /// Every step and the draw run on the model's device (no host decode kernels); only the
    /// sampled ids and their log-probs leave it.
    Device,
}

impl SampleOn {
    /// Every value with its name, as written in recipes.
    pub const ALL: [(SampleOn, &'static str); 3] = [
        (SampleOn::Auto, "auto"),
        (SampleOn::Host, "host"),
        (SampleOn::Device, "device"),
    ];
}

/// How to sample.
#[derive(Config, Debug, PartialEq)]
pub struct SamplingConfig {
    /// Softmax temperature; `0` is greedy decoding.
    #[config(default = 1.0)]
    pub temperature: f64,
    /// Keep only the `k` most likely tokens (`0`: off).
    #[config(default = 0)]
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches `top_p` (`1`: off).
    #[config(default = 1.0)]
    pub top_p: f64,
    /// Drop tokens less likely than `min_p` times the most likely one (`0`: off).
    #[config(default = 0.0)]
    pub min_p: f64,
    /// Most tokens to generate per row.
    #[config(default = 64)]
    pub max_new_tokens: usize,
    /// Extra token ids that end a row (besides the tokenizer's EOS ids).
    #[config(default = "Vec::new()")]
    pub stop_token_ids: Vec<u32>,
    /// Strings that end a row as soon as the decoded completion contains one (they may span
    /// several tokens).
    #[config(default = "Vec::new()")]
    pub stop_strings: Vec<String>,
    /// Keep going past EOS (benchmarks).
    #[config(default = false)]
    pub ignore_eos: bool,
    /// RNG seed: the same seed gives the same tokens on the same device.
    #[config(default = 0)]
    pub seed: u64,
    /// After sampling, recompute `log μ` with one full forward pass over the finished batch in
    /// the learner's layout ([`LearnerBatch`](crate::LearnerBatch): rows packed end to end). Decode steps run other
    /// matmul shapes than a full pass, so their f32 log-probs differ from the learner's by
    /// ≈1e-5; rescoring makes μ exactly what the learner computes, for one extra forward pass.
    #[config(default = false)]
    pub rescore: bool,
    /// Where tokens are drawn ([`SampleOn`]); the same seed draws the same tokens either way
    /// but where two tokens' cumulative probabilities lie within f32 rounding of the variate.
    #[config(default = "SampleOn::Auto")]
    pub sample_on: SampleOn,
    /// With top-k / min-p / top-p: record each draw's kept token ids (its sampling mask) when
    /// the filters kept at most this many (`0`: not recorded). A larger kept set is reported as
    /// an overflow ([`Draw::kept_ids`](super::Draw::kept_ids) `None`).
    #[config(default = 0)]
    pub kept_ids_max: usize,
}

impl SamplingConfig {
    /// Checks the ranges.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(RolloutError::Config(m));
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return bad(format!("temperature must be ≥ 0, got {}", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        if !(0.0..1.0).contains(&self.min_p) {
            return bad(format!("min_p must be in [0, 1), got {}", self.min_p));
        }
        if self.max_new_tokens == 0 {
            return bad("max_new_tokens must be at least 1".into());
        }
        Ok(())
    }

    /// Whether any filter (top-k, top-p, min-p) makes the sampling distribution differ from the
    /// tempered softmax the learner recomputes.
    pub fn has_filters(&self) -> bool {
        self.top_k > 0 || self.top_p < 1.0 || self.min_p > 0.0
    }

    /// Whether tokens are drawn through a filter: a filter at a temperature above 0 (greedy
    /// decoding ignores the filters). μ is then the filtered, renormalised log-prob.
    pub fn draws_filtered(&self) -> bool {
        self.temperature != 0.0 && self.has_filters()
    }
}
