//! Backend smoke test: every registered loss (and log-probs/entropy from logits) gives the same
//! value and gradient on every compiled backend as on flex, within 1e-4; the trainer runs a
//! 2-step recipe on each; the reference model runs on a device of its own.
//!
//! `cargo test --test backends` checks flex; `--features ndarray` adds ndarray; `--features wgpu`
//! adds `wgpu:cpu` (Mesa lavapipe in CI: `apt-get install -y mesa-vulkan-drivers`).

use burn::tensor::{Device, Int, Tensor, TensorData};
use rlft::algo::loss::{LossRegistry, PolicyLossInput};
use rlft::algo::masked::to_host;
use rlft::algo::seed::{spread, xorshift64};
use rlft::algo::{entropy_from_logits, logprobs_from_logits};
use rlft::rollout::{SamplingConfig, draw_on_device, draw_on_host};
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
    let mut s = spread(seed) | 1;
    (0..n)
        .map(|_| {
            s = xorshift64(s);
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
        let scores = Tensor::<1>::from_data(TensorData::new(values(B, 6, -1.0, 1.0), [B]), &dev);
        let input = PolicyLossInput::new(log_prob.clone(), old, adv, t2(mask.clone(), &dev))
            .with_ref_log_prob(reference)
            .with_scores(scores);
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
    try_two_steps(tag, sets).unwrap_or_else(|e| panic!("{tag}: {e}"))
}

/// As [`two_steps`], the trainer's error as text.
fn try_two_steps(tag: &str, sets: &[String]) -> Result<Vec<StepMetrics>, String> {
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
        .map_err(|e| e.to_string())?;
    assert_eq!(summary.steps, 2, "{tag}");
    // The RL steps' lines (the step-0 evaluation has a line of its own).
    let metrics: Vec<StepMetrics> = read_metrics(&out.join("metrics.jsonl"))
        .unwrap()
        .into_iter()
        .filter(|m| m.contains_key("kl"))
        .collect();
    std::fs::remove_dir_all(&out).ok();
    Ok(metrics)
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

/// `model.dtype = "bf16"`: the 2-step recipe runs on every compiled backend with bf16
/// arithmetic (flex in the suite), with finite metrics near the f32 run's; on the others
/// (ndarray, wgpu's WGSL) it is the documented error, before anything is written.
#[test]
fn bf16_recipe_runs_where_the_backend_has_it() {
    for (name, dev) in devices() {
        let tag = format!("bf16-{}", name.replace(':', "-"));
        let sets = [format!("device=\"{name}\""), "model.dtype=\"bf16\"".into()];
        if dev.supports_dtype(burn::tensor::FloatDType::BF16) {
            let half = two_steps(&tag, &sets);
            let full = two_steps(&format!("{tag}-f32"), &sets[..1]);
            for (h, f) in half.iter().zip(&full) {
                for key in ["kl", "entropy", "grad_norm", "reward/mean"] {
                    assert!(value(h, key).is_finite(), "{name}: {key}");
                }
                let (eh, ef) = (value(h, "entropy"), value(f, "entropy"));
                assert!(
                    (eh - ef).abs() < 0.05 * ef.abs(),
                    "entropy {eh} vs f32 {ef}"
                );
            }
            println!(
                "{name}: 2 steps in bf16, entropy {:.4}",
                value(&half[1], "entropy")
            );
        } else {
            let err = try_two_steps(&tag, &sets).expect_err("bf16 without bf16 arithmetic");
            assert!(
                err.contains("model.dtype = \"bf16\"") && err.contains(name),
                "{name}: {err}"
            );
            println!("{name}: {err}");
        }
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

/// The distribution a draw samples from, by brute force in f64: the tokens it may draw in the
/// order its inverse CDF walks them (by id without filters; by probability, ties by id, with
/// them), their probabilities after top-k, min-p and top-p and renormalisation, and log S, the
/// log of the full softmax's mass on them.
fn sampled_distribution(x: &[f32], cfg: &SamplingConfig) -> (Vec<usize>, Vec<f64>, f64) {
    let max = x.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let weight = |i: usize| (x[i] as f64 - max).exp();
    let all: f64 = (0..x.len()).map(weight).sum();
    let mut order: Vec<usize> = (0..x.len()).collect();
    if cfg.has_filters() {
        order.sort_by(|&a, &b| x[b].total_cmp(&x[a]).then(a.cmp(&b)));
        if cfg.top_k > 0 {
            order.truncate(cfg.top_k);
        }
        // min-p: relative to the most likely token (at weight 1).
        let keep = order
            .iter()
            .take_while(|&&i| weight(i) >= cfg.min_p)
            .count();
        order.truncate(keep.max(1));
        // top-p: the shortest prefix whose share of the remaining mass reaches top_p.
        let rest: f64 = order.iter().map(|&i| weight(i)).sum();
        let mut acc = 0.0;
        let keep = order
            .iter()
            .position(|&i| {
                acc += weight(i) / rest;
                acc >= cfg.top_p
            })
            .map_or(order.len(), |k| k + 1);
        order.truncate(keep);
    }
    let kept: f64 = order.iter().map(|&i| weight(i)).sum();
    let q = order.iter().map(|&i| weight(i) / kept).collect();
    (order, q, (kept / all).ln())
}

/// Where `u` falls in the host draw's cumulative distribution of one row: the tokens in the
/// order the host walks them (id order without filters, by probability with them, only the kept
/// ones) and their normalised running sums.
fn host_cdf(x: &[f32], cfg: &SamplingConfig) -> (Vec<usize>, Vec<f64>) {
    let (order, mut p, _) = sampled_distribution(x, cfg);
    let mut acc = 0.0;
    for q in &mut p {
        acc += *q;
        *q = acc;
    }
    (order, p)
}

/// With `kept_ids_max` set, both draws record each filtered draw's kept set (the sampling
/// mask): exactly the support of the brute-force filtered distribution, or an overflow when it
/// is larger than the limit.
#[test]
fn kept_ids_are_the_filtered_support() {
    let (rows, vocab) = (16, 500);
    let logits = values(rows * vocab, 29, -6.0, 6.0);
    let u: Vec<Option<f64>> = values(rows, 31, 0.0, 1.0)
        .into_iter()
        .map(|u| Some(u as f64))
        .collect();
    let base = SamplingConfig::new().with_kept_ids_max(vocab);
    let configs = [
        base.clone().with_top_k(20),
        base.clone().with_top_p(0.7),
        base.clone().with_min_p(0.2),
        base.clone()
            .with_top_k(100)
            .with_top_p(0.5)
            .with_min_p(0.01),
    ];
    for (name, dev) in devices() {
        for cfg in &configs {
            let host = draw_on_host(&logits, vocab, cfg, &u);
            let t = Tensor::<2>::from_data(TensorData::new(logits.clone(), [rows, vocab]), &dev);
            let on_dev = draw_on_device(t, cfg, &u).unwrap_or_else(|e| panic!("{name}: {e}"));
            for (r, (h, d)) in host.iter().zip(&on_dev).enumerate() {
                let (order, _, _) = sampled_distribution(&logits[r * vocab..(r + 1) * vocab], cfg);
                let want: Vec<u32> = order.iter().map(|&i| i as u32).collect();
                assert_eq!(
                    h.kept_ids.as_ref(),
                    Some(&want),
                    "{name} host {cfg:?} row {r}"
                );
                let mut got = d.kept_ids.clone().expect("recorded");
                got.sort_unstable();
                let mut want = want;
                want.sort_unstable();
                assert_eq!(got, want, "{name} device {cfg:?} row {r}");
            }
            // A limit below the kept count is an overflow, on both.
            let small = cfg.clone().with_kept_ids_max(1);
            let t = Tensor::<2>::from_data(TensorData::new(logits.clone(), [rows, vocab]), &dev);
            let on_dev = draw_on_device(t, &small, &u).unwrap_or_else(|e| panic!("{name}: {e}"));
            for (r, (h, d)) in draw_on_host(&logits, vocab, &small, &u)
                .iter()
                .zip(&on_dev)
                .enumerate()
            {
                let (order, _, _) = sampled_distribution(&logits[r * vocab..(r + 1) * vocab], cfg);
                let expect_some = order.len() <= 1;
                assert_eq!(
                    h.kept_ids.is_some(),
                    expect_some,
                    "{name} host {cfg:?} row {r}"
                );
                assert_eq!(
                    d.kept_ids.is_some(),
                    expect_some,
                    "{name} device {cfg:?} row {r}"
                );
            }
        }
    }
}

/// The on-device draw picks the host draw's tokens from the same logits on every compiled
/// backend, except where the variate lies within 1e-6 of a boundary between the two tokens in
/// the host's cumulative distribution (counted and printed); greedy decoding and the log-probs
/// agree everywhere. Every log-prob μ and kept mass log S, host and device, with each filter and
/// their combination, equals a brute-force f64 reference of the distribution sampled from.
#[test]
fn device_draw_matches_the_host_draw() {
    let (rows, vocab) = (64, 3000);
    let logits = values(rows * vocab, 17, -6.0, 6.0);
    let uniforms: Vec<Option<f64>> = values(rows, 23, 0.0, 1.0)
        .into_iter()
        .map(|u| Some(u as f64))
        .collect();
    let base = SamplingConfig::new();
    let configs = [
        base.clone(),
        base.clone().with_top_k(50),
        base.clone().with_top_p(0.9),
        base.clone().with_min_p(0.3),
        base.clone()
            .with_top_k(500)
            .with_top_p(0.5)
            .with_min_p(0.01),
        base.clone().with_temperature(0.0),
    ];
    for (name, dev) in devices() {
        let (mut draws, mut near_ties) = (0, 0);
        for cfg in &configs {
            let u: Vec<Option<f64>> = if cfg.temperature == 0.0 {
                vec![None; rows]
            } else {
                uniforms.clone()
            };
            let host = draw_on_host(&logits, vocab, cfg, &u);
            let t = Tensor::<2>::from_data(TensorData::new(logits.clone(), [rows, vocab]), &dev);
            let on_dev = draw_on_device(t, cfg, &u).unwrap_or_else(|e| panic!("{name}: {e}"));
            for (r, (h, d)) in host.iter().zip(&on_dev).enumerate() {
                draws += 1;
                let x = &logits[r * vocab..(r + 1) * vocab];
                // Each log-prob is its own token's under the distribution it was drawn from
                // (greedy: the full softmax), and log S the log of the mass the filters kept.
                let (order, q, log_s) = match u[r] {
                    Some(_) => sampled_distribution(x, cfg),
                    None => sampled_distribution(x, &base),
                };
                for (draw, tol, path) in [(h, 2e-5, "host"), (d, 1e-4, "device")] {
                    let at = order.iter().position(|&i| i == draw.token);
                    let at = at.unwrap_or_else(|| panic!("{name} {path}: token filtered out"));
                    let want = q[at].ln();
                    assert!(
                        (f64::from(draw.logprob) - want).abs() <= tol * (1.0 + want.abs()),
                        "{name} {path} {cfg:?} row {r}: log μ {} vs {want}",
                        draw.logprob
                    );
                    let want_s = if u[r].is_some() { log_s } else { 0.0 };
                    assert!(
                        (draw.log_kept_mass - want_s).abs() <= tol * (1.0 + want_s.abs()),
                        "{name} {path} {cfg:?} row {r}: log S {} vs {want_s}",
                        draw.log_kept_mass
                    );
                }
                if h.token == d.token {
                    continue;
                }
                let u = u[r].unwrap_or_else(|| panic!("{name}: greedy picks differ in row {r}"));
                let (order, cdf) = host_cdf(x, cfg);
                let at = |t: usize| order.iter().position(|&i| i == t);
                let a = at(h.token).expect("the host's token is in its own distribution");
                let b = at(d.token).unwrap_or_else(|| {
                    panic!(
                        "{name} {cfg:?} row {r}: device token {} is filtered out",
                        d.token
                    )
                });
                let gap = cdf[a.min(b)..a.max(b).max(a.min(b) + 1)]
                    .iter()
                    .map(|c| (c - u).abs())
                    .fold(f64::INFINITY, f64::min);
                assert!(
                    gap <= 1e-6,
                    "{name} {cfg:?} row {r}: host {} vs device {} (u {u}, gap {gap:e})",
                    h.token,
                    d.token
                );
                near_ties += 1;
            }
        }
        println!("{name}: {draws} draws, {near_ties} differ at a near-tie (≤ 1e-6)");
    }
}
