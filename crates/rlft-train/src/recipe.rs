//! Recipes: a TOML file, then `RLFT__SECTION__KEY` environment variables, then `--set a.b=value`
//! overrides, merged with the `config` crate into serde structs. Unknown keys are rejected naming
//! the nearest valid key; every value is range-checked before any model is loaded.

use crate::correction::{CorrectionSection, RatioReference, SamplingMask};
use crate::distributed::DistributedSection;
use rlft_algo::{AdvantageEstimator, KlEstimator, LossAggregation, RatioLevel};
use rlft_model::device::DeviceSpec;
use rlft_rollout::TaskKind;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

mod asynchrony;
pub mod correction;
mod data;
mod dtype;
mod keys;
mod load;
pub(crate) mod losses;
mod named;
pub mod reference;
mod resume;
mod rollout;
mod servers;
mod validate;

pub use asynchrony::{AsyncMode, AsyncSection, MAX_LAG, MAX_STALENESS, MAX_WORKERS, OnStale};
pub use data::{
    DataSection, RewardKind, RewardTerm, ToolKind, ToolSpec, correctness_term, effective_terms,
};
pub use dtype::ModelDtype;
pub use keys::RESUMABLE_KEYS;
pub use load::ENV_PREFIX;
pub use resume::check_stored_copy;
pub use rollout::{DEFAULT_SERVER_TIMEOUT_S, RolloutSection};
pub use servers::{MAX_LOCAL_SERVERS, Servers};

/// A whole training run.
#[derive(schemars::JsonSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Recipe {
    /// Seeds model init, data order, sampling.
    pub seed: u64,
    /// Where metrics, checkpoints and the final model go.
    pub output_dir: PathBuf,
    /// Device (`auto`, `flex`, `ndarray`, `cpu`, `wgpu[:N|:cpu]`, `cuda[:N]`, ...).
    #[schemars(with = "named::DeviceName")]
    pub device: DeviceSpec,
    /// The policy.
    pub model: ModelSection,
    /// The task or dataset.
    pub task: TaskSection,
    /// Sampling.
    pub rollout: RolloutSection,
    /// The RL algorithm.
    pub algorithm: AlgorithmSection,
    /// AdamW.
    pub optimizer: OptimizerSection,
    /// Steps and learning-rate schedule.
    pub schedule: ScheduleSection,
    /// Supervised warm-up before RL.
    pub sft: SftSection,
    /// Checkpointing.
    pub checkpoint: CheckpointSection,
    /// Held-out evaluation.
    pub eval: EvalSection,
    /// Console output.
    pub logging: LoggingSection,
    /// `[async]`: how stale the samples are ([`crate::recipe`]).
    #[serde(rename = "async")]
    pub asynchrony: AsyncSection,
    /// Your own train, eval and warm-up files.
    pub data: DataSection,
    /// `[[reward]]` terms; when given they replace the task's verifier.
    pub reward: Vec<RewardTerm>,
    /// `[[tool]]`s the model may call; when given they make the environment (multi-turn up to
    /// `rollout.max_turns`).
    pub tool: Vec<ToolSpec>,
    /// `[distributed]`: learner ranks, one per device ([`crate::distributed`]).
    pub distributed: DistributedSection,
}

impl Default for Recipe {
    fn default() -> Self {
        Self {
            seed: 0,
            output_dir: "runs/default".into(),
            device: DeviceSpec::Auto,
            model: ModelSection::default(),
            task: TaskSection::default(),
            rollout: RolloutSection::default(),
            algorithm: AlgorithmSection::default(),
            optimizer: OptimizerSection::default(),
            schedule: ScheduleSection::default(),
            sft: SftSection::default(),
            checkpoint: CheckpointSection::default(),
            eval: EvalSection::default(),
            logging: LoggingSection::default(),
            asynchrony: AsyncSection::default(),
            data: DataSection::default(),
            reward: Vec::new(),
            tool: Vec::new(),
            distributed: DistributedSection::default(),
        }
    }
}

/// The policy model.
#[derive(schemars::JsonSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelSection {
    /// HF checkpoint folder or `.gguf` file; empty: a new model from `[model.scratch]`.
    pub path: String,
    /// Architecture of a model trained from scratch (byte-level tokenizer built in).
    pub scratch: ScratchSection,
    /// LoRA adapters (rank 0: full fine-tuning).
    pub lora: LoraSection,
    /// Add a value head and train a critic (PPO with GAE).
    pub critic: bool,
    /// The reference model's device (`cpu`, `ndarray`, `cuda:1`, …; default the learner's):
    /// its weights move there and only its log-probs come back.
    #[schemars(with = "Option<named::DeviceName>")]
    pub reference_device: Option<DeviceSpec>,
    /// The float type the model computes in: `f32`, or `bf16` / `f16` with f32 master weights,
    /// f32 optimiser state and f32 log-probs and losses ([`ModelDtype`]).
    pub dtype: ModelDtype,
}

/// A small Llama-style model trained from scratch.
#[derive(schemars::JsonSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ScratchSection {
    /// Width.
    pub hidden_size: usize,
    /// Decoder layers.
    pub layers: usize,
    /// Attention heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// SwiGLU width (of each expert, with experts).
    pub intermediate_size: usize,
    /// Experts per layer; 0: a dense model (Llama layout). More than 0: a mixture of experts in
    /// the Qwen3-MoE layout (saved as `qwen3_moe`), every layer sparse.
    pub experts: usize,
    /// Experts each token is routed to (top-k, renormalised), with `experts` > 0.
    pub experts_per_token: usize,
}

impl Default for ScratchSection {
    fn default() -> Self {
        Self {
            hidden_size: 64,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            intermediate_size: 128,
            experts: 0,
            experts_per_token: 2,
        }
    }
}

/// LoRA settings (`rank = 0` switches LoRA off).
#[derive(schemars::JsonSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoraSection {
    /// Rank; 0 = off.
    pub rank: usize,
    /// Scale numerator.
    pub alpha: f64,
    /// Projections to adapt.
    pub target_modules: Vec<String>,
}

impl Default for LoraSection {
    fn default() -> Self {
        Self {
            rank: 0,
            alpha: 16.0,
            target_modules: ["q_proj", "k_proj", "v_proj", "o_proj"]
                .map(String::from)
                .to_vec(),
        }
    }
}

/// Where prompts come from.
#[derive(schemars::JsonSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TaskSection {
    /// Built-in task.
    pub name: TaskKind,
    /// 1 to 3.
    pub difficulty: u32,
    /// Operations for `arithmetic`.
    pub ops: Vec<ArithmeticOp>,
    /// Chat-formatted prompts (needs a chat template).
    pub chat: bool,
    /// Removed: give your file as `data.train` with `[[reward]]` terms. Kept so that runs
    /// stored with an empty value still resume; any other value is a recipe error.
    #[doc(hidden)]
    pub dataset: Option<String>,
}

impl Default for TaskSection {
    fn default() -> Self {
        Self {
            name: TaskKind::Arithmetic,
            difficulty: 1,
            ops: vec![ArithmeticOp::Add, ArithmeticOp::Sub, ArithmeticOp::Mul],
            chat: false,
            dataset: None,
        }
    }
}

/// An operation of the `arithmetic` task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ArithmeticOp {
    /// `+`.
    #[serde(rename = "+")]
    Add,
    /// `-`.
    #[serde(rename = "-")]
    Sub,
    /// `*`.
    #[serde(rename = "*")]
    Mul,
}

/// A string, one of the symbols.
impl schemars::JsonSchema for ArithmeticOp {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ArithmeticOp".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({ "type": "string", "enum": ["+", "-", "*"] })
    }
}

impl ArithmeticOp {
    /// Its symbol.
    pub fn symbol(self) -> char {
        match self {
            ArithmeticOp::Add => '+',
            ArithmeticOp::Sub => '-',
            ArithmeticOp::Mul => '*',
        }
    }
}

/// The RL algorithm. (Unknown keys are refused when the recipe loads; the loss tables are a
/// flattened map, which serde's `deny_unknown_fields` does not combine with.)
#[derive(schemars::JsonSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AlgorithmSection {
    /// Loss or preset from the registry (`grpo`, `dr_grpo`, `dapo`, `gspo`, `cispo`, `ctpo`,
    /// `ppo`, ...).
    pub loss: String,
    /// Which actions a ratio covers; unset: the preset's.
    #[serde(with = "named::optional")]
    #[schemars(with = "Option<RatioLevel>")]
    pub ratio_level: Option<RatioLevel>,
    /// Lower clip ε (unset: the preset's).
    pub clip_low: Option<f64>,
    /// Upper clip ε (unset: the preset's).
    pub clip_high: Option<f64>,
    /// How per-token losses become one number; unset: the preset's.
    #[serde(with = "named::optional")]
    #[schemars(with = "Option<LossAggregation>")]
    pub aggregation: Option<LossAggregation>,
    /// Advantage estimator; unset: the preset's (`gae` takes `gamma` and `lam`).
    #[serde(with = "named::optional")]
    #[schemars(with = "Option<named::AdvantageName>")]
    pub advantage: Option<AdvantageEstimator>,
    /// KL coefficient β (0 = no reference model).
    pub kl_coef: f64,
    /// KL estimator.
    #[serde(with = "named::required")]
    #[schemars(with = "KlEstimator")]
    pub kl_estimator: KlEstimator,
    /// `loss` (β·KL in the loss) or `reward` (−β·KL per token in the reward).
    pub kl_placement: KlPlacement,
    /// Entropy bonus α.
    pub entropy_coef: f64,
    /// Policy updates per batch.
    pub ppo_epochs: usize,
    /// Mini-batches per epoch (one optimiser step each).
    pub mini_batches: usize,
    /// Sequences per micro-batch (gradient accumulation inside a mini-batch).
    pub micro_batch_size: usize,
    /// Most tokens (prompt + response) in one micro-batch, besides `micro_batch_size` rows
    /// (0: no token limit). Bounds the learner's activations by a setting, not by the data;
    /// a row longer than the budget goes alone.
    pub micro_batch_tokens: usize,
    /// Response positions whose logits the learner's output head and softmax hold at once
    /// (0: as many as fit in 1 GiB of f32 logits at the model's vocabulary). The gradient is
    /// the same; chunks smaller than a micro-batch cost a second forward pass of the head.
    pub logits_chunk_tokens: usize,
    /// DAPO dynamic sampling: drop groups whose rewards are all equal and sample more.
    pub dynamic_sampling: bool,
    /// Most generation rounds per step when dynamic sampling refills the batch.
    pub max_gen_batches: usize,
    /// DAPO overlong shaping: ramp length before `rollout.max_new_tokens` (0 = off).
    pub overlong_cache_len: usize,
    /// DAPO overlong penalty at the limit.
    pub overlong_factor: f64,
    /// DAPO overlong filtering: truncated responses get no gradient.
    pub overlong_filter: bool,
    /// GAE γ (PPO with a critic).
    pub gamma: f64,
    /// GAE λ.
    pub lam: f64,
    /// Value-loss coefficient.
    pub value_coef: f64,
    /// Value clip range.
    pub value_clip: f64,
    /// What a cumulative-ratio loss (CTPO) measures its ratio against: `proximal` (π_old) or
    /// `behaviour` (μ).
    pub ratio_reference: RatioReference,
    /// Adaptive KL controller: the target KL (with `kl_horizon`; `kl_coef` is β's start).
    pub kl_target: Option<f64>,
    /// Adaptive KL controller: samples over which β may change by ±20 %.
    pub kl_horizon: Option<f64>,
    /// `[algorithm.correction]`: the ratio's anchor and the off-policy correction.
    pub correction: CorrectionSection,
    /// `off`, or `replay`: the sampler records each token's kept set under top-k / min-p /
    /// top-p, and the learner takes every log-prob (π_θ, π_old, π_ref) and entropy over that
    /// set of its own logits, so μ and the learner's π are one distribution.
    pub sampling_mask: SamplingMask,
    /// With `sampling_mask = "replay"`: the coefficient of a penalty on the probability mass
    /// the policy puts outside each sampled token's kept set, `−log Σ_{kept} π_θ` aggregated
    /// as the policy loss is (0: none). The loss over the kept sets does not move that mass;
    /// against a stale sampler it is what greedy decoding finds (`rollout/mass_outside_kept`).
    pub outside_mass_coef: f64,
    /// Mixtures of experts only: the learner's π_old and update passes route every token to
    /// the experts the sampler recorded for it, weighted by the current router (rollout routing
    /// replay, R3). `moe/routing_mismatch` and `moe/router_drift` are reported either way.
    pub router_replay: bool,
    /// Mixtures of experts: the coefficient of transformers' load-balancing loss
    /// (`load_balancing_loss_func`, `router_aux_loss_coef` there) added to the policy loss;
    /// 0: none. `moe/aux_loss` reports it.
    pub moe_aux_coef: f64,
    /// TRL's bias-corrected KL: each token's reference KL is multiplied by the importance
    /// ratio (not detached).
    pub kl_bias_correction: bool,
    /// TRL's top-entropy masking: only tokens whose entropy is at least the `1 − ρ` quantile of
    /// the micro-batch's get policy loss (1 keeps all; unset: off).
    pub top_entropy_quantile: Option<f64>,
    /// The settings tables of losses, `[algorithm.<section>]` (`[algorithm.vespo]`,
    /// `[algorithm.prime_rl]`, a downstream loss's own), by section. Each is read and checked
    /// through the loss registry ([`crate::recipe::Recipe::load_with`]); only the run's loss's
    /// table may be set.
    #[serde(flatten)]
    #[schemars(skip)]
    pub settings: std::collections::BTreeMap<String, serde_json::Value>,
}

impl Default for AlgorithmSection {
    fn default() -> Self {
        Self {
            loss: "grpo".into(),
            ratio_level: None,
            clip_low: None,
            clip_high: None,
            aggregation: None,
            advantage: None,
            kl_coef: 0.0,
            kl_estimator: KlEstimator::K3,
            kl_placement: KlPlacement::Loss,
            entropy_coef: 0.0,
            ppo_epochs: 1,
            mini_batches: 1,
            micro_batch_size: 64,
            micro_batch_tokens: 0,
            logits_chunk_tokens: 0,
            sampling_mask: SamplingMask::Off,
            outside_mass_coef: 0.0,
            router_replay: false,
            moe_aux_coef: 0.0,
            dynamic_sampling: false,
            max_gen_batches: 3,
            overlong_cache_len: 0,
            overlong_factor: 1.0,
            overlong_filter: false,
            gamma: 1.0,
            lam: 0.95,
            value_coef: 0.5,
            value_clip: 0.2,
            ratio_reference: RatioReference::Proximal,
            kl_target: None,
            kl_horizon: None,
            correction: CorrectionSection::default(),
            kl_bias_correction: false,
            top_entropy_quantile: None,
            settings: std::collections::BTreeMap::new(),
        }
    }
}

/// AdamW.
#[derive(schemars::JsonSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OptimizerSection {
    /// Peak learning rate.
    pub lr: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
    /// Adam β1.
    pub beta1: f64,
    /// Adam β2.
    pub beta2: f64,
    /// Adam ε.
    pub eps: f64,
    /// Gradient-norm clip (0 = off).
    pub grad_clip: f64,
}

impl Default for OptimizerSection {
    fn default() -> Self {
        Self {
            lr: 1e-6,
            weight_decay: 0.0,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            grad_clip: 1.0,
        }
    }
}

/// Steps and LR schedule.
#[derive(schemars::JsonSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ScheduleSection {
    /// RL steps.
    pub steps: usize,
    /// After `warmup_steps` of linear ramp: `constant` (`linear_warmup` is the same), `linear`
    /// (down to `min_lr_ratio` of the peak at `steps`, TRL's default) or `cosine` (verl's).
    pub kind: ScheduleKind,
    /// Warm-up steps.
    pub warmup_steps: usize,
    /// Floor of `linear` and `cosine` as a fraction of the peak.
    pub min_lr_ratio: f64,
}

/// The learning-rate curve after the warm-up ramp.
#[derive(
    schemars::JsonSchema, Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum ScheduleKind {
    /// Hold the peak.
    #[default]
    Constant,
    /// The same as `constant` (the name TRL users know).
    LinearWarmup,
    /// Linear decay to `min_lr_ratio` of the peak at the last step.
    Linear,
    /// Cosine decay to `min_lr_ratio` of the peak at the last step.
    Cosine,
}

/// Where the reference-model KL penalty goes.
#[derive(
    schemars::JsonSchema, Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum KlPlacement {
    /// A loss term `β·KL` (GRPO).
    #[default]
    Loss,
    /// Subtracted from the per-token reward before the advantages (PPO/RLHF).
    Reward,
}

impl Default for ScheduleSection {
    fn default() -> Self {
        Self {
            steps: 100,
            kind: ScheduleKind::Constant,
            warmup_steps: 0,
            min_lr_ratio: 0.0,
        }
    }
}

/// Supervised warm-up on the task's reference completions.
#[derive(schemars::JsonSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SftSection {
    /// Steps (0 = none).
    pub steps: usize,
    /// Examples per step.
    pub batch_size: usize,
    /// Learning rate.
    pub lr: f64,
    /// AdamW weight decay during the warm-up.
    pub weight_decay: f64,
    /// Fraction of the demonstrations whose answer is one too high (`arithmetic` only): a weak
    /// teacher, so the warm-up teaches the answer format and roughly where the answer lies, and
    /// RL has to make the answers exact. 0 (the default) demonstrates correct answers only.
    pub teacher_error: f64,
    /// Learning-rate schedule after the warm-up's first tenth (a linear ramp), as
    /// `schedule.kind`: `constant`, `linear` or `cosine` (both down to `lr * min_lr_ratio` at the
    /// last step). A decaying rate ends the warm-up on a settled model rather than on one noisy
    /// step of a constant rate.
    pub schedule: ScheduleKind,
    /// Floor of `linear` and `cosine` as a fraction of `lr`.
    pub min_lr_ratio: f64,
    /// Global L2 norm the warm-up's gradients are clipped to (0: no clipping).
    pub grad_clip: f64,
    /// Longest demonstration in tokens (prompt, completion and EOS); unset: the model's context
    /// length, which it may not exceed. Longer `data.sft` rows are skipped without being
    /// tokenised in full and counted in `sft/skipped`.
    pub max_len: Option<usize>,
}

impl SftSection {
    /// The warm-up's learning-rate schedule.
    pub fn lr_schedule(&self) -> ScheduleSection {
        ScheduleSection {
            steps: self.steps,
            kind: self.schedule,
            warmup_steps: (self.steps / 10).max(1),
            min_lr_ratio: self.min_lr_ratio,
        }
    }
}

impl Default for SftSection {
    fn default() -> Self {
        Self {
            steps: 0,
            batch_size: 32,
            lr: 1e-3,
            weight_decay: 0.0,
            teacher_error: 0.0,
            schedule: ScheduleKind::Constant,
            min_lr_ratio: 0.0,
            grad_clip: 1.0,
            max_len: None,
        }
    }
}

/// `checkpoint.every` when a recipe does not set it.
pub const DEFAULT_CHECKPOINT_EVERY: usize = 25;

/// Checkpointing.
#[derive(schemars::JsonSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CheckpointSection {
    /// Save every N steps — RL steps, and SFT warm-up steps during the warm-up (0: only at the
    /// end of the warm-up and of the run, and on Ctrl-C).
    pub every: usize,
    /// Checkpoints kept.
    pub keep: usize,
    /// Export the final policy as an HF checkpoint to `output_dir/final`.
    pub export_final: bool,
}

impl Default for CheckpointSection {
    fn default() -> Self {
        Self {
            every: DEFAULT_CHECKPOINT_EVERY,
            keep: 2,
            export_final: true,
        }
    }
}

/// Held-out evaluation.
#[derive(schemars::JsonSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EvalSection {
    /// Evaluate every N RL steps (0: only at step 0 and the end).
    pub every: usize,
    /// Held-out problems drawn from the task's test split; with `data.eval` every problem of
    /// that file is evaluated and this is not read.
    pub size: usize,
    /// Samples per problem for `eval/pass@<k>` and `eval/mean@<k>` (temperature sampling).
    pub k: usize,
}

impl Default for EvalSection {
    fn default() -> Self {
        Self {
            every: 0,
            size: 64,
            k: 4,
        }
    }
}

/// Console output.
#[derive(schemars::JsonSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoggingSection {
    /// Show the progress bar.
    pub progress: bool,
    /// Also write TensorBoard event files to `output_dir/tensorboard/`.
    pub tensorboard: bool,
}

impl Default for LoggingSection {
    fn default() -> Self {
        Self {
            progress: true,
            tensorboard: false,
        }
    }
}
