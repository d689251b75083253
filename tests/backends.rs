//! Backend smoke test: every registered loss (and log-probs/entropy from logits) gives the same
//! value and gradient on every compiled backend as on flex, within 1e-4; the trainer runs a
//! 2-step recipe on each; the reference model runs on a device of its own.
//!
//! `cargo test --test backends` checks flex; `--features ndarray` adds ndarray; `--features wgpu`
//! adds `wgpu:cpu` (Mesa lavapipe in CI: `apt-get install -y mesa-vulkan-drivers`).

use burn::tensor::{Device, Int, Tensor, TensorData};
use rlft::algo::loss::{LossRegistry, PolicyLossInput};
use rlft::algo::masked::to_host;
use rlft::algo::{entropy_from_logits, logprobs_from_logits};
use rlft::train::metrics::{StepMetrics, read_metrics};
use rlft::train::{Recipe, Trainer};
use std::path::Path;

const B: usize = 6;
const T: usize = 10;
const V: usize = 11;

fn devices() -> Vec<(&'static str, Device)> {
    let mut names = vec!["flex"];
    if cfg!(feature = "ndarray") {
        names.push("ndarray");
    }
    if cfg!(feature = "wgpu") {
        names.push("wgpu:cpu");
    }
    names
        .into_iter()
        .map(|n| (n, rlft::device::parse(n).unwrap_or_else(|e| panic!("{e}"))))
        .collect()
}

/// Deterministic pseudo-random values in [lo, hi).
fn values(n: usize, seed: u64, lo: f64, hi: f64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (lo + (hi - lo) * ((s >> 11) as f64 / (1u64 << 53) as f64)) as f32
        })
        .collect()
}

fn t2(v: Vec<f32>, dev: &Device) -> Tensor<2> {
    Tensor::from_data(TensorData::new(v, [B, T]), dev)
}

/// (name, loss, grad) for every computation on one device.
fn run(dev: &Device) -> Vec<(String, Vec<f64>)> {
    let dev = dev.clone().autodiff();
    let registry = LossRegistry::with_builtins();
    let lens: Vec<usize> = (0..B).map(|i| (i * 3 + 1) % (T + 1)).collect();
    let mask: Vec<f32> = (0..B * T)
        .map(|k| if k % T < lens[k / T] { 1.0 } else { 0.0 })
        .collect();
    let mut out = Vec::new();
    for name in registry.names() {
        // Batch-coupled losses (`clip_cov`, `kl_cov`) select their tokens on the host from the
        // same uploaded inputs on every backend, so they are compared like the others.
        let log_prob = t2(values(B * T, 1, -3.0, -0.05), &dev).require_grad();
        let old = t2(values(B * T, 2, -3.0, -0.05), &dev);
        let adv = t2(values(B * T, 3, -1.5, 1.5), &dev);
        let reference = t2(values(B * T, 4, -3.0, -0.05), &dev);
        let input = PolicyLossInput::new(log_prob.clone(), old, adv, t2(mask.clone(), &dev))
            .with_ref_log_prob(reference);
        let mut config = registry.resolve(&name).unwrap().config;
        config.kl_coef = 0.05;
        let loss = registry
            .compute(&name, &input, &config)
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .loss;
        let grad = log_prob.grad(&loss.backward()).unwrap();
        out.push((name.clone(), to_host(&loss).unwrap()));
        out.push((format!("{name} grad"), to_host(&grad).unwrap()));
    }
    let logits = Tensor::<3>::from_data(
        TensorData::new(values(B * T * V, 5, -4.0, 4.0), [B, T, V]),
        &dev,
    )
    .require_grad();
    let labels: Vec<i64> = (0..B * T).map(|k| ((k * 7) % V) as i64).collect();
    let labels = Tensor::<2, Int>::from_data(TensorData::new(labels, [B, T]), &dev);
    let lp = logprobs_from_logits(logits.clone(), labels, Some(0.7)).unwrap();
    let h = entropy_from_logits(logits.clone(), Some(0.7)).unwrap();
    let grad = logits
        .grad(&(lp.clone().sum() + h.clone().sum()).backward())
        .unwrap();
    out.push(("logprobs".into(), to_host(&lp).unwrap()));
    out.push(("entropy".into(), to_host(&h).unwrap()));
    out.push(("logits grad".into(), to_host(&grad).unwrap()));
    out
}

#[test]
fn losses_agree_across_backends() {
    let devices = devices();
    let reference = run(&devices[0].1);
    for (dev_name, dev) in &devices[1..] {
        let got = run(dev);
        for ((name, want), (_, have)) in reference.iter().zip(&got) {
            for (k, (w, h)) in want.iter().zip(have).enumerate() {
                assert!(
                    (w - h).abs() <= 1e-4 * (1.0 + w.abs()),
                    "{dev_name} {name}[{k}]: {h} vs flex {w}"
                );
            }
        }
        println!("{dev_name}: {} quantities agree with flex", got.len());
    }
}

/// Runs the crash test's recipe (warm-up, RL with a reference KL and PPO epochs, evaluation)
/// for 2 steps with `sets` and returns its metrics.
fn two_steps(tag: &str, sets: &[String]) -> Vec<StepMetrics> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("tests/data/recipes/crash.toml")).unwrap();
    let out = std::env::temp_dir().join(format!("rlft-backends-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let mut sets = sets.to_vec();
    sets.extend([
        "schedule.steps=2".into(),
        "sft.steps=2".into(),
        "checkpoint.every=0".into(),
        format!("output_dir=\"{}\"", out.display()),
    ]);
    let recipe = Recipe::from_toml_str(&text, &sets).unwrap();
    let summary = Trainer::new(recipe, None)
        .and_then(|mut t| t.run(None))
        .unwrap_or_else(|e| panic!("{tag}: {e}"));
    assert_eq!(summary.steps, 2, "{tag}");
    // The RL steps' lines (the step-0 evaluation has a line of its own).
    let metrics: Vec<StepMetrics> = read_metrics(&out.join("metrics.jsonl"))
        .unwrap()
        .into_iter()
        .filter(|m| m.contains_key("kl"))
        .collect();
    std::fs::remove_dir_all(&out).ok();
    metrics
}

fn value(m: &StepMetrics, key: &str) -> f64 {
    m.get(key)
        .and_then(|v| v.as_f64())
        .unwrap_or_else(|| panic!("{key} missing from {m:?}"))
}

#[test]
fn two_step_recipe_on_every_backend() {
    for (name, _) in devices() {
        let m = two_steps(&name.replace(':', "-"), &[format!("device=\"{name}\"")]);
        assert_eq!(m.len(), 2, "{name}");
        for step in &m {
            for key in ["kl", "entropy", "grad_norm", "reward/mean"] {
                let v = value(step, key);
                assert!(v.is_finite(), "{name}: {key} = {v}");
            }
        }
        println!("{name}: 2 steps, entropy {:.4}", value(&m[1], "entropy"));
    }
}

/// `model.reference_device` moves the reference policy: on ndarray beside a flex learner its
/// KL matches the all-flex run to rounding (the two backends' kernels differ in the last bits).
#[cfg(feature = "ndarray")]
#[test]
fn reference_model_on_its_own_device() {
    let same = two_steps("ref-flex", &[]);
    let moved = two_steps(
        "ref-ndarray",
        &["model.reference_device=\"ndarray\"".into()],
    );
    for (a, b) in same.iter().zip(&moved) {
        let (ka, kb) = (value(a, "kl"), value(b, "kl"));
        assert!(
            (ka - kb).abs() <= 1e-4 * (1.0 + ka.abs()),
            "kl {ka} vs {kb}"
        );
        assert!(ka > 0.0, "the reference KL is measured");
    }
}
