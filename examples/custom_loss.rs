//! Registers a policy loss from outside rlft-algo and runs it by name.
//!
//! The loss here is a truncated-IS policy gradient, `−sg(min(ρ, C))·A·log πθ`, which keeps the
//! gradient of every token (like CISPO) but only caps the weight from above.
//!
//! ```text
//! cargo run --release --example custom_loss
//! ```

mod common;

use anyhow::Result;
use burn::tensor::{Distribution, Tensor};
use common::TruncatedIsPg;
use rlft::algo::loss::{LossRegistry, PolicyLossInput};

fn main() -> Result<()> {
    let device = rlft::device::parse("flex")?.autodiff();
    device.seed(7);
    let mut registry = LossRegistry::with_builtins();
    registry.register("truncated_is_pg", TruncatedIsPg { cap: 2.0 });
    println!(
        "registered losses and presets: {}",
        registry.names().join(", ")
    );

    let (b, t) = (8, 16);
    let log_prob =
        Tensor::<2>::random([b, t], Distribution::Uniform(-3.0, -0.1), &device).require_grad();
    let old =
        log_prob.clone().detach() + Tensor::random([b, t], Distribution::Normal(0.0, 0.5), &device);
    let adv = Tensor::<2>::random([b, t], Distribution::Normal(0.0, 1.0), &device);
    let mask = Tensor::<2>::ones([b, t], &device);
    let input = PolicyLossInput::new(log_prob.clone(), old, adv, mask);

    for name in ["truncated_is_pg", "cispo", "ppo"] {
        let config = registry.resolve(name)?.config;
        let out = registry.compute(name, &input, &config)?;
        let m = out.metrics.read()?;
        let grad = log_prob
            .grad(&out.loss.backward())
            .map(|g| g.abs().sum().into_scalar::<f32>());
        println!(
            "{name:>16}: loss {:+.5}  clip_frac high {:.3} low {:.3}  ratio max {:.3}  |grad| {:.4}",
            m.pg_loss,
            m.clip_frac_high,
            m.clip_frac_low,
            m.ratio_max,
            grad.unwrap_or(0.0)
        );
    }
    Ok(())
}
