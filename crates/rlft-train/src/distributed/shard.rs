//! Optimiser state sharded across the process ranks (`distributed.shard_optimizer`, ZeRO-1).
//!
//! Each rank owns the AdamW moments of whole parameter tensors ([`owners`]: the parameters in
//! visiting order cut into contiguous runs of about 1/N of the bytes each). After the gradients
//! are summed and clipped (on every rank, the same), a rank steps only the parameters it owns
//! (`sharded_step`) and every rank's updated parameters are gathered: the weights equal the
//! unsharded run's bit for bit, as each parameter's update is the same arithmetic on the same
//! gradient and state. A checkpoint gathers the shards into one optimiser record
//! (`merge_states`), the same file as an unsharded run writes; loading one, each rank keeps its
//! share (`keep_owned`), so a run resumes with another world size or with sharding off.

use super::group::{ProcessGroup, decode, encode};
use crate::{Result, TrainError};
use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::optim::{GradientsParams, ModuleOptimizer};
use burn::tensor::{Bytes, Device, Tensor, TensorData};
use std::collections::BTreeSet;

/// Each of `module`'s parameters' owner among `ranks` ranks (visiting order) and its id: the
/// parameters cut into contiguous runs of about `1/ranks` of the bytes each.
pub fn owners<M: Module>(module: &M, ranks: usize) -> Vec<(usize, u64)> {
    struct Sizes(Vec<(usize, u64)>);
    impl ModuleVisitor for Sizes {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            let bytes = p.shape().num_elements() * p.val().dtype().size();
            self.0.push((bytes, p.id.val()));
        }
    }
    let mut sizes = Sizes(Vec::new());
    module.visit(&mut sizes);
    let total: usize = sizes.0.iter().map(|(b, _)| b).sum::<usize>().max(1);
    let ranks = ranks.max(1);
    let mut start = 0usize;
    sizes
        .0
        .into_iter()
        .map(|(bytes, id)| {
            // The rank whose share holds the parameter's middle byte.
            let middle = start as u128 + bytes as u128 / 2;
            start += bytes;
            let owner = (middle * ranks as u128 / total as u128) as usize;
            (owner.min(ranks - 1), id)
        })
        .collect()
}

/// The ids of the parameters `rank` owns.
fn owned(owners: &[(usize, u64)], rank: usize) -> BTreeSet<u64> {
    owners
        .iter()
        .filter(|(o, _)| *o == rank)
        .map(|(_, id)| *id)
        .collect()
}

/// One optimiser step of `module` on the gradients `grads` (summed over the ranks, clipped),
/// with this rank's optimiser holding the state of the parameters it owns: it steps those, and
/// the others come from their owners.
///
/// # Errors
/// The group cannot exchange the parameters, or a rank sent parameters that do not fit.
pub(crate) fn sharded_step<M: Module>(
    group: &dyn ProcessGroup,
    optim: &mut ModuleOptimizer,
    lr: f64,
    module: M,
    mut grads: GradientsParams,
) -> Result<M> {
    let owners = owners(&module, group.size());
    let mine = owned(&owners, group.rank());
    struct Keep<'a> {
        mine: &'a BTreeSet<u64>,
        grads: &'a mut GradientsParams,
    }
    impl ModuleVisitor for Keep<'_> {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            if !self.mine.contains(&p.id.val()) {
                self.grads.remove::<D>(p.id);
            }
        }
    }
    module.visit(&mut Keep {
        mine: &mine,
        grads: &mut grads,
    });
    let module = optim.step(lr, module, grads);
    // Every rank's updated parameters, each in its owner's list.
    struct Take<'a> {
        mine: &'a BTreeSet<u64>,
        out: Vec<Option<TensorData>>,
    }
    impl ModuleVisitor for Take<'_> {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            let keep = self.mine.contains(&p.id.val());
            self.out.push(keep.then(|| p.val().into_data()));
        }
    }
    let mut take = Take {
        mine: &mine,
        out: Vec::new(),
    };
    module.visit(&mut take);
    let all = group.all_gather(encode(&take.out)?)?;
    let mut lists = Vec::with_capacity(all.len());
    for (from, bytes) in all.iter().enumerate() {
        lists.push(decode::<Vec<Option<TensorData>>>(bytes, from)?);
    }
    let mut put = Put {
        owners: &owners,
        me: group.rank(),
        lists,
        index: 0,
        bad: None,
    };
    let module = module.map(&mut put);
    match put.bad {
        None => Ok(module),
        Some(msg) => Err(TrainError::Ranks(msg)),
    }
}

/// Replaces each parameter this rank does not own with its owner's value (same id, device and
/// trainability).
struct Put<'a> {
    owners: &'a [(usize, u64)],
    me: usize,
    lists: Vec<Vec<Option<TensorData>>>,
    index: usize,
    bad: Option<String>,
}

impl ModuleMapper for Put<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let i = self.index;
        self.index += 1;
        let Some(&(owner, _)) = self.owners.get(i) else {
            return param;
        };
        if owner == self.me {
            return param;
        }
        let data = self
            .lists
            .get_mut(owner)
            .and_then(|l| l.get_mut(i))
            .and_then(Option::take);
        match data {
            Some(data) if data.shape() == &param.shape() => param.map(|t| {
                let device: Device = t.device();
                let fresh = Tensor::<D>::from_data(data, &device);
                if t.is_require_grad() {
                    fresh.require_grad()
                } else {
                    fresh
                }
            }),
            _ => {
                self.bad.get_or_insert(format!(
                    "rank {owner} sent no parameter of shape {:?} for parameter {i}; every rank \
                     must train the same model",
                    param.shape()
                ));
                param
            }
        }
    }
}

/// `optim` keeping only the state of the parameters `rank` owns among `ranks`.
///
/// # Errors
/// The state cannot be packed or read back.
pub(crate) fn keep_owned<M: Module>(
    optim: ModuleOptimizer,
    module: &M,
    rank: usize,
    ranks: usize,
) -> Result<ModuleOptimizer> {
    let mine = owned(&owners(module, ranks), rank);
    let bytes = pack_err(optim.into_bytes())?;
    let kept = filter_pack(bytes, |id| mine.contains(&id))?;
    pack_err(optim.from_bytes(kept))
}

/// The optimiser records of every rank (burnpack bytes, each holding the state of the
/// parameters its rank owns) as one record.
///
/// # Errors
/// A record that cannot be read.
pub(crate) fn merge_states(records: Vec<Vec<u8>>) -> Result<Bytes> {
    let mut tensors = Vec::new();
    let mut scalars = std::collections::BTreeMap::new();
    let mut metadata = std::collections::BTreeMap::new();
    for bytes in records {
        let reader = pack_err(burn_pack::Reader::from_bytes(Bytes::from_bytes_vec(bytes)))?;
        scalars.extend(reader.scalars().clone());
        metadata.extend(reader.metadata().clone());
        tensors.extend(pack_err(reader.into_tensors())?);
    }
    write_pack(tensors, &scalars, &metadata)
}

/// The optimiser state's bytes as this rank holds it.
///
/// # Errors
/// The state cannot be packed.
pub fn state_bytes(optim: &ModuleOptimizer) -> Result<usize> {
    Ok(pack_err(optim.into_bytes())?.len())
}

/// A burnpack optimiser record keeping only the parameters whose id passes `keep`: the tensors
/// (which carry their parameter's id), and the scalars and metadata keyed `"{id}"` or
/// `"{id}.…"`.
fn filter_pack(bytes: Bytes, keep: impl Fn(u64) -> bool) -> Result<Bytes> {
    let id_of = |key: &str| key.split('.').next().and_then(|s| s.parse::<u64>().ok());
    let kept = |key: &str| id_of(key).is_none_or(&keep);
    let reader = pack_err(burn_pack::Reader::from_bytes(bytes))?;
    let scalars = reader.scalars().clone();
    let scalars = scalars.into_iter().filter(|(k, _)| kept(k)).collect();
    let metadata = reader.metadata().clone();
    let metadata = metadata.into_iter().filter(|(k, _)| kept(k)).collect();
    let tensors = pack_err(reader.into_tensors())?
        .into_iter()
        .filter(|t| t.param_id.is_none_or(&keep))
        .collect();
    write_pack(tensors, &scalars, &metadata)
}

fn write_pack(
    tensors: Vec<burn_pack::Tensor>,
    scalars: &std::collections::BTreeMap<String, burn_pack::Scalar>,
    metadata: &std::collections::BTreeMap<String, String>,
) -> Result<Bytes> {
    let mut writer = burn_pack::Writer::new(tensors);
    for (k, v) in scalars {
        writer = writer.with_scalar(k, *v);
    }
    for (k, v) in metadata {
        writer = writer.with_metadata(k, v);
    }
    pack_err(writer.into_bytes())
}

fn pack_err<T, E: std::fmt::Debug>(r: std::result::Result<T, E>) -> Result<T> {
    r.map_err(|e| TrainError::Ranks(format!("the sharded optimizer state: {e:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::optim::FusedAdamWConfig;
    use burn::tensor::Distribution;

    #[derive(Module, Debug)]
    struct Three {
        a: Param<Tensor<2>>,
        b: Param<Tensor<1>>,
        c: Param<Tensor<2>>,
    }

    fn three(device: &Device) -> Three {
        let r = |shape: Vec<usize>| Tensor::random(shape, Distribution::Default, device);
        Three {
            a: Param::from_tensor(r(vec![8, 16])),
            b: Param::from_tensor(r(vec![4]).reshape([4])),
            c: Param::from_tensor(r(vec![16, 8])),
        }
    }

    fn grads(m: &Three) -> GradientsParams {
        let loss = m.a.val().sum() * 0.5 + m.b.val().powf_scalar(2.0).sum() - m.c.val().sum();
        GradientsParams::from_grads(loss.backward(), m)
    }

    fn values(m: &Three) -> Vec<TensorData> {
        vec![
            m.a.val().into_data(),
            m.b.val().into_data(),
            m.c.val().into_data(),
        ]
    }

    /// Owners are contiguous runs in visiting order, every rank gets a share of a large enough
    /// model, and one rank owns everything.
    #[test]
    fn owners_cut_contiguous_balanced_runs() {
        let m = three(&Device::flex());
        let o: Vec<usize> = owners(&m, 2).iter().map(|(r, _)| *r).collect();
        assert_eq!(o, vec![0, 1, 1]);
        assert!(owners(&m, 1).iter().all(|(r, _)| *r == 0));
        let o: Vec<usize> = owners(&m, 8).iter().map(|(r, _)| *r).collect();
        assert!(o.windows(2).all(|w| w[0] <= w[1]) && o.iter().all(|&r| r < 8));
    }

    /// The shares of a state, kept by each rank and merged back, step the weights as the whole
    /// state does, bit for bit.
    #[test]
    fn shares_merge_back_into_the_whole_state() {
        let device = Device::flex().autodiff();
        let optim = || FusedAdamWConfig::new().init();
        let m = three(&device);
        let mut whole = optim();
        let m = whole.step(1e-2, m.clone(), grads(&m));
        let bytes = whole.into_bytes().expect("pack").to_vec();
        let shares: Vec<Vec<u8>> = (0..2)
            .map(|r| {
                let all = optim().from_bytes(Bytes::from_bytes_vec(bytes.clone()));
                let kept = keep_owned(all.expect("load"), &m, r, 2).expect("keep");
                kept.into_bytes().expect("pack").to_vec()
            })
            .collect();
        assert!(shares.iter().all(|s| s.len() < bytes.len()));
        let mut merged = optim()
            .from_bytes(merge_states(shares).expect("merge"))
            .expect("load");
        let a = whole.step(1e-2, m.clone(), grads(&m));
        let b = merged.step(1e-2, m.clone(), grads(&m));
        assert_eq!(values(&a), values(&b));
    }
}
