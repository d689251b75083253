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
/// devices, the compute pools, and the process ranks it is one of.
pub(crate) struct Placement {
    pub(crate) plain: Device,
    pub(crate) ranks: Vec<Device>,
    pub(crate) pool: Option<Arc<rayon::ThreadPool>>,
    pub(crate) rank_pools: Option<RankPools>,
    pub(crate) group: Option<Arc<dyn ProcessGroup>>,
}

impl Placement {
    /// Where `recipe`'s learner computes. Thread ranks: the first of `[distributed] devices`
    /// (else `device`) and the others'. A process rank of `group`: its local rank's entry of
    /// `devices` (else `device`). Either way the learner's pool (`async.learner_threads`), and
    /// each rank's own pool of `distributed.threads_per_rank` threads (else the learner's
    /// threads, `async.learner_threads` or the machine's, divided among the ranks on the
    /// machine, at least one each).
    ///
    /// # Errors
    /// A device that is not there; more process ranks on a machine than `devices` lists.
    pub(crate) fn new(recipe: &Recipe, group: Option<Arc<dyn ProcessGroup>>) -> Result<Self> {
        let d = &recipe.distributed;
        let learner_threads = recipe.asynchrony.learner_threads;
        let pool = learner_threads
            .map(|n| crate::compute_pool(n, |k| format!("rlft-learner-{k}")).map(Arc::new))
            .transpose()
            .map_err(|e| TrainError::Usage(format!("learner compute threads: {e}")))?;
        // Each rank's pool: its share of the learner's threads on the machine.
        let rank_pools = |ranks: usize, on_machine: usize| {
            let shared = learner_threads.unwrap_or_else(rayon::current_num_threads);
            let threads = d.threads_per_rank.unwrap_or((shared / on_machine).max(1));
            RankPools::new(ranks, threads)
                .map_err(|e| TrainError::Usage(format!("learner rank threads: {e}")))
        };
        let Some(group) = group else {
            let rank_pools = match d.ranks() {
                1 => None,
                n => Some(rank_pools(n, n)?),
            };
            let ranks = d
                .devices
                .iter()
                .skip(1)
                .map(|d| d.device().map(|d| d.autodiff()))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            return Ok(Self {
                plain: d.run_device(recipe.device).device()?,
                ranks,
                pool,
                rank_pools,
                group: None,
            });
        };
        let (local, on_machine) = group.local();
        let spec = match d.devices.get(local) {
            Some(spec) => *spec,
            None if d.devices.is_empty() => recipe.device,
            None => {
                return Err(TrainError::Usage(format!(
                    "distributed.devices lists {} devices but this machine runs {on_machine} \
                     ranks (this is local rank {local}): list one device per rank on a \
                     machine, or start fewer ranks per machine",
                    d.devices.len()
                )));
            }
        };
        // The rank's share of each update is computed in a pool of its own, as a thread
        // rank's is.
        Ok(Self {
            plain: spec.device()?,
            ranks: Vec::new(),
            pool,
            rank_pools: Some(rank_pools(1, on_machine.max(1))?),
            group: Some(group),
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
            group: place.group,
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
