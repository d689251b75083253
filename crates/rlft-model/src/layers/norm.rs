//! RMSNorm as every supported family computes it: `x / √(mean(x²) + ε) · g`, the mean taken in
//! f32, with `g` the stored weight or, for Gemma, `1 + w`.

use burn::config::Config;
use burn::module::{Module, Param};
use burn::tensor::{DType, Device, Tensor};

/// Settings of an RMSNorm.
#[derive(Config, Debug)]
pub struct NormConfig {
    /// Width of the normalised (last) dimension.
    pub width: usize,
    /// ε added to the mean of squares.
    #[config(default = 1e-6)]
    pub epsilon: f64,
    /// Scale by `1 + w` (Gemma) instead of `w`.
    #[config(default = false)]
    pub unit_offset: bool,
}

impl NormConfig {
    /// A norm that scales by 1: `w = 1`, or `w = 0` with a unit offset.
    pub fn init(&self, device: &Device) -> Norm {
        let gamma = if self.unit_offset {
            Tensor::zeros([self.width], device)
        } else {
            Tensor::ones([self.width], device)
        };
        Norm {
            gamma: Param::from_tensor(gamma),
            epsilon: self.epsilon,
            unit_offset: self.unit_offset,
        }
    }
}

/// Root-mean-square norm over the last dimension.
#[derive(Module, Debug)]
pub struct Norm {
    /// The stored scale `w` `[width]` (Hugging Face's `…norm.weight`).
    pub gamma: Param<Tensor<1>>,
    /// ε added to the mean of squares.
    #[module(skip)]
    pub epsilon: f64,
    /// The scale is `1 + w` (Gemma).
    #[module(skip)]
    pub unit_offset: bool,
}

impl Norm {
    /// # Shapes
    /// - `x`: `[..., width]` → the same
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let dtype = x.dtype();
        let rms = (x.clone().cast(DType::F32).square().mean_dim(D - 1) + self.epsilon).sqrt();
        let scale = if self.unit_offset {
            self.gamma.val().add_scalar(1.0)
        } else {
            self.gamma.val()
        };
        (x / rms.cast(dtype)) * scale.unsqueeze()
    }

    /// The scale each dim is multiplied by after normalising (`w` or `1 + w`), on the host.
    pub fn effective_scale(&self) -> Vec<f32> {
        let w: Vec<f32> = self
            .gamma
            .val()
            .into_data()
            .convert::<f32>()
            .try_into_vec::<f32>()
            .unwrap_or_default();
        if self.unit_offset {
            w.into_iter().map(|v| 1.0 + v).collect()
        } else {
            w
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_offset_scales_by_one_plus_w() {
        let device = Device::flex();
        let x = Tensor::<2>::from_floats([[1.0, -2.0, 3.0, 0.5]], &device);
        let plain = NormConfig::new(4).init(&device);
        let offset = NormConfig::new(4).with_unit_offset(true).init(&device);
        let diff = (plain.forward(x.clone()) - offset.forward(x.clone()))
            .abs()
            .max()
            .into_scalar::<f32>();
        assert_eq!(diff, 0.0, "both start as the identity scale");
        let ms: f32 = (1.0 + 4.0 + 9.0 + 0.25) / 4.0;
        let offset = Norm {
            gamma: Param::from_tensor(Tensor::from_floats([0.5, 0.5, 0.5, 0.5], &device)),
            ..offset
        };
        let y = offset.forward(x).into_data().try_to_vec::<f32>().unwrap();
        let want = 1.5 / (ms + 1e-6).sqrt();
        assert!((y[0] - want).abs() < 1e-6, "{} vs {want}", y[0]);
    }
}
