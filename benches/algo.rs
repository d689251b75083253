//! Forward + backward of every registered policy loss (the frontier ones included: `vespo`,
//! `topr`, `prime_rl`, `prime_rl_ipo`, `luspo`) at B = 64, T = 1024 on flex (f32), GRPO
//! advantages for the same batch, and the off-policy filters (OPSM, top-entropy, M2PO, KPop,
//! slime's MIS).
//!
//! ```text
//! cargo bench --bench algo
//! ```

use burn::tensor::{Distribution, Tensor};
use criterion::{Criterion, criterion_group, criterion_main};
use rlft::algo::advantage::{AdvantageEstimator, AdvantageInput};
use rlft::algo::correction::IsLevel;
use rlft::algo::loss::{LossRegistry, PolicyLossInput};
use rlft::algo::mis::{SlimeMisConfig, TisMode, slime_mis};
use rlft::algo::{decoupled, filters};

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

/// The off-policy filters and weights that multiply a loss (host arithmetic included), at the
/// same size: what each adds to a step next to the loss itself.
fn filters(c: &mut Criterion) {
    let device = rlft::device::parse("flex").expect("flex");
    device.seed(1);
    let lp = Tensor::<2>::random([B, T], Distribution::Uniform(-4.0, -0.01), &device);
    let mu = lp.clone() + Tensor::random([B, T], Distribution::Normal(0.0, 0.1), &device);
    let mask = Tensor::<2>::ones([B, T], &device);
    let adv = Tensor::<2>::random([B, T], Distribution::Normal(0.0, 1.0), &device);
    let row_adv = Tensor::<2>::random([B, 1], Distribution::Normal(0.0, 1.0), &device);
    let entropy = Tensor::<2>::random([B, T], Distribution::Uniform(0.0, 3.0), &device);
    let mut group = c.benchmark_group("offpolicy_filters_b64_t1024");
    group.sample_size(20);
    group.bench_function("opsm_trl", |b| {
        b.iter(|| filters::opsm_trl(&lp, &mu, &row_adv, &mask, 0.01).expect("opsm"))
    });
    group.bench_function("opsm_slime", |b| {
        b.iter(|| filters::opsm_slime(&lp, &mu, &adv, &mask, 0.01).expect("opsm"))
    });
    group.bench_function("top_entropy_mask", |b| {
        b.iter(|| filters::top_entropy_mask(&entropy, &mask, 0.2).expect("mask"))
    });
    group.bench_function("m2po_mask", |b| {
        b.iter(|| decoupled::m2po_mask(&mu, &lp, &mask, 0.005).expect("m2po"))
    });
    let kpop = decoupled::RejectionConfig {
        level: decoupled::RejectionLevel::Token,
        metric: decoupled::RejectionMetric::BinaryKl,
        agg: decoupled::RejectionAgg::Mean,
        upper: 0.2,
        lower: None,
    };
    group.bench_function("kpop_rejection", |b| {
        b.iter(|| decoupled::rejection_sampling(&lp, &mu, &mask, &kpop).expect("kpop"))
    });
    let mis = SlimeMisConfig {
        tis_level: IsLevel::Token,
        tis_mode: TisMode::Truncate,
        tis_lower: None,
        tis_upper: 2.0,
        rs: Some((IsLevel::Token, Some(0.2), Some(5.0))),
        veto: Some(1e-4),
        batch_normalize: true,
    };
    group.bench_function("slime_mis", |b| {
        b.iter(|| slime_mis(&mu, &lp, &mask, &mis).expect("mis"))
    });
    group.finish();
}

criterion_group!(benches, losses, filters);
criterion_main!(benches);
