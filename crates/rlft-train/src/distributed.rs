//! The data-parallel learner. `[distributed] devices` lists one learner rank per device, as
//! threads of one process (`backend = "threads"`); with `backend = "mpi"` every rank is a
//! process of its own, launched by `mpirun` or `srun` ([`group`], [`crate::follower`], and the
//! `mpi` cargo feature's `mpi` module). Each optimiser step shards the mini-batch's rows over the ranks,
//! every rank computes the gradient of its rows on a replica of the policy ([`Module::fork`]
//! onto its device, or its process's own copy) with its loss normalised by the whole mini-batch
//! ([`GlobalBatchInfo`]: the global token and sequence counts), and the ranks' gradients are
//! summed ([`sum_gradients`]): the sum is the gradient of the whole mini-batch for every loss
//! aggregation.
//!
//! verl instead multiplies each rank's loss by `dp_size` and averages (an all-reduce mean); that
//! is the same in exact arithmetic, but for a rank count that is not a power of two the
//! multiply-then-divide rounds, and Adam's first step (≈ lr · g / |g|) turns that rounding on
//! near-zero gradients into parameter differences: 3 ranks differed from 1 by up to 2.9e-5
//! after one step (lr 1e-3) that way, by 1.6e-6 with the sum (`tests/data_parallel.rs`). So
//! `GlobalBatchInfo::dp_size` stays 1 here.
//!
//! With thread ranks the first rank's device holds the policy, the optimiser and the sum; every
//! other rank computes on its own fork of the step's weights ([`Module::fork`]), on its device
//! or on the first rank's, so that no two ranks share an autodiff graph. The ranks run at once,
//! each on its own thread with its own compute pool of `distributed.threads_per_rank` threads
//! (`RankPools`), and the sum is taken in rank order on the first rank's device (through the
//! host for CPU backends): it is bit for bit the sum of the same ranks run one after another.
//! Process ranks gather every rank's gradients and take the same sum in the same order, each
//! on its own copy of the policy, then each applies the optimiser step itself: the weights are
//! those of the thread ranks, bit for bit. burn's collective `all_reduce` over NCCL is not
//! used (`docs/backends.md`).
//!
//! [`GlobalBatchInfo`]: rlft_algo::aggregation::GlobalBatchInfo

pub mod group;
#[cfg(feature = "mpi")]
pub mod mpi;
pub mod shard;

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::{Device, Tensor};
use serde::{Deserialize, Serialize};

/// How the learner's ranks run.
#[derive(
    schemars::JsonSchema, Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum DistributedBackend {
    /// Threads of one process, one per `distributed.devices` entry.
    #[default]
    Threads,
    /// One process per rank, launched by `mpirun -np N`, `srun` or an MPIJob (the `mpi` cargo
    /// feature).
    Mpi,
}

/// `[distributed]`: data parallelism of the learner.
#[derive(schemars::JsonSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DistributedSection {
    /// `"threads"` (ranks are threads of this process, one per `devices` entry) or `"mpi"`
    /// (every process `mpirun` starts is one rank; needs the `mpi` cargo feature).
    pub backend: DistributedBackend,
    /// One learner rank per device, e.g. `["cuda:0", "cuda:1"]` or `["flex", "flex"]` (empty:
    /// one rank on the recipe's `device`). The top-level `device` must then be unset (`auto`)
    /// or the first of them. Under `mpi`, indexed by the rank's local rank on its machine (empty:
    /// `device` for every rank).
    #[schemars(with = "Vec<String>")]
    pub devices: Vec<rlft_model::device::DeviceSpec>,
    /// Compute threads of each rank's own pool (unset: the learner's threads, as
    /// `async.learner_threads` or the machine's, divided among the ranks on the machine, at
    /// least one each).
    pub threads_per_rank: Option<usize>,
    /// Under `mpi`: every this many RL steps the ranks compare a digest of their weights, and
    /// a difference stops the run naming the ranks (0: never).
    pub check_every: usize,
    /// Under `mpi`: each rank holds the AdamW state of about 1/N of the parameters (whole
    /// tensors), steps those and gathers the others' (ZeRO-1); the weights are the unsharded
    /// run's bit for bit, and checkpoints hold the whole state as without it.
    pub shard_optimizer: bool,
    /// Under `mpi`: a rank that sends no heartbeat for this many seconds (dead, stopped, hung,
    /// unreachable) stops every rank, with an error naming it (exit status 5).
    pub timeout_s: f64,
}

impl Default for DistributedSection {
    fn default() -> Self {
        Self {
            backend: DistributedBackend::Threads,
            devices: Vec::new(),
            threads_per_rank: None,
            shard_optimizer: false,
            check_every: 50,
            timeout_s: 300.0,
        }
    }
}

impl DistributedSection {
    /// The run's device: the first rank's, else the recipe's `device`.
    pub fn run_device(
        &self,
        device: rlft_model::device::DeviceSpec,
    ) -> rlft_model::device::DeviceSpec {
        self.devices.first().copied().unwrap_or(device)
    }

    /// Number of learner thread ranks in this process (1 without `devices`, and under `mpi`,
    /// where each process is one rank).
    pub fn ranks(&self) -> usize {
        match self.backend {
            DistributedBackend::Threads => self.devices.len().max(1),
            DistributedBackend::Mpi => 1,
        }
    }

    /// Checks the devices against the recipe's top-level `device`; on error returns the key and
    /// what to change.
    pub(crate) fn check(
        &self,
        device: rlft_model::device::DeviceSpec,
    ) -> std::result::Result<(), (&'static str, String)> {
        if let Some(t) = self.threads_per_rank {
            if !(1..=1024).contains(&t) {
                return Err((
                    "distributed.threads_per_rank",
                    format!("is {t}; give each rank between 1 and 1024 threads"),
                ));
            }
            if self.backend == DistributedBackend::Threads && self.devices.len() < 2 {
                return Err((
                    "distributed.threads_per_rank",
                    "applies to several learner ranks: list two or more distributed.devices, \
                     or use async.learner_threads for one rank"
                        .into(),
                ));
            }
        }
        if self.shard_optimizer && self.backend != DistributedBackend::Mpi {
            return Err((
                "distributed.shard_optimizer",
                "shards the optimizer state across process ranks: set distributed.backend = \
                 \"mpi\" (thread ranks share one optimizer)"
                    .into(),
            ));
        }
        if !(0.1..=604_800.0).contains(&self.timeout_s) {
            return Err((
                "distributed.timeout_s",
                format!(
                    "is {}; give a rank between 0.1 s and a week to answer",
                    self.timeout_s
                ),
            ));
        }
        let Some(&first) = self.devices.first() else {
            return Ok(());
        };
        for d in &self.devices {
            if let Err(e) = d.device() {
                return Err(("distributed.devices", format!("'{d}': {e}")));
            }
        }
        if !(device.is_auto() || device == first) {
            return Err((
                "device",
                format!(
                    "is '{device}' but distributed.devices starts with '{first}': the learner's \
                     first rank is the run's device; remove `device` or set it to '{first}'"
                ),
            ));
        }
        Ok(())
    }
}

/// One compute pool per learner rank, each rank's work running on a thread of its own.
#[derive(Debug)]
pub(crate) struct RankPools {
    pools: Vec<rayon::ThreadPool>,
}

impl RankPools {
    /// `ranks` pools of `threads` threads each.
    pub(crate) fn new(
        ranks: usize,
        threads: usize,
    ) -> std::result::Result<Self, rayon::ThreadPoolBuildError> {
        let pools = (0..ranks)
            .map(|r| crate::compute_pool(threads.max(1), move |k| format!("rlft-rank{r}-{k}")))
            .collect::<std::result::Result<_, _>>()?;
        Ok(Self { pools })
    }

    /// Threads of each rank's pool.
    #[cfg(test)]
    pub(crate) fn threads(&self) -> usize {
        self.pools
            .first()
            .map_or(0, rayon::ThreadPool::current_num_threads)
    }

    /// Runs each `(rank, job)` in that rank's pool, all at once, each on a thread of its own;
    /// the results in the jobs' order. A job that panics panics here, after the others end.
    pub(crate) fn run<R: Send, F: FnOnce() -> R + Send>(&self, jobs: Vec<(usize, F)>) -> Vec<R> {
        std::thread::scope(|s| {
            let running: Vec<_> = jobs
                .into_iter()
                .map(|(rank, job)| {
                    let pool = &self.pools[rank % self.pools.len()];
                    s.spawn(move || pool.install(job))
                })
                .collect();
            running
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        })
    }

    /// As [`RankPools::run`], one job after another: what `run` must equal bit for bit.
    #[cfg(test)]
    pub(crate) fn run_in_turn<R: Send, F: FnOnce() -> R + Send>(
        &self,
        jobs: Vec<(usize, F)>,
    ) -> Vec<R> {
        jobs.into_iter()
            .map(|(rank, job)| self.pools[rank % self.pools.len()].install(job))
            .collect()
    }
}

/// `items` split into `ranks` contiguous shards whose sizes differ by at most one (the first
/// shards take the extra items); with fewer items than ranks the last shards are empty.
pub fn shard<T>(items: &[T], ranks: usize) -> Vec<&[T]> {
    let ranks = ranks.max(1);
    let (base, extra) = (items.len() / ranks, items.len() % ranks);
    let mut out = Vec::with_capacity(ranks);
    let mut start = 0;
    for r in 0..ranks {
        let len = base + usize::from(r < extra);
        out.push(&items[start..start + len]);
        start += len;
    }
    out
}

/// The sum over ranks of each of `module`'s parameters' gradients, on `device`: the ranks'
/// gradients are moved there and added in rank order, so the result does not depend on timing.
/// A rank without a gradient for a parameter (no rows, or a parameter its rows did not reach)
/// adds nothing. One rank's gradients are returned as they are.
pub fn sum_gradients<M: Module>(
    module: &M,
    mut ranks: Vec<GradientsParams>,
    device: &Device,
) -> GradientsParams {
    if ranks.len() <= 1 {
        return ranks.pop().unwrap_or_default();
    }
    struct Sum<'a> {
        ranks: Vec<GradientsParams>,
        device: &'a Device,
        out: GradientsParams,
    }
    impl ModuleVisitor for Sum<'_> {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            let sum = self
                .ranks
                .iter_mut()
                .filter_map(|g| g.remove::<D>(p.id))
                .map(|g| g.to_device(self.device))
                .reduce(|a, b| a + b);
            if let Some(sum) = sum {
                self.out.register::<D>(p.id, sum);
            }
        }
    }
    let mut sum = Sum {
        ranks,
        device,
        out: GradientsParams::new(),
    };
    module.visit(&mut sum);
    sum.out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_are_contiguous_and_balanced() {
        let items: Vec<usize> = (0..7).collect();
        let s = shard(&items, 3);
        assert_eq!(s, vec![&[0, 1, 2][..], &[3, 4], &[5, 6]]);
        assert_eq!(shard(&items, 1), vec![&items[..]]);
        let few = shard(&items[..2], 3);
        assert_eq!(few, vec![&[0][..], &[1], &[]]);
    }

    /// A module of two parameters (also the fixture of `group`'s tests).
    #[derive(Module, Debug)]
    pub(crate) struct Two {
        pub(crate) a: Param<Tensor<2>>,
        pub(crate) b: Param<Tensor<1>>,
    }

    /// Ranks on their own threads and forks give the sum of the same ranks run in turn, bit for
    /// bit, through products large enough to be split across each pool's threads.
    #[test]
    fn concurrent_ranks_sum_to_the_sequential_sum() {
        use burn::tensor::Distribution;
        let device = Device::flex().autodiff();
        let m = Two {
            a: Param::from_tensor(Tensor::random([96, 80], Distribution::Default, &device)),
            b: Param::from_tensor(Tensor::random([80], Distribution::Default, &device)),
        };
        let x: Vec<Tensor<2>> = (0..3)
            .map(|k| Tensor::random([40 + 8 * k, 96], Distribution::Default, &device))
            .collect();
        let pools = RankPools::new(3, 2).expect("pools");
        assert_eq!(pools.threads(), 2);
        let jobs = || {
            x.iter()
                .enumerate()
                .map(|(k, x)| {
                    let fork = m.clone().fork(&device);
                    (k, move || {
                        let h = x.clone().matmul(fork.a.val()) + fork.b.val().unsqueeze();
                        let loss = h.clone().mul(h.tanh()).sum();
                        GradientsParams::from_grads(loss.backward(), &fork)
                    })
                })
                .collect::<Vec<_>>()
        };
        let host = |g: GradientsParams| {
            let g = sum_gradients(&m, vec![g], &device);
            let a = g.get::<2>(m.a.id).expect("a").into_data();
            a.try_to_vec::<f32>().expect("f32")
        };
        let at_once = sum_gradients(&m, pools.run(jobs()), &device);
        let in_turn = sum_gradients(&m, pools.run_in_turn(jobs()), &device);
        assert_eq!(host(at_once), host(in_turn));
    }

    /// A rank without a gradient for a parameter adds nothing to it.
    #[test]
    fn gradients_are_summed_over_every_rank() {
        let device = Device::flex().autodiff();
        let m = Two {
            a: Param::from_tensor(Tensor::from_floats([[1.0, 2.0]], &device)),
            b: Param::from_tensor(Tensor::from_floats([3.0], &device)),
        };
        // Rank k's loss: (k + 1) · Σ a  (+ Σ b on rank 0 only).
        let grads = |k: usize| {
            let mut loss = m.a.val().sum().mul_scalar(k as f64 + 1.0);
            if k == 0 {
                loss = loss + m.b.val().sum();
            }
            GradientsParams::from_grads(loss.backward(), &m)
        };
        let g = sum_gradients(&m, (0..3).map(grads).collect(), &device);
        let host = |t: Tensor<1>| t.into_data().try_into_vec::<f32>().unwrap();
        let a = g.get::<2>(m.a.id).expect("a").reshape([2]);
        assert_eq!(host(a), vec![6.0, 6.0]);
        assert_eq!(host(g.get::<1>(m.b.id).expect("b")), vec![1.0]);
    }
}
