//! # rlft-algo
//!
//! The tensor math of policy-gradient RL fine-tuning, proven equal to verl 0.9.1 on the golden
//! cases in `tests/golden`: log-probs and entropy, importance ratios at token, sequence and
//! cumulative level, the clipping families, a registry of policy losses, loss aggregation with
//! global normalisation, advantage estimators, KL estimators, the clipped value loss, reward
//! shaping and staleness diagnostics.
//!
//! Every function takes `[batch, T]` tensors plus a response mask (`1.0` for tokens that are
//! trained on, `0.0` for padding and tool observations) and runs on any burn [`Device`], in f32
//! or f64, with or without autodiff. Nothing here does I/O or knows about models.
//!
//! Notation follows the stale-samples lecture (docs/stale-samples.md, "The lecture"): `ρ` is an
//! importance ratio, `μ` the behaviour policy that sampled the tokens, `πθ` the policy being
//! trained, `A` an advantage.
//!
//! [`Device`]: burn::tensor::Device

#![warn(missing_docs)]

pub mod advantage;
pub mod aggregation;
pub mod clip;
pub mod correction;
pub mod decoupled;
pub mod diagnostics;
pub mod entropy;
mod error;
pub mod filters;
pub mod fused;
pub mod kl;
pub mod logprob;
pub mod loss;
pub mod masked;
pub mod mis;
pub mod ratio;
pub mod seed;
pub mod shaping;
#[cfg(test)]
mod testing;
pub mod value;

pub use advantage::{AdvantageEstimator, AdvantageInput, AdvantageOutput};
pub use aggregation::{GlobalBatchInfo, LossAggregation, aggregate_loss};
pub use clip::{ClipRange, CtpoBounds};
pub use entropy::{entropy_bonus, entropy_from_logits, entropy_over_kept};
pub use error::{AlgoError, Result};
pub use kl::{AdaptiveKlController, KlEstimator, kl_penalty};
pub use logprob::{kept_log_mass, kept_log_softmax, logprobs_from_logits, logprobs_over_kept};
pub use loss::{
    LossRegistry, PolicyLoss, PolicyLossConfig, PolicyLossInput, PolicyLossMetrics,
    PolicyLossOutput, Preset,
};
pub use ratio::RatioLevel;
