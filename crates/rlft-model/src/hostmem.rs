//! A tensor's `f32` elements in host memory, without a copy where the backend allows one.
//!
//! On flex a tensor's elements already lie in host memory. `into_data` copies them whenever the
//! storage is shared (a parameter also held by a frozen copy of the model, say), and a tensor
//! built back from a `Vec` is a fresh allocation. The optimizer, the gradient clip and the host
//! decode weights each pass over all of a model's parameters every step, so they read flex
//! storage where it lies ([`read_f32`]) and update uniquely owned tensors in place
//! ([`HostF32`]). Every other backend, dtype or layout goes through `into_data` / `from_data`,
//! with the same results.

use crate::{ModelError, Result};
use burn::tensor::{DType, Device, Shape, Tensor, TensorData};

#[cfg(feature = "flex")]
use burn::backend::{Flex, flex::FlexTensor};

/// Elements per parallel task in a pass over host elements (large enough that a task's work
/// outweighs its scheduling).
pub const CHUNK: usize = 1 << 16;

/// Whether tensors on `device` (or on its autodiff wrapper) live in host memory — the flex and
/// ndarray backends — so that host code reads and writes them without a device transfer.
pub fn host_resident(device: &Device) -> bool {
    #[allow(unused_variables)]
    let inner = device.clone().inner();
    #[cfg(feature = "flex")]
    if inner == Device::flex() {
        return true;
    }
    // burn marks ndarray deprecated; rlft still offers it as a CPU device.
    #[cfg(feature = "ndarray")]
    #[allow(deprecated)]
    if inner == Device::ndarray() {
        return true;
    }
    false
}

/// A tensor's values, row-major, as `f32` on the host.
pub(crate) fn host_vec<const D: usize>(t: Tensor<D>) -> Result<Vec<f32>> {
    t.into_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .map_err(|e| ModelError::Input(format!("tensor to host: {e:?}")))
}

/// Whether `t` is an f32 tensor in host memory (flex, ndarray), whose elements [`read_f32`] and
/// [`HostF32`] reach without the device.
pub fn is_host_f32<const D: usize>(t: &Tensor<D>) -> bool {
    t.dtype() == DType::F32 && host_resident(&t.device())
}

/// The flex primitive of `t` (sharing its storage), if `t` is a plain (not autodiff) f32 tensor
/// on flex.
#[cfg(feature = "flex")]
fn flex_primitive<const D: usize>(t: &Tensor<D>) -> Option<FlexTensor> {
    if t.dtype() != DType::F32 || t.is_autodiff() || !on_flex(&t.device()) {
        return None;
    }
    t.clone().try_into_primitive::<Flex>().ok()
}

#[cfg(feature = "flex")]
fn on_flex(device: &Device) -> bool {
    *device == Device::flex()
}

/// Calls `f` with `t`'s elements (row-major). On flex with a contiguous f32 tensor (autodiff or
/// not) they are read where they lie; otherwise from a host copy.
pub fn read_f32<const D: usize, R>(t: &Tensor<D>, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
    read_f32_all(std::slice::from_ref(t), |s| f(s[0]))
}

/// [`read_f32`] for several tensors at once: `f` gets their elements in order.
pub fn read_f32_all<const D: usize, R>(
    ts: &[Tensor<D>],
    f: impl FnOnce(&[&[f32]]) -> R,
) -> Result<R> {
    let held = ts.iter().map(Held::read).collect::<Result<Vec<_>>>()?;
    let slices: Vec<&[f32]> = held.iter().map(Held::as_slice).collect();
    Ok(f(&slices))
}

/// A tensor's elements on the host: a flex primitive (its own storage, `range` of it), or a copy.
enum Held {
    #[cfg(feature = "flex")]
    Flex(FlexTensor, std::ops::Range<usize>),
    Copy(Vec<f32>),
}

impl Held {
    /// For reading: a contiguous flex tensor's storage whether or not it is shared.
    fn read<const D: usize>(t: &Tensor<D>) -> Result<Self> {
        #[cfg(feature = "flex")]
        if let Some(p) = flex_primitive(&t.clone().inner())
            && let Some((a, b)) = p.layout().contiguous_offsets()
        {
            return Ok(Self::Flex(p, a..b));
        }
        Ok(Self::Copy(host_vec(t.clone())?))
    }

    fn as_slice(&self) -> &[f32] {
        match self {
            #[cfg(feature = "flex")]
            Self::Flex(p, range) => &p.storage::<f32>()[range.clone()],
            Self::Copy(v) => v,
        }
    }
}

/// A tensor's elements, writable on the host, that become a tensor again with
/// [`HostF32::into_tensor`]. Taken from a uniquely owned, contiguous f32 flex tensor, the
/// elements are the tensor's own storage (no copy either way); otherwise they are a copy.
pub struct HostF32<const D: usize> {
    held: Held,
    shape: Shape,
    device: Device,
}

impl<const D: usize> HostF32<D> {
    /// Takes `t`'s elements (without autodiff).
    pub fn new(t: Tensor<D>) -> Result<Self> {
        let t = t.inner();
        let (shape, device) = (t.shape(), t.device());
        #[cfg(feature = "flex")]
        let t = match flex_primitive(&t) {
            Some(mut p) => {
                drop(t);
                if let Some((a, b)) = p.layout().contiguous_offsets()
                    && p.try_storage_mut::<f32>().is_some()
                {
                    return Ok(Self {
                        held: Held::Flex(p, a..b),
                        shape,
                        device,
                    });
                }
                Tensor::<D>::from_primitive::<Flex>(p)
            }
            None => t,
        };
        Ok(Self {
            held: Held::Copy(host_vec(t)?),
            shape,
            device,
        })
    }

    /// `shape` zeros, to become a tensor on `device`.
    pub fn zeros(shape: Shape, device: &Device) -> Self {
        Self {
            held: Held::Copy(vec![0.0; shape.num_elements()]),
            shape,
            device: device.clone(),
        }
    }

    /// Whether the elements are the tensor's own storage (no copy was made).
    pub fn in_place(&self) -> bool {
        !matches!(self.held, Held::Copy(_))
    }

    /// The elements (row-major).
    pub fn as_slice(&self) -> &[f32] {
        self.held.as_slice()
    }

    /// The elements (row-major), writable.
    pub fn as_mut_slice(&mut self) -> &mut [f32] {
        match &mut self.held {
            #[cfg(feature = "flex")]
            Held::Flex(p, range) => {
                let range = range.clone();
                // Unique since `new`: nothing else can have cloned it since.
                &mut p.storage_mut::<f32>()[range]
            }
            Held::Copy(data) => data,
        }
    }

    /// The elements as a tensor again.
    pub fn into_tensor(self) -> Tensor<D> {
        match self.held {
            #[cfg(feature = "flex")]
            Held::Flex(p, _) => Tensor::from_primitive::<Flex>(p),
            Held::Copy(data) => Tensor::from_data(TensorData::new(data, self.shape), &self.device),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ramp(device: &Device) -> Tensor<2> {
        Tensor::<1, burn::tensor::Int>::arange(0..12, device)
            .float()
            .reshape([3, 4])
    }

    /// A uniquely owned flex tensor is updated where it lies; a shared one, a transposed view
    /// and an autodiff tensor are copied, and the copy leaves the original untouched.
    #[test]
    fn unique_tensors_update_in_place_and_shared_ones_are_copied() {
        let device = Device::flex();
        let mut h = HostF32::new(ramp(&device)).expect("host");
        assert_eq!(h.in_place(), cfg!(feature = "flex"));
        h.as_mut_slice().iter_mut().for_each(|v| *v *= 2.0);
        let doubled = h.into_tensor();
        assert_eq!(host_vec(doubled.clone()).expect("v")[11], 22.0);

        let shared = ramp(&device);
        let mut h = HostF32::new(shared.clone()).expect("host");
        assert!(!h.in_place());
        h.as_mut_slice()[0] = 100.0;
        assert_eq!(host_vec(h.into_tensor()).expect("v")[0], 100.0);
        assert_eq!(host_vec(shared.clone()).expect("v")[0], 0.0);

        // A transposed view reads and copies in logical (row-major) order.
        let t = ramp(&device).transpose();
        let h = HostF32::new(t.clone()).expect("host");
        assert_eq!(h.as_slice(), host_vec(t.clone()).expect("v").as_slice());
        let read = read_f32(&t, |s| s.to_vec()).expect("read");
        assert_eq!(read, host_vec(t).expect("v"));

        let ad = ramp(&device.clone().autodiff()).require_grad();
        let read = read_f32(&ad, |s| s.iter().sum::<f32>()).expect("read");
        assert_eq!(read, 66.0);
        let zeros = HostF32::<2>::zeros(Shape::new([2, 5]), &device);
        assert_eq!(zeros.into_tensor().dims(), [2, 5]);
    }
}
