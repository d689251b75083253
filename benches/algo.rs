//! Forward + backward of every registered policy loss (the frontier ones included: `vespo`,
//! `topr`, `prime_rl`, `prime_rl_ipo`, `luspo`) at B = 64, T = 1024 on flex (f32), and GRPO
//! advantages for the same batch.
//!
//! ```text
//! cargo bench --bench algo
//! ```

use burn::tensor::{Distribution, Tensor};
use criterion::{Criterion, criterion_group, criterion_main};
use rlft::algo::advantage::{AdvantageEstimator, AdvantageInput};
use rlft::algo::loss::{LossRegistry, PolicyLossInput};

const B: usize = 64;
const T: usize = 1024;

fn losses(c: &mut Criterion) {
    let device = rlft::device::parse("flex")
        .expect("flex is the default backend")
        .autodiff();
    device.seed(0);
    let registry = LossRegistry::with_builtins();
    let log_prob = Tensor::<2>::random([B, T], Distribution::Uniform(-4.0, -0.01), &device);
    let old = log_prob.clone() + Tensor::random([B, T], Distribution::Normal(0.0, 0.1), &device);
    let adv = Tensor::<2>::random([B, T], Distribution::Normal(0.0, 1.0), &device);
    let reference =
        log_prob.clone() + Tensor::random([B, T], Distribution::Normal(0.0, 0.1), &device);
    let mask = Tensor::<2>::ones([B, T], &device);
    let scores = Tensor::<1>::random([B], Distribution::Normal(0.0, 1.0), &device);
    let mut group = c.benchmark_group("policy_loss_fwd_bwd_b64_t1024");
    group.sample_size(20);
    for name in registry.names() {
        let config = registry.resolve(&name).expect("registered").config;
        // Batch-coupled losses read advantages and log-probs back to the host to select their
        // tokens: their time includes that round trip (named so in the report).
        let id = if registry.is_batch_coupled(&name).expect("registered") {
            format!("{name} (batch-coupled, host selection)")
        } else {
            name.clone()
        };
        group.bench_function(&id, |b| {
            b.iter(|| {
                let lp = log_prob.clone().detach().require_grad();
                let input =
                    PolicyLossInput::new(lp.clone(), old.clone(), adv.clone(), mask.clone())
                        .with_ref_log_prob(reference.clone())
                        .with_scores(scores.clone());
                let out = registry.compute(&name, &input, &config).expect("loss runs");
                let grads = out.loss.backward();
                lp.grad(&grads)
                    .expect("gradient")
                    .sum()
                    .into_scalar::<f32>()
            })
        });
    }
    group.finish();

    let plain = rlft::device::parse("flex").expect("flex");
    let rewards = Tensor::<2>::random([B, T], Distribution::Bernoulli(0.001), &plain);
    let mask = Tensor::<2>::ones([B, T], &plain);
    let ids: Vec<u64> = (0..B as u64).map(|i| i / 8).collect();
    c.bench_function("grpo_advantages_b64_t1024", |b| {
        b.iter(|| {
            let input = AdvantageInput::new(rewards.clone(), mask.clone()).with_groups(ids.clone());
            AdvantageEstimator::grpo()
                .compute(&input)
                .expect("advantages")
                .advantages
                .sum()
                .into_scalar::<f32>()
        })
    });
}

criterion_group!(benches, losses);
criterion_main!(benches);
