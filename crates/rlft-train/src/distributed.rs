//! The data-parallel learner: `[distributed] devices` lists one learner rank per device. Each
//! optimiser step shards the mini-batch's rows over the ranks, every rank computes the gradient
//! of its rows on a replica of the policy ([`Module::fork`] onto its device) with its loss
//! normalised by the whole mini-batch ([`GlobalBatchInfo`]: the global token and sequence
//! counts), and the ranks' gradients are summed ([`sum_gradients`]): the sum is the gradient of
//! the whole mini-batch for every loss aggregation.
//!
//! verl instead multiplies each rank's loss by `dp_size` and averages (an all-reduce mean); that
//! is the same in exact arithmetic, but for a rank count that is not a power of two the
//! multiply-then-divide rounds, and Adam's first step (≈ lr · g / |g|) turns that rounding on
//! near-zero gradients into parameter differences: 3 ranks differed from 1 by up to 2.9e-5
//! after one step (lr 1e-3) that way, by 1.6e-6 with the sum (`tests/data_parallel.rs`). So
//! `GlobalBatchInfo::dp_size` stays 1 here.
//!
//! The first rank's device holds the policy, the optimiser and the sum; the updated weights are
//! forked to the other ranks for the next step. The ranks run in turn on the learner's thread,
//! and the sum is taken on the first rank's device (through the host for CPU backends).
//! Overlapping the ranks on several GPUs (a thread per rank and burn's `all_reduce` over NCCL)
//! is not done yet (`docs/backends.md`).
//!
//! [`GlobalBatchInfo`]: rlft_algo::aggregation::GlobalBatchInfo

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::{Device, Tensor};
use serde::{Deserialize, Serialize};

/// `[distributed]`: data parallelism of the learner.
#[derive(schemars::JsonSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DistributedSection {
    /// One learner rank per device, e.g. `["cuda:0", "cuda:1"]` or `["flex", "flex"]` (empty:
    /// one rank on the recipe's `device`). The top-level `device` must then be unset (`auto`)
    /// or the first of them.
    #[schemars(with = "Vec<String>")]
    pub devices: Vec<rlft_model::device::DeviceSpec>,
}

impl DistributedSection {
    /// The run's device: the first rank's, else the recipe's `device`.
    pub fn run_device(
        &self,
        device: rlft_model::device::DeviceSpec,
    ) -> rlft_model::device::DeviceSpec {
        self.devices.first().copied().unwrap_or(device)
    }

    /// Number of learner ranks (1 without `devices`).
    pub fn ranks(&self) -> usize {
        self.devices.len().max(1)
    }

    /// Checks the devices against the recipe's top-level `device`; on error returns the key and
    /// what to change.
    pub(crate) fn check(
        &self,
        device: rlft_model::device::DeviceSpec,
    ) -> std::result::Result<(), (&'static str, String)> {
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

    #[derive(Module, Debug)]
    struct Two {
        a: Param<Tensor<2>>,
        b: Param<Tensor<1>>,
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
