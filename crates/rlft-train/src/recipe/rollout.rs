//! `[rollout]`: how the training rollouts are sampled, and where (`servers`).

use super::named;
use super::servers::Servers;
use crate::correction::SamplingMask;
use rlft_model::device::DeviceSpec;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Sampling.
#[derive(schemars::JsonSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RolloutSection {
    /// Prompts per RL step.
    pub prompts_per_step: usize,
    /// Responses per prompt (G).
    pub group_size: usize,
    /// Longest prompt (longer ones are skipped and counted).
    pub max_prompt_len: usize,
    /// Most new tokens per turn.
    pub max_new_tokens: usize,
    /// Most model turns (multi-turn tasks).
    pub max_turns: usize,
    /// Most response tokens per episode.
    pub max_total_tokens: usize,
    /// Sampling temperature (also applied to the learner's logits).
    pub temperature: f64,
    /// Top-k (0 = off). With any filter μ is the filtered, renormalised distribution's log-prob
    /// (`rollout/filter_log_mass` logs the kept mass), which the learner's softmax does not
    /// reproduce: auto correction mode then computes π_old.
    pub top_k: usize,
    /// Top-p (1 = off).
    pub top_p: f64,
    /// Min-p (0 = off).
    pub min_p: f64,
    /// Where tokens are drawn: `auto` (on the host for a model in host memory, flex or
    /// ndarray; else on the device), `host`, or `device` (only the sampled ids and log-probs
    /// leave the device).
    pub sample_on: rlft_rollout::SampleOn,
    /// Async mode: the rollout workers' device (`cpu`, `cuda:1`, …; default the learner's).
    #[schemars(with = "Option<named::DeviceName>")]
    pub device: Option<DeviceSpec>,
    /// With `algorithm.sampling_mask = "replay"`: the largest kept set recorded per sampled
    /// token; a token whose filters kept more gets no loss (`rollout/sampling_mask_overflow`).
    pub sampling_mask_max_ids: usize,
    /// Where the training rollouts are sampled: `[]` (default) in the trainer's process;
    /// `"local:N"`, N servers started inside the trainer (the server of `rlft serve`, each on a
    /// free loopback port); or a list of servers' base URLs (`["http://10.0.0.2:8000", …]`,
    /// `rlft serve` or anything speaking its protocol). Evaluation stays in the trainer.
    pub servers: Servers,
    /// With `servers`: the folder each new weight version is written to (`v<version>/`, as
    /// `rlft export --hf` writes it) for the servers to load; every server must read it.
    /// Default `<output_dir>/weights`.
    pub weights_dir: Option<PathBuf>,
    /// With `servers`: seconds a request or weight update may take before the server counts
    /// as not answering (default 60).
    pub server_timeout_s: f64,
    /// With `servers` given as URLs: the model name the servers serve (`rlft serve
    /// --served-model-name`, default `policy`).
    pub server_model: String,
    /// With `servers` given as URLs: what they are — `rlft` (`rlft serve`, the default),
    /// `vllm` (vLLM's OpenAI server with `VLLM_SERVER_DEV_MODE=1`) or `sglang` — which sets how
    /// samples are asked for, how `log μ` and versions are read, and how weights are pushed.
    pub server_protocol: rlft_serve::Protocol,
}

/// `rollout.server_timeout_s`'s default.
pub const DEFAULT_SERVER_TIMEOUT_S: f64 = 60.0;

impl Default for RolloutSection {
    fn default() -> Self {
        Self {
            prompts_per_step: 8,
            group_size: 8,
            max_prompt_len: 256,
            max_new_tokens: 64,
            max_turns: 1,
            max_total_tokens: 256,
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            sample_on: rlft_rollout::SampleOn::Auto,
            device: None,
            sampling_mask_max_ids: 1024,
            servers: Servers::InProcess,
            weights_dir: None,
            server_timeout_s: DEFAULT_SERVER_TIMEOUT_S,
            server_model: "policy".into(),
            server_protocol: rlft_serve::Protocol::Rlft,
        }
    }
}

impl RolloutSection {
    /// The sampler's settings.
    pub fn sampling(&self) -> rlft_rollout::SamplingConfig {
        rlft_rollout::SamplingConfig::new()
            .with_temperature(self.temperature)
            .with_top_k(self.top_k)
            .with_top_p(self.top_p)
            .with_min_p(self.min_p)
            .with_sample_on(self.sample_on)
            .with_max_new_tokens(self.max_new_tokens)
    }

    /// The sampler's settings for training rollouts: [`RolloutSection::sampling`], recording
    /// kept sets (up to `sampling_mask_max_ids`) when `replay` asks for them.
    pub fn training_sampling(&self, replay: SamplingMask) -> rlft_rollout::SamplingConfig {
        let max = match replay {
            SamplingMask::Replay => self.sampling_mask_max_ids,
            SamplingMask::Off => 0,
        };
        self.sampling().with_kept_ids_max(max)
    }

    /// Whether tokens are drawn through a filter: μ is then the filtered, renormalised
    /// distribution's log-prob ([`rlft_rollout::SamplingConfig::draws_filtered`]).
    pub fn filtered(&self) -> bool {
        self.sampling().draws_filtered()
    }
}
