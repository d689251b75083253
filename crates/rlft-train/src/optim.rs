//! The optimiser side of an update: AdamW with one fused pass per parameter on CPU devices
//! ([`FusedAdamW`], built from `[optimizer]` by `adamw`), gradient clipping by the global norm
//! ([`clip_grads`]) and the learning-rate schedule ([`ScheduleSection::lr`]).
//!
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

use crate::host;
use crate::recipe::{OptimizerSection, ScheduleKind, ScheduleSection};
use burn::config::Config;
use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::{
    AdamW, AdamWConfig, AdamWState, AdaptiveMomentumState, GradientsParams, LearningRate,
    ModuleOptimizer, Optimizer,
};
use burn::tensor::{Device, Tensor};
use rayon::prelude::*;
use rlft_model::hostmem::{CHUNK, HostF32, is_host_f32, read_f32};

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

/// AdamW with the recipe's settings (gradient clipping is done by the trainer, which also
/// needs the norm for metrics and NaN checks).
pub(crate) fn adamw(o: &OptimizerSection) -> ModuleOptimizer {
    FusedAdamWConfig::new()
        .with_beta_1(o.beta1 as f32)
        .with_beta_2(o.beta2 as f32)
        .with_epsilon(o.eps as f32)
        .with_weight_decay(o.weight_decay as f32)
        .init()
}

impl ScheduleSection {
    /// The learning rate at `step` (0-based) for a peak of `peak`: linear warm-up over
    /// `warmup_steps`, then constant, or a linear or cosine decay from the peak down to
    /// `peak * min_lr_ratio` at `steps`.
    pub fn lr(&self, peak: f64, step: usize) -> f64 {
        if step < self.warmup_steps {
            return peak * (step + 1) as f64 / self.warmup_steps as f64;
        }
        let span = self.steps.saturating_sub(self.warmup_steps).max(1) as f64;
        let t = ((step - self.warmup_steps) as f64 / span).min(1.0);
        let floor = peak * self.min_lr_ratio;
        match self.kind {
            ScheduleKind::Cosine => {
                floor + (peak - floor) * 0.5 * (1.0 + (std::f64::consts::PI * t).cos())
            }
            ScheduleKind::Linear => floor + (peak - floor) * (1.0 - t),
            ScheduleKind::Constant | ScheduleKind::LinearWarmup => peak,
        }
    }
}

/// Global L2 norm of `grads` over `module`'s parameters; scales them to `max_norm` if larger
/// (`max_norm = 0`: no clipping). Returns the gradients and the norm before clipping — NaN or ∞
/// when any gradient is, the signal to skip the step (the trainer's NaN/Inf guard). Gradients in
/// host memory are summed and scaled by parallel passes over their elements where they lie
/// ([`rlft_model::hostmem`]), in a fixed order, so the norm is the same run to run; others by
/// tensor operations on their device.
pub fn clip_grads<M: Module>(
    mut grads: GradientsParams,
    module: &M,
    max_norm: f64,
) -> (GradientsParams, f64) {
    struct Norm<'a> {
        grads: &'a GradientsParams,
        host: f64,
        device: Vec<Tensor<1>>,
    }
    impl ModuleVisitor for Norm<'_> {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            let Some(g) = self.grads.get::<D>(p.id) else {
                return;
            };
            match is_host_f32(&g).then(|| read_f32(&g, sum_of_squares)) {
                Some(Ok(s)) => self.host += s,
                _ => self.device.push(g.square().sum()),
            }
        }
    }
    struct Scale<'a> {
        grads: &'a mut GradientsParams,
        s: f64,
    }
    impl ModuleVisitor for Scale<'_> {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            let Some(g) = self.grads.remove::<D>(p.id) else {
                return;
            };
            let g = if is_host_f32(&g) {
                // An f32 tensor's host elements: this cannot fail.
                let mut h = HostF32::new(g).expect("an f32 tensor's host elements");
                let s = self.s as f32;
                h.as_mut_slice()
                    .par_chunks_mut(CHUNK)
                    .for_each(|c| c.iter_mut().for_each(|v| *v *= s));
                h.into_tensor()
            } else {
                g * self.s
            };
            self.grads.register::<D>(p.id, g);
        }
    }
    let mut v = Norm {
        grads: &grads,
        host: 0.0,
        device: Vec::new(),
    };
    module.visit(&mut v);
    let mut total = v.host;
    if !v.device.is_empty() {
        total += host(Tensor::cat(v.device, 0).sum())[0] as f64;
    }
    let norm = total.sqrt();
    if norm.is_finite() && max_norm > 0.0 && norm > max_norm {
        let mut s = Scale {
            grads: &mut grads,
            s: max_norm / (norm + 1e-6),
        };
        module.visit(&mut s);
    }
    (grads, norm)
}

/// Σ x² of `x`, in parallel, 16 lanes per task; NaN or ∞ if any element is. The tasks' sums
/// are added in order, so the result does not depend on the number of threads.
fn sum_of_squares(x: &[f32]) -> f64 {
    let parts: Vec<f64> = x
        .par_chunks(CHUNK)
        .map(|c| {
            let mut lanes = [0f32; 16];
            let mut it = c.chunks_exact(16);
            for block in &mut it {
                for (l, v) in lanes.iter_mut().zip(block) {
                    *l += v * v;
                }
            }
            let tail: f32 = it.remainder().iter().map(|v| v * v).sum();
            lanes.iter().map(|&l| l as f64).sum::<f64>() + tail as f64
        })
        .collect();
    parts.iter().sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recipe::SftSection;

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

    /// The norm is the global L2 norm over every parameter's gradient (odd lengths included);
    /// above `max_norm` all gradients are scaled by the same factor, below it none is.
    #[test]
    fn gradients_are_clipped_by_their_global_norm() {
        let device = Device::flex().autodiff();
        let model = Two {
            a: Param::from_tensor(
                Tensor::<1, burn::tensor::Int>::arange(0..(3 * 37) as i64, &device)
                    .float()
                    .reshape([3, 37])
                    .mul_scalar(0.01),
            ),
            b: Param::from_tensor(Tensor::from_floats([0.5, -1.0, 2.0], &device)),
        };
        // d/da Σ a² = 2a, d/db Σ b³ = 3b².
        let grads = || {
            let loss = model.a.val().powf_scalar(2.0).sum() + model.b.val().powf_scalar(3.0).sum();
            GradientsParams::from_grads(loss.backward(), &model)
        };
        let mut want: Vec<f32> = (0..111).map(|i| 2.0 * 0.01 * i as f32).collect();
        want.extend([0.75, 3.0, 12.0]);
        let norm = want.iter().map(|g| (*g as f64).powi(2)).sum::<f64>().sqrt();
        let (g, got) = clip_grads(grads(), &model, 1e3);
        assert!((got - norm).abs() < 1e-4 * norm, "{got} vs {norm}");
        assert_eq!(
            host(g.get::<1>(model.b.id).expect("b")),
            vec![0.75, 3.0, 12.0]
        );
        let (g, _) = clip_grads(grads(), &model, 2.0);
        let s = 2.0 / norm;
        let mut clipped = host(g.get::<2>(model.a.id).expect("a"));
        clipped.extend(host(g.get::<1>(model.b.id).expect("b")));
        for (c, w) in clipped.iter().zip(&want) {
            assert!(
                (*c as f64 - *w as f64 * s).abs() < 1e-5,
                "{c} vs {}",
                w * s as f32
            );
        }
        let x: Vec<f32> = (0..100_003).map(|i| ((i % 7) as f32 - 3.0) * 0.5).collect();
        let naive: f64 = x.iter().map(|v| (*v as f64).powi(2)).sum();
        assert!((sum_of_squares(&x) - naive).abs() < 1e-6 * naive);
        assert!(sum_of_squares(&[1.0, f32::NAN]).is_nan());
    }

    #[test]
    fn schedules_ramp_up_then_hold_or_decay_to_their_floor() {
        let s = ScheduleSection {
            steps: 10,
            kind: ScheduleKind::Cosine,
            warmup_steps: 2,
            min_lr_ratio: 0.1,
        };
        let lr: Vec<f64> = (0..12).map(|t| s.lr(1.0, t)).collect();
        assert_eq!(&lr[..3], &[0.5, 1.0, 1.0]);
        assert!((lr[6] - 0.55).abs() < 1e-12, "half way: {}", lr[6]);
        assert!(lr[2..].windows(2).all(|w| w[1] <= w[0]));
        assert!(lr[10..].iter().all(|&v| (v - 0.1).abs() < 1e-12));
        let linear = ScheduleSection {
            kind: ScheduleKind::Linear,
            ..s.clone()
        };
        assert!((linear.lr(1.0, 6) - 0.55).abs() < 1e-12);
        assert!((linear.lr(1.0, 4) - 0.775).abs() < 1e-12);
        assert!((linear.lr(1.0, 11) - 0.1).abs() < 1e-12);
        let constant = ScheduleSection {
            kind: ScheduleKind::Constant,
            ..s
        };
        assert_eq!(constant.lr(2.0, 0), 1.0);
        assert!((1..12).all(|t| constant.lr(2.0, t) == 2.0));
        // The warm-up ramps over its first tenth (at least one step), then follows `schedule`.
        let sft = SftSection {
            steps: 20,
            schedule: ScheduleKind::Cosine,
            ..SftSection::default()
        };
        let s = sft.lr_schedule();
        assert_eq!((s.warmup_steps, s.steps, s.min_lr_ratio), (2, 20, 0.0));
        let last = s.lr(1.0, 19);
        assert!(last > 0.0 && last < 0.01, "last warm-up step: {last}");
    }
}
