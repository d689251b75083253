//! Helpers of the unit tests.

use burn::tensor::{DType, Device, Tensor, TensorData};

/// A `[b, t]` f64 tensor of `v` on `dev`.
pub(crate) fn t2_on(v: Vec<f64>, b: usize, t: usize, dev: &Device) -> Tensor<2> {
    Tensor::from_data(TensorData::new(v, [b, t]), (dev, DType::F64))
}

/// A `[b, t]` f64 tensor of `v` on the flex device.
pub(crate) fn t2(v: Vec<f64>, b: usize, t: usize) -> Tensor<2> {
    t2_on(v, b, t, &Device::flex())
}
