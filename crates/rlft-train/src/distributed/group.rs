//! Learner ranks as processes: the process group they form ([`ProcessGroup`]: MPI's world under
//! the `mpi` feature, or [`LocalGroup`]'s threads standing in for processes), what crosses it
//! (rank 0's commands, each rank's gradients and metric sums) and the weight digest that
//! turns a silent divergence into an error.
//!
//! Everything that crosses is MessagePack ([`rmp_serde`]); tensors go as burn's [`TensorData`]
//! (their bytes, shape and dtype), so a gradient arrives bit for bit as it left.

use crate::batch::Row;
use crate::offpolicy::StepDiagnostics;
use crate::{Result, TrainError};
use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::{Device, Tensor, TensorData};
use rlft_rollout::RoutingStats;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};

/// The learner's ranks as a group of processes: rank 0 runs the trainer and leads, the others
/// follow ([`crate::follower`]). Every call is collective: each rank makes the same calls in the
/// same order.
pub trait ProcessGroup: Send + Sync {
    /// This process's rank, 0-based.
    fn rank(&self) -> usize;
    /// Ranks in the group.
    fn size(&self) -> usize;
    /// This process's rank among the group's processes on its machine, and how many there are.
    fn local(&self) -> (usize, usize);
    /// Rank 0's `bytes`, on every rank (the others pass an empty buffer).
    ///
    /// # Errors
    /// The group cannot deliver it.
    fn broadcast(&self, bytes: Vec<u8>) -> Result<Vec<u8>>;
    /// Every rank's `bytes`, in rank order.
    ///
    /// # Errors
    /// The group cannot deliver them.
    fn all_gather(&self, bytes: Vec<u8>) -> Result<Vec<Vec<u8>>>;
    /// The bytes this rank has sent so far: each of its messages counted once per rank that
    /// receives it.
    fn bytes_sent(&self) -> u64;
}

/// What rank 0 tells the other ranks.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Command {
    /// The weights and optimiser states every rank starts its RL steps from, as burnpack bytes
    /// (parameter ids included, which key the optimiser's state).
    Start {
        #[serde(with = "serde_bytes")]
        policy: Vec<u8>,
        #[serde(with = "serde_bytes")]
        optim: Vec<u8>,
        critic: Option<Blobs>,
    },
    /// One RL step's update over `rows`.
    Update(Update),
    /// Rank 0 writes a checkpoint: every rank sends its share of the optimiser state.
    Gather,
    /// The run is over.
    Stop,
}

/// A critic's weights and optimiser state, as burnpack bytes.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Blobs {
    #[serde(with = "serde_bytes")]
    pub(crate) weights: Vec<u8>,
    #[serde(with = "serde_bytes")]
    pub(crate) optim: Vec<u8>,
}

/// One RL step's update, as rank 0 runs it.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Update {
    /// RL steps done before this one.
    pub(crate) step: usize,
    /// The learning rate.
    pub(crate) lr: f64,
    /// Seed of the loss's host RNG this step.
    pub(crate) loss_seed: u64,
    /// β of a KL term in the loss.
    pub(crate) kl_coef: f64,
    /// The prepared rows.
    pub(crate) rows: Vec<Row>,
}

/// An update's metrics summed over micro-batches: clip low, clip high, KL, entropy, and the
/// mass outside the kept sets (replaying sampling masks).
pub(crate) type MetricSums = [f64; 5];

/// One rank's share of an optimiser step as it crosses the group: its gradients (per parameter
/// in the module's visiting order, `None` where its rows gave none) and its metric sums.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct RankPart {
    pub(crate) policy: Vec<Option<TensorData>>,
    pub(crate) critic: Option<Vec<Option<TensorData>>>,
    /// The metric sums over the rank's micro-batches.
    pub(crate) sums: MetricSums,
    pub(crate) micro_batches: f64,
    pub(crate) value_losses: Vec<f64>,
    pub(crate) routing: RoutingStats,
    pub(crate) diag: StepDiagnostics,
}

/// `value` as MessagePack.
pub(crate) fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>> {
    rmp_serde::to_vec(value)
        .map_err(|e| TrainError::Ranks(format!("cannot encode a message to the ranks: {e}")))
}

/// `bytes` (from rank `from`) as a `T`.
pub(crate) fn decode<T: for<'de> Deserialize<'de>>(bytes: &[u8], from: usize) -> Result<T> {
    rmp_serde::from_slice(bytes).map_err(|e| {
        TrainError::Ranks(format!(
            "a message from rank {from} cannot be read ({e}); the ranks must run the same rlft \
             build"
        ))
    })
}

/// `grads`'s tensors in `module`'s parameter order, on the host.
pub(crate) fn grads_to_host<M: Module>(
    module: &M,
    mut grads: GradientsParams,
) -> Vec<Option<TensorData>> {
    struct Take<'a> {
        grads: &'a mut GradientsParams,
        out: Vec<Option<TensorData>>,
    }
    impl ModuleVisitor for Take<'_> {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            self.out
                .push(self.grads.remove::<D>(p.id).map(Tensor::into_data));
        }
    }
    let mut take = Take {
        grads: &mut grads,
        out: Vec::new(),
    };
    module.visit(&mut take);
    take.out
}

/// [`grads_to_host`]'s tensors as `module`'s gradients on `device`.
///
/// # Errors
/// A list of another length or tensors of other shapes than `module`'s parameters (ranks that
/// run different models).
pub(crate) fn grads_from_host<M: Module>(
    module: &M,
    tensors: Vec<Option<TensorData>>,
    device: &Device,
    from: usize,
) -> Result<GradientsParams> {
    struct Put<'a> {
        tensors: std::vec::IntoIter<Option<TensorData>>,
        device: &'a Device,
        out: GradientsParams,
        bad: Option<String>,
    }
    impl ModuleVisitor for Put<'_> {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            match self.tensors.next() {
                Some(Some(data)) if data.shape() == &p.shape() => {
                    let t = Tensor::<D>::from_data(data, self.device);
                    self.out.register::<D>(p.id, t);
                }
                Some(Some(data)) => {
                    self.bad.get_or_insert(format!(
                        "a gradient of shape {:?} for a parameter of shape {:?}",
                        data.shape(),
                        p.shape()
                    ));
                }
                Some(None) => {}
                None => {
                    self.bad
                        .get_or_insert("fewer gradients than parameters".into());
                }
            }
        }
    }
    let n = tensors.len();
    let mut put = Put {
        tensors: tensors.into_iter(),
        device,
        out: GradientsParams::new(),
        bad: None,
    };
    module.visit(&mut put);
    let extra = put.tensors.len();
    match put.bad {
        None if extra == 0 => Ok(put.out),
        bad => Err(TrainError::Ranks(format!(
            "rank {from} sent {} ({n} gradients); every rank must train the same model",
            bad.unwrap_or_else(|| format!("{extra} gradients more than there are parameters"))
        ))),
    }
}

/// A digest of `module`'s weights: CRC-32C over every parameter's bytes in visiting order.
pub fn weights_digest<M: Module>(module: &M) -> u32 {
    struct Digest(u32);
    impl ModuleVisitor for Digest {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            let data = p.val().into_data();
            self.0 = crc32c::crc32c_append(self.0, data.as_bytes());
        }
    }
    let mut d = Digest(0);
    module.visit(&mut d);
    d.0
}

/// Compares the ranks' digests of `module` after RL step `step`.
///
/// # Errors
/// [`TrainError::Ranks`] naming the ranks whose weights differ from rank 0's.
pub(crate) fn check_weights<M: Module>(
    group: &dyn ProcessGroup,
    module: &M,
    step: usize,
) -> Result<()> {
    let mine = weights_digest(module);
    let all = group.all_gather(mine.to_le_bytes().to_vec())?;
    let digests: Vec<Option<u32>> = all
        .iter()
        .map(|b| {
            <[u8; 4]>::try_from(b.as_slice())
                .ok()
                .map(u32::from_le_bytes)
        })
        .collect();
    let differ: Vec<usize> = (1..digests.len())
        .filter(|&r| digests[r] != digests[0])
        .collect();
    if differ.is_empty() {
        return Ok(());
    }
    Err(TrainError::Ranks(format!(
        "after step {step} the weights of rank(s) {differ:?} differ from rank 0's (digests \
         {digests:08x?}); the ranks diverged, so the run stops: resume it from its last \
         checkpoint (--resume), and report it if it happens again"
    )))
}

/// A process group of threads in one process, for tests of what runs on process ranks
/// ([`LocalGroup::new`] hands out one handle per rank, each for its own thread).
pub struct LocalGroup {
    rank: usize,
    size: usize,
    shared: Arc<Shared>,
    sent: AtomicU64,
}

struct Shared {
    slots: Mutex<Vec<Vec<u8>>>,
    barrier: Barrier,
}

impl LocalGroup {
    /// One handle per rank of a group of `size` ranks.
    pub fn new(size: usize) -> Vec<Self> {
        let shared = Arc::new(Shared {
            slots: Mutex::new(vec![Vec::new(); size]),
            barrier: Barrier::new(size),
        });
        (0..size)
            .map(|rank| Self {
                rank,
                size,
                shared: shared.clone(),
                sent: AtomicU64::new(0),
            })
            .collect()
    }

    fn slots(&self) -> Result<std::sync::MutexGuard<'_, Vec<Vec<u8>>>> {
        self.shared
            .slots
            .lock()
            .map_err(|_| TrainError::Ranks("a rank thread panicked".into()))
    }
}

impl ProcessGroup for LocalGroup {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn local(&self) -> (usize, usize) {
        (self.rank, self.size)
    }

    fn broadcast(&self, bytes: Vec<u8>) -> Result<Vec<u8>> {
        if self.rank == 0 {
            self.count(bytes.len());
            self.slots()?[0] = bytes;
        }
        self.shared.barrier.wait();
        let out = self.slots()?[0].clone();
        self.shared.barrier.wait();
        Ok(out)
    }

    fn all_gather(&self, bytes: Vec<u8>) -> Result<Vec<Vec<u8>>> {
        self.count(bytes.len());
        self.slots()?[self.rank] = bytes;
        self.shared.barrier.wait();
        let out = self.slots()?.clone();
        self.shared.barrier.wait();
        Ok(out)
    }

    fn bytes_sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }
}

impl LocalGroup {
    /// Counts a message of `len` bytes to every other rank.
    fn count(&self, len: usize) {
        let to = self.size.saturating_sub(1) as u64;
        self.sent.fetch_add(len as u64 * to, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::distributed::tests::Two;

    fn two(device: &Device) -> Two {
        Two {
            a: Param::from_tensor(Tensor::from_floats([[1.0, -2.5]], device)),
            b: Param::from_tensor(Tensor::from_floats([3.0], device)),
        }
    }

    /// Gradients cross as they left, a missing one stays missing, and a list that does not fit
    /// the model is refused.
    #[test]
    fn gradients_cross_bit_for_bit() {
        let device = Device::flex().autodiff();
        let m = two(&device);
        let loss = m.a.val().powf_scalar(3.0).sum().mul_scalar(0.1);
        let grads = GradientsParams::from_grads(loss.backward(), &m);
        let before = grads.get::<2>(m.a.id).expect("a").into_data();
        let host = grads_to_host(&m, grads);
        assert!(host[1].is_none());
        let part = RankPart {
            policy: host,
            ..RankPart::default()
        };
        let back: RankPart = decode(&encode(&part).expect("encode"), 1).expect("decode");
        let g = grads_from_host(&m, back.policy, &device, 1).expect("fits");
        assert_eq!(g.get::<2>(m.a.id).expect("a").into_data(), before);
        assert!(g.get::<1>(m.b.id).is_none());
        let short = grads_from_host(&m, vec![None], &device, 2);
        assert!(matches!(short, Err(TrainError::Ranks(ref s)) if s.contains("rank 2")));
        let wrong = vec![None, Some(TensorData::from([1.0f32, 2.0]))];
        assert!(grads_from_host(&m, wrong, &device, 1).is_err());
    }

    /// The digest check passes on equal weights and names the rank whose weights differ.
    #[test]
    fn a_diverged_rank_is_named() {
        let device = Device::flex();
        let handles = LocalGroup::new(3);
        let results: Vec<Result<()>> = std::thread::scope(|s| {
            let jobs: Vec<_> = handles
                .iter()
                .map(|g| {
                    let device = device.clone();
                    s.spawn(move || {
                        let mut m = two(&device);
                        check_weights(g, &m, 1)?;
                        if g.rank() == 2 {
                            m.b = Param::from_tensor(Tensor::from_floats([3.5], &device));
                        }
                        check_weights(g, &m, 2)
                    })
                })
                .collect();
            jobs.into_iter().map(|j| j.join().expect("rank")).collect()
        });
        for r in results {
            let e = r.expect_err("diverged").to_string();
            assert!(e.contains("after step 2") && e.contains("[2]"), "{e}");
        }
    }
}
