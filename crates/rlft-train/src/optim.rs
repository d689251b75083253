//! AdamW with one fused pass per parameter on CPU devices.
//!
//! burn's [`AdamW`] updates a parameter with about fourteen element-wise tensor operations, each
//! a separate single-threaded pass over the parameter that allocates its result: ≈ 1 s per step
//! for SmolLM2's 135 M parameters on two cores, a seventh of a GRPO step. [`FusedAdamW`] computes
//! the same update (decoupled weight decay, bias-corrected moments, ε outside the square root)
//! in one pass over host memory, in parallel, when the parameter lives in host memory (flex,
//! ndarray; on flex the parameter and both moments are updated where they lie when nothing else
//! holds them, see [`rlft_model::hostmem`]), and hands every other device (and other dtypes) to
//! burn's [`AdamW`]. Its per-parameter state is burn's [`AdamWState`], so optimizer records and
//! checkpoints are the same as with burn's optimizer.

use burn::config::Config;
use burn::optim::{
    AdamW, AdamWConfig, AdamWState, AdaptiveMomentumState, LearningRate, ModuleOptimizer, Optimizer,
};
use burn::tensor::{Device, Tensor};
use rayon::prelude::*;
use rlft_model::hostmem::{CHUNK, HostF32, is_host_f32};

/// [`FusedAdamW`] configuration (the defaults are PyTorch's).
#[derive(Config, Debug)]
pub struct FusedAdamWConfig {
    /// Decay of the first moment.
    #[config(default = 0.9)]
    pub beta_1: f32,
    /// Decay of the second moment.
    #[config(default = 0.999)]
    pub beta_2: f32,
    /// Added to the root of the second moment.
    #[config(default = 1e-8)]
    pub epsilon: f32,
    /// Decoupled weight decay (per unit of learning rate).
    #[config(default = 0.01)]
    pub weight_decay: f32,
}

impl FusedAdamWConfig {
    /// The optimizer, as a module optimizer.
    pub fn init(&self) -> ModuleOptimizer {
        ModuleOptimizer::from(FusedAdamW {
            config: self.clone(),
            fallback: AdamWConfig::new()
                .with_beta_1(self.beta_1)
                .with_beta_2(self.beta_2)
                .with_epsilon(self.epsilon)
                .with_weight_decay(self.weight_decay)
                .build(),
        })
    }
}

/// AdamW whose update on CPU devices is one fused parallel pass (see the module docs).
#[derive(Clone)]
pub struct FusedAdamW {
    config: FusedAdamWConfig,
    fallback: AdamW,
}

impl Optimizer for FusedAdamW {
    type State<const D: usize> = AdamWState<D>;

    fn step<const D: usize>(
        &self,
        lr: LearningRate,
        tensor: Tensor<D>,
        grad: Tensor<D>,
        state: Option<Self::State<D>>,
    ) -> (Tensor<D>, Option<Self::State<D>>) {
        let fuses = is_host_f32(&tensor) && is_host_f32(&grad);
        if !fuses {
            return self.fallback.step(lr, tensor, grad, state);
        }
        let (shape, device): (_, Device) = (tensor.shape(), tensor.device());
        // f32 tensors convert to f32 host elements: these cannot fail.
        let take = |t: Tensor<D>| HostF32::new(t).expect("an f32 tensor's host elements");
        let mut p = take(tensor);
        let g = take(grad);
        let (time, mut m, mut v) = match state {
            Some(s) => (
                s.momentum.time + 1,
                take(s.momentum.moment_1),
                take(s.momentum.moment_2),
            ),
            None => (
                1,
                HostF32::zeros(shape.clone(), &device),
                HostF32::zeros(shape, &device),
            ),
        };
        let c = &self.config;
        let (b1, b2, eps) = (c.beta_1, c.beta_2, c.epsilon);
        let c1 = 1.0 - b1.powi(time as i32);
        let c2 = 1.0 - b2.powi(time as i32);
        let decay = (1.0 - lr * c.weight_decay as f64) as f32;
        let lr = lr as f32;
        p.as_mut_slice()
            .par_chunks_mut(CHUNK)
            .zip(m.as_mut_slice().par_chunks_mut(CHUNK))
            .zip(v.as_mut_slice().par_chunks_mut(CHUNK))
            .zip(g.as_slice().par_chunks(CHUNK))
            .for_each(|(((p, m), v), g)| {
                for i in 0..p.len() {
                    m[i] = m[i] * b1 + g[i] * (1.0 - b1);
                    v[i] = v[i] * b2 + g[i] * g[i] * (1.0 - b2);
                    let step = (m[i] / c1) / ((v[i] / c2).sqrt() + eps);
                    p[i] = p[i] * decay - step * lr;
                }
            });
        let state = AdamWState {
            momentum: AdaptiveMomentumState {
                time,
                moment_1: m.into_tensor(),
                moment_2: v.into_tensor(),
                max_moment_2: None,
            },
        };
        (p.into_tensor(), Some(state))
    }

    fn to_device<const D: usize>(state: Self::State<D>, device: &Device) -> Self::State<D> {
        AdamW::to_device(state, device)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host;
    use burn::module::{Module, Param};
    use burn::optim::GradientsParams;

    #[derive(Module, Debug)]
    struct Two {
        a: Param<Tensor<2>>,
        b: Param<Tensor<1>>,
    }

    fn values(m: &Two) -> Vec<f32> {
        let mut v = host(m.a.val());
        v.extend(host(m.b.val()));
        v
    }

    /// Three steps on the same gradients: the fused update equals burn's AdamW to f32 rounding,
    /// and its state is burn's (a record saved by one loads into the other).
    #[test]
    fn fused_steps_equal_burns_adamw() {
        let device = Device::flex().autodiff();
        let config = FusedAdamWConfig::new()
            .with_weight_decay(0.1)
            .with_beta_2(0.99);
        let burns = || {
            AdamWConfig::new()
                .with_weight_decay(0.1)
                .with_epsilon(1e-8)
                .with_beta_2(0.99)
                .init()
        };
        let init = |seed: f32| Two {
            a: Param::from_tensor(
                Tensor::<1, burn::tensor::Int>::arange(0..(3 * 70_001) as i64, &device)
                    .float()
                    .reshape([3, 70_001])
                    .mul_scalar(1e-5 * seed)
                    .sin(),
            ),
            b: Param::from_tensor(Tensor::from_floats([0.5, -1.0, 2.0], &device)),
        };
        let (mut fused, mut plain) = (init(1.0), init(1.0));
        let (mut fo, mut po) = (config.init(), burns());
        for step in 0..3 {
            let loss = |m: &Two| {
                (m.a.val().powf_scalar(2.0).sum() * (step as f32 + 1.0)) + m.b.val().sin().sum()
            };
            let g = GradientsParams::from_grads(loss(&fused).backward(), &fused);
            // Steps 0 and 2 update the parameters in place; at step 1 they are also held
            // elsewhere, so the update goes to new storage and the other holder sees no change.
            let kept = (step == 1).then(|| (fused.clone(), values(&fused)));
            fused = fo.step(1e-2, fused, g);
            if let Some((kept, before)) = kept {
                assert_eq!(values(&kept), before);
            }
            let g = GradientsParams::from_grads(loss(&plain).backward(), &plain);
            plain = po.step(1e-2, plain, g);
        }
        let d = values(&fused)
            .iter()
            .zip(values(&plain))
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(d < 1e-6, "fused vs burn AdamW: max |Δ| = {d}");
        // burn's optimizer continues from the fused optimizer's record.
        let mut po = burns().load_record(fo.to_record());
        let g = GradientsParams::from_grads(fused.b.val().sin().sum().backward(), &fused);
        let _ = po.step(1e-2, fused, g);
    }
}
