//! Where and how the policy learns ([`Learner`]): devices, ranks, compute pools, the resolved
//! algorithm, the optimisers, and how rows are packed for it.

use crate::algorithm::ResolvedAlgorithm;
use crate::batch::{Packing, Row};
use crate::chunked::{LOGITS_CHUNK_BYTES, chunk_for_budget};
use crate::distributed::RankPools;
use crate::distributed::group::ProcessGroup;
use crate::optim::adamw;
use crate::recipe::Recipe;
use crate::{Result, TrainError};
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
    /// Under `[distributed] backend = "mpi"`: the learner's process ranks.
    pub(crate) group: Option<Arc<dyn ProcessGroup>>,
    /// The process ranks hold rank 0's weights and optimiser state (sent before the first
    /// update).
    pub(crate) ranks_started: bool,
    /// `distributed.shard_optimizer`: each process rank holds its share of the state.
    pub(crate) shard_optimizer: bool,
}

/// Where a learner computes: the first rank's plain device, the other thread ranks' (autodiff)
/// devices, and the compute pools.
pub(crate) struct Placement {
    pub(crate) plain: Device,
    pub(crate) ranks: Vec<Device>,
    pub(crate) pool: Option<Arc<rayon::ThreadPool>>,
    pub(crate) rank_pools: Option<RankPools>,
}

impl Placement {
    /// Where `recipe`'s learner computes. Thread ranks: the first of `[distributed] devices`
    /// (else `device`), the others', the learner's pool (`async.learner_threads`) and each
    /// rank's (`distributed.threads_per_rank`, else the shared threads split evenly). A process
    /// rank of `group`: its local rank's entry of `devices` (else `device`) and a pool of
    /// `threads_per_rank` threads (else `async.learner_threads`, else the machine's divided among
    /// the ranks on it).
    ///
    /// # Errors
    /// A device that is not there; more process ranks on a machine than `devices` lists.
    pub(crate) fn new(recipe: &Recipe, group: Option<&dyn ProcessGroup>) -> Result<Self> {
        let d = &recipe.distributed;
        let pool = |n: usize| {
            crate::compute_pool(n.max(1), |k| format!("rlft-learner-{k}"))
                .map(Arc::new)
                .map_err(|e| TrainError::Usage(format!("learner compute threads: {e}")))
        };
        if let Some(group) = group {
            let (local, on_machine) = group.local();
            let spec = match d.devices.get(local) {
                Some(spec) => *spec,
                None if d.devices.is_empty() => recipe.device,
                None => {
                    return Err(TrainError::Usage(format!(
                        "distributed.devices lists {} devices but this machine runs {on_machine}                          ranks (this is local rank {local}): list one device per rank on a                          machine, or start fewer ranks per machine",
                        d.devices.len()
                    )));
                }
            };
            // As for thread ranks: the learner's threads shared among the ranks on the machine,
            // the rank's share of each update computed in a pool of its own.
            let shared = recipe
                .asynchrony
                .learner_threads
                .unwrap_or_else(rayon::current_num_threads);
            let threads = d.threads_per_rank.unwrap_or(shared / on_machine.max(1));
            let rank_pool = RankPools::new(1, threads.max(1))
                .map_err(|e| TrainError::Usage(format!("learner rank threads: {e}")))?;
            return Ok(Self {
                plain: spec.device()?,
                ranks: Vec::new(),
                pool: recipe.asynchrony.learner_threads.map(pool).transpose()?,
                rank_pools: Some(rank_pool),
            });
        }
        let learner_pool = recipe.asynchrony.learner_threads.map(pool).transpose()?;
        let rank_pools = match d.ranks() {
            1 => None,
            n => {
                let shared = recipe
                    .asynchrony
                    .learner_threads
                    .unwrap_or_else(rayon::current_num_threads);
                let threads = d.threads_per_rank.unwrap_or((shared / n).max(1));
                let pools = RankPools::new(n, threads)
                    .map_err(|e| TrainError::Usage(format!("learner rank threads: {e}")))?;
                Some(pools)
            }
        };
        let ranks = d
            .devices
            .iter()
            .skip(1)
            .map(|d| d.device().map(|d| d.autodiff()))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(Self {
            plain: d.run_device(recipe.device).device()?,
            ranks,
            pool: learner_pool,
            rank_pools,
        })
    }
}

impl Learner {
    /// The learner `recipe` describes, at `place`, training with `algo`; `pad_id` pads its
    /// batches and `vocab` sizes the output head's chunks.
    pub(crate) fn new(
        recipe: &Recipe,
        algo: ResolvedAlgorithm,
        place: Placement,
        pad_id: i64,
        vocab: usize,
    ) -> Self {
        let a = &recipe.algorithm;
        Self {
            device: place.plain.clone().autodiff(),
            plain: place.plain,
            ranks: place.ranks,
            pool: place.pool,
            rank_pools: place.rank_pools,
            algo,
            loss_seed: recipe.seed,
            optim: adamw(&recipe.optimizer),
            critic_optim: recipe.model.critic.then(|| adamw(&recipe.optimizer)),
            sft_optim: None,
            packing: Packing {
                pad_id,
                micro_batch_size: a.micro_batch_size,
                micro_batch_tokens: a.micro_batch_tokens,
                router_replay: a.router_replay,
                moe_aux_coef: a.moe_aux_coef,
            },
            logits_chunk: logits_chunk(a.logits_chunk_tokens, vocab),
            group: None,
            ranks_started: false,
            shard_optimizer: recipe.distributed.shard_optimizer,
        }
    }

    /// The process ranks the optimiser state is sharded across (`distributed.shard_optimizer`),
    /// once they hold rank 0's state.
    pub(crate) fn optimizer_shards(&self) -> Option<Arc<dyn ProcessGroup>> {
        self.group
            .clone()
            .filter(|_| self.shard_optimizer && self.ranks_started)
    }

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
