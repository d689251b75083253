//! The correction modes as the trainer composes them, on hand-sized batches:
//! - decoupled: PPO on πθ/π_prox, the loss weighted by the IS weights of π_prox against μ, with
//!   the rejection mask;
//! - bypass: μ anchors the ratio; IS weights and rejection of πθ (detached) against μ;
//! - recompute: PPO on πθ/π_old, no correction.

use burn::tensor::{DType, Device, Tensor, TensorData};
use rlft_algo::correction::{CorrectionConfig, IsConfig, IsLevel, IsThreshold, rollout_correction};
use rlft_algo::loss::{LossRegistry, PolicyLossConfig, PolicyLossInput};
use rlft_algo::masked::to_host;
use rlft_algo::ratio::RatioLevel;

fn t2(v: Vec<f64>, b: usize, t: usize, dev: &Device) -> Tensor<2> {
    Tensor::from_data(TensorData::new(v, [b, t]), (dev, DType::F64))
}

fn tis(level: IsLevel, upper: f64) -> CorrectionConfig {
    CorrectionConfig {
        is: Some(IsConfig {
            level,
            threshold: IsThreshold::Truncate { upper },
            batch_normalize: false,
        }),
        rejection: Vec::new(),
    }
}

/// Loss and gradient of `name` on πθ = `lp` with the anchor `old`, the correction's weights (if
/// `weigh`) and mask.
fn run(
    lp: &[f64],
    old: &[f64],
    adv: &[f64],
    mask: Tensor<2>,
    weights: Option<Tensor<2>>,
    cfg: &PolicyLossConfig,
    dims: [usize; 2],
) -> (f64, Vec<f64>) {
    let dev = Device::flex().autodiff();
    let lp = t2(lp.to_vec(), dims[0], dims[1], &dev).require_grad();
    let mut input = PolicyLossInput::new(
        lp.clone(),
        t2(old.to_vec(), dims[0], dims[1], &dev),
        t2(adv.to_vec(), dims[0], dims[1], &dev),
        mask,
    );
    if let Some(w) = weights {
        input = input.with_rollout_is_weights(w);
    }
    let out = LossRegistry::with_builtins()
        .compute("ppo", &input, cfg)
        .unwrap();
    let g = lp.grad(&out.loss.backward()).unwrap();
    (to_host(&out.loss).unwrap()[0], to_host(&g).unwrap())
}

/// μ = (0.4, 0.5), π_prox = (0.9, 0.5): the first token's IS weight 2.25 is truncated at 2.
/// πθ moves both tokens a little (ratios e^0.1, e^-0.05, inside the clip): the loss is
/// `−mean_t(A·ρ_t·w_t)` with `w = (2, 1)`.
#[test]
fn decoupled_by_hand_with_truncation() {
    let dev = Device::flex().autodiff();
    let mu = [0.4f64.ln(), 0.5f64.ln()];
    let prox = [0.9f64.ln(), 0.5f64.ln()];
    let lp = [prox[0] + 0.1, prox[1] - 0.05];
    let mask = t2(vec![1.0, 1.0], 1, 2, &dev);
    let c = rollout_correction(
        &t2(prox.to_vec(), 1, 2, &dev),
        &t2(mu.to_vec(), 1, 2, &dev),
        &mask,
        &tis(IsLevel::Token, 2.0),
    )
    .unwrap();
    let w = to_host(c.weights.as_ref().unwrap()).unwrap();
    assert!(
        (w[0] - 2.0).abs() < 1e-12 && (w[1] - 1.0).abs() < 1e-12,
        "{w:?}"
    );
    assert!((c.metrics["rollout_is_ratio_fraction_high"] - 0.5).abs() < 1e-8);
    let (loss, g) = run(
        &lp,
        &prox,
        &[1.0, 1.0],
        c.mask,
        c.weights,
        &PolicyLossConfig::new(),
        [1, 2],
    );
    let r = [0.1f64.exp(), (-0.05f64).exp()];
    let want = -(r[0] * 2.0 + r[1]) / 2.0;
    assert!((loss - want).abs() < 1e-12, "{loss} vs {want}");
    assert!((g[0] + r[0] * 2.0 / 2.0).abs() < 1e-12 && (g[1] + r[1] / 2.0).abs() < 1e-12);
}

/// `(πθ, π_prox, μ, A, mask, dims)` row-major.
type Batch = (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>, [usize; 2]);

/// A batch with drift, both advantage signs and a padded tail holding garbage.
fn batch() -> Batch {
    let (b, t) = (3, 6);
    let lens = [6, 4, 1];
    let mask: Vec<f64> = (0..b * t)
        .map(|k| f64::from(u8::from(k % t < lens[k / t])))
        .collect();
    let garbage = |k: usize, v: f64| if mask[k] > 0.5 { v } else { 37.0 + k as f64 };
    let mu: Vec<f64> = (0..b * t)
        .map(|k| garbage(k, -0.3 - 0.2 * (k % 5) as f64))
        .collect();
    let prox: Vec<f64> = (0..b * t)
        .map(|k| garbage(k, mu[k] + 0.3 * ((k % 3) as f64 - 1.0)))
        .collect();
    let lp: Vec<f64> = (0..b * t)
        .map(|k| garbage(k, prox[k] + 0.05 * ((k % 4) as f64 - 1.5)))
        .collect();
    let adv: Vec<f64> = (0..b * t)
        .map(|k| garbage(k, if (k / t) % 2 == 0 { 1.0 } else { -0.7 }))
        .collect();
    (lp, prox, mu, adv, mask, [b, t])
}

/// With μ = π_prox the IS weights are all 1 and nothing is rejected: decoupled is recompute.
#[test]
fn decoupled_equals_recompute_when_mu_is_prox() {
    let dev = Device::flex().autodiff();
    let (lp, prox, _, adv, mask, dims) = batch();
    let m = t2(mask.clone(), dims[0], dims[1], &dev);
    let p = t2(prox.clone(), dims[0], dims[1], &dev);
    let config = tis(IsLevel::Sequence, 2.0)
        .with_rejection(&["token_k1", "seq_max_k2"], &["2.0", "0.5"])
        .unwrap();
    let c = rollout_correction(&p, &p, &m, &config).unwrap();
    let cfg = PolicyLossConfig::new();
    let decoupled = run(&lp, &prox, &adv, c.mask, c.weights, &cfg, dims);
    let recompute = run(&lp, &prox, &adv, m, None, &cfg, dims);
    assert_eq!(decoupled, recompute);
}

/// Every correction at every IS level, with and without rejection, under every ratio level:
/// padded positions get exactly zero gradient.
#[test]
fn padding_gets_no_gradient_under_any_correction() {
    let dev = Device::flex().autodiff();
    let (lp, prox, mu, adv, mask, dims) = batch();
    let m = t2(mask.clone(), dims[0], dims[1], &dev);
    for level in [IsLevel::Token, IsLevel::Sequence, IsLevel::Geometric] {
        for rejection in [&[][..], &["token_k2"][..], &["seq_mean_k3", "token_k1"][..]] {
            let config = tis(level, 2.0).with_rejection(rejection, &["1.5"]).unwrap();
            // decoupled: π_prox against μ; bypass: πθ against μ (and μ anchors the ratio).
            for (train, anchor) in [(&prox, &prox), (&lp, &mu)] {
                let c = rollout_correction(
                    &t2(train.to_vec(), dims[0], dims[1], &dev),
                    &t2(mu.clone(), dims[0], dims[1], &dev),
                    &m,
                    &config,
                )
                .unwrap();
                for (ratio, _) in RatioLevel::ALL {
                    let cfg = PolicyLossConfig::new().with_ratio_level(ratio);
                    let (loss, g) = run(
                        &lp,
                        anchor,
                        &adv,
                        c.mask.clone(),
                        c.weights.clone(),
                        &cfg,
                        dims,
                    );
                    assert!(loss.is_finite(), "{level:?} {rejection:?} {ratio}");
                    for (k, gk) in g.iter().enumerate() {
                        if mask[k] < 0.5 {
                            assert_eq!(*gk, 0.0, "{level:?} {rejection:?} {ratio} [{k}]");
                        }
                    }
                }
            }
        }
    }
}
