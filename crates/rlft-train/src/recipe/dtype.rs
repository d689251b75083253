//! `model.dtype`: the float type of the model's forward passes, and which devices have it.

use crate::{Result, TrainError};
use rlft_model::device::DeviceSpec;
use serde::{Deserialize, Serialize};

/// The float type of the model's forward passes (`model.dtype`).
#[derive(
    schemars::JsonSchema, Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum ModelDtype {
    /// Everything in f32.
    #[default]
    F32,
    /// bfloat16 passes: flex, CUDA, and Vulkan devices that report bf16 arithmetic.
    Bf16,
    /// float16 passes: flex, CUDA, and wgpu/Vulkan devices that report f16.
    F16,
}

impl ModelDtype {
    /// burn's float type.
    pub fn float_dtype(self) -> burn::tensor::FloatDType {
        match self {
            Self::F32 => burn::tensor::FloatDType::F32,
            Self::Bf16 => burn::tensor::FloatDType::BF16,
            Self::F16 => burn::tensor::FloatDType::F16,
        }
    }

    /// The recipe's name for it.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
            Self::F16 => "f16",
        }
    }

    /// Checks that `device` (from `spec`, set by recipe key `key`) computes in this type: burn
    /// 0.22's ndarray backend has no half types, WGSL (plain wgpu) no bf16 and f16 only where
    /// the adapter offers it.
    pub fn check(self, device: &burn::tensor::Device, key: &str, spec: DeviceSpec) -> Result<()> {
        if self == Self::F32 || device.supports_dtype(self.float_dtype()) {
            return Ok(());
        }
        Err(TrainError::Recipe(format!(
            "model.dtype = \"{}\": the {key} '{spec}' has no {} arithmetic (burn 0.22: ndarray \
             has no half types; wgpu's WGSL has no bf16, and f16 only where the adapter offers \
             it); set model.dtype = \"f32\", or use a device that has it: flex or cuda (bf16 \
             and f16), vulkan where the GPU reports it",
            self.name(),
            self.name(),
        )))
    }
}
