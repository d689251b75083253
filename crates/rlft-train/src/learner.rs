//! Where and how the policy learns ([`Learner`]): devices, ranks, compute pools, the resolved
//! algorithm, the optimisers, and how rows are packed for it.

use crate::algorithm::ResolvedAlgorithm;
use crate::batch::{Packing, Row};
use crate::chunked::{LOGITS_CHUNK_BYTES, chunk_for_budget};
use crate::distributed::RankPools;
use burn::optim::ModuleOptimizer;
use burn::tensor::Device;
use rlft_rollout::LearnerBatch;
use std::sync::Arc;

/// Where and how the policy learns: devices, ranks, compute pool, the resolved algorithm with
/// the loss registry it came from, the optimisers, and the packing of its batches.
pub(crate) struct Learner {
    /// The first rank's device, with autodiff.
    pub(crate) device: Device,
    /// The same device without autodiff (frozen passes).
    pub(crate) plain: Device,
    /// `[distributed] devices` past the first (autodiff devices): the learner's other ranks.
    pub(crate) ranks: Vec<Device>,
    /// `async.learner_threads`: the learner's compute pool.
    pub(crate) pool: Option<Arc<rayon::ThreadPool>>,
    /// With several ranks: each rank's own pool (`distributed.threads_per_rank`).
    pub(crate) rank_pools: Option<RankPools>,
    /// `[algorithm]`, resolved against `registry`.
    pub(crate) algo: ResolvedAlgorithm,
    /// Seed of the loss's host RNG this step (Clip-Cov's draws).
    pub(crate) loss_seed: u64,
    /// The policy's AdamW.
    pub(crate) optim: ModuleOptimizer,
    /// The critic's AdamW.
    pub(crate) critic_optim: Option<ModuleOptimizer>,
    /// The warm-up's optimiser, while the warm-up runs.
    pub(crate) sft_optim: Option<ModuleOptimizer>,
    /// How rows are packed and cut into micro-batches.
    pub(crate) packing: Packing,
    /// Response positions per chunk of the output head and softmax.
    pub(crate) logits_chunk: usize,
}

impl Learner {
    /// `rows` packed on the first rank's device.
    pub(crate) fn pack(&self, rows: &[&Row]) -> LearnerBatch {
        self.packing.pack(rows, &self.device)
    }
}

/// Response positions per chunk of the output head and softmax: `tokens`
/// (`algorithm.logits_chunk_tokens`), or with 0 a budget of [`LOGITS_CHUNK_BYTES`] of f32
/// logits at `vocab`.
pub(crate) fn logits_chunk(tokens: usize, vocab: usize) -> usize {
    match tokens {
        0 => chunk_for_budget(vocab, LOGITS_CHUNK_BYTES),
        n => n,
    }
}
