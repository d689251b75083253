//! The shared loss pipeline: ratio levels, CTPO and cumulative ratios at the extremes, input
//! checks, and the KL and entropy terms.

use super::*;
use crate::masked::to_host;
use burn::tensor::{DType, Device, TensorData};

use crate::testing::t2_on as t2;

/// A batch with drifting ratios, mixed-sign advantages and one padded tail.
fn batch(dev: &Device) -> PolicyLossInput {
    let (b, t) = (3, 5);
    let lp: Vec<f64> = (0..b * t).map(|k| -0.2 - 0.1 * (k % 7) as f64).collect();
    let old: Vec<f64> = (0..b * t)
        .map(|k| -0.2 - 0.1 * (k % 7) as f64 - 0.15 * ((k % 3) as f64 - 1.0))
        .collect();
    let adv: Vec<f64> = (0..b * t)
        .map(|k| if (k / t) % 2 == 0 { 1.0 } else { -0.5 })
        .collect();
    let mask: Vec<f64> = (0..b * t)
        .map(|k| if k / t == 2 && k % t >= 3 { 0.0 } else { 1.0 })
        .collect();
    let lp = t2(lp, b, t, dev);
    let lp = if dev.is_autodiff() {
        lp.require_grad()
    } else {
        lp
    };
    let scores = Tensor::from_data(
        TensorData::new(vec![1.0, 0.0, -1.0], [b]),
        (dev, DType::F64),
    );
    PolicyLossInput::new(
        lp,
        t2(old, b, t, dev),
        t2(adv, b, t, dev),
        t2(mask, b, t, dev),
    )
    .with_scores(scores)
}

fn loss_and_grad(name: &str, cfg: &PolicyLossConfig) -> (f64, Vec<f64>) {
    let dev = Device::flex().autodiff();
    let input = batch(&dev);
    let out = LossRegistry::with_builtins()
        .compute(name, &input, cfg)
        .unwrap();
    let g = input.log_prob.grad(&out.loss.backward()).unwrap();
    (to_host(&out.loss).unwrap()[0], to_host(&g).unwrap())
}

#[test]
fn ratio_level_is_orthogonal_to_the_loss() {
    // PPO-clip at sequence level without dual clip is GSPO.
    let cfg = PolicyLossConfig::new()
        .with_ratio_level(RatioLevel::Sequence)
        .with_clip_ratio_low(0.01);
    let (a, ga) = loss_and_grad("ppo", &cfg);
    let (b, gb) = loss_and_grad("gspo", &cfg);
    assert!((a - b).abs() < 1e-15 && ga == gb);
    // ...and differs from token level.
    let (c, _) = loss_and_grad("ppo", &cfg.clone().with_ratio_level(RatioLevel::Token));
    assert!((a - c).abs() > 1e-6);
    // Every registered loss runs at every level.
    for name in LossRegistry::with_builtins().names() {
        for (level, _) in RatioLevel::ALL {
            let (v, g) = loss_and_grad(&name, &PolicyLossConfig::new().with_ratio_level(level));
            assert!(
                v.is_finite() && g.iter().all(|x| x.is_finite()),
                "{name} at {level}"
            );
            assert!(
                g[13] == 0.0 && g[14] == 0.0,
                "{name}: padding got a gradient"
            );
        }
    }
}

/// CTPO keeps exploding cumulative ratios bounded: loss and gradient stay finite where
/// the unclipped cumulative product over 100 steps of 1.05 would be ≈ 131.5.
#[test]
fn ctpo_stays_finite_on_exploding_products() {
    let dev = Device::flex().autodiff();
    let (b, t) = (2, 100);
    let lp = t2(vec![1.05f64.ln() - 1.0; b * t], b, t, &dev).require_grad();
    let old = t2(vec![-1.0; b * t], b, t, &dev);
    let adv = t2(
        (0..b * t).map(|k| if k < t { 1.0 } else { -1.0 }).collect(),
        b,
        t,
        &dev,
    );
    let input = PolicyLossInput::new(lp.clone(), old, adv, t2(vec![1.0; b * t], b, t, &dev));
    let registry = LossRegistry::with_builtins();
    let cfg = registry.resolve("ctpo").unwrap().config;
    let out = registry.compute("ctpo", &input, &cfg).unwrap();
    let m = out.metrics.read().unwrap();
    assert!(
        (m.ratio_max - 1.05f64.powi(100)).abs() < 1e-6,
        "{}",
        m.ratio_max
    );
    // A < 0 row: capped by the dual bound exp(0.05·√t) ≤ e^0.5; A > 0 row: clipped at the upper bound.
    assert!(
        m.pg_loss.abs() < 2.0 && m.clip_frac_high > 0.45 && m.clip_frac_dual > 0.45,
        "{m:?}"
    );
    let g = to_host(&lp.grad(&out.loss.backward()).unwrap()).unwrap();
    assert!(g.iter().all(|x| x.is_finite()));
}

/// The CTPO authors' cumulative ratio: per-token log-ratios clamped at ±20 before the sum,
/// the sum capped at 10 (value e^10, zero gradient there), the gradient of the current token
/// only; `FullPrefix` sends each token's gradient to its whole prefix.
#[test]
fn cumulative_ratio_is_capped_and_passes_the_current_token_gradient() {
    let dev = Device::flex().autodiff();
    // Row 0: log-ratios 6, 6, 0.5 → cumulative 6, 12 (capped), 12.5 (capped).
    // Row 1: log-ratio -25 (clamped to -20 in the value), then 0.1, 0.1.
    let lp = t2(vec![6.0, 6.0, 0.5, -25.0, 0.1, 0.1], 2, 3, &dev).require_grad();
    let old = t2(vec![0.0; 6], 2, 3, &dev);
    // A < 0 on row 0 (large ratios stay unclipped), A > 0 on row 1 (small ones do).
    let adv = t2(vec![-1.0, -1.0, -1.0, 1.0, 1.0, 1.0], 2, 3, &dev);
    let mask = t2(vec![1.0; 6], 2, 3, &dev);
    let input = PolicyLossInput::new(lp.clone(), old, adv, mask);
    let registry = LossRegistry::with_builtins();
    let cfg = PolicyLossConfig::new().with_ratio_level(RatioLevel::Cumulative);
    let out = registry.compute("ppo", &input, &cfg).unwrap();
    let ratios = out.metrics.valid_ratios().unwrap();
    assert!((ratios[5] - 10f64.exp()).abs() < 1e-6 && (ratios[4] - 10f64.exp()).abs() < 1e-6);
    assert!((ratios[0] - (-20f64).exp()).abs() < 1e-20, "{ratios:?}");
    let g = to_host(&lp.grad(&out.loss.backward()).unwrap()).unwrap();
    // token-mean over 6 tokens of -A·r: d/dlp_t = -A_t·r_t / 6 where not capped.
    assert!((g[0] - 6f64.exp() / 6.0).abs() < 1e-9, "{g:?}");
    assert_eq!((g[1], g[2]), (0.0, 0.0), "capped tokens get no gradient");
    assert!((g[3] + (-20f64).exp() / 6.0).abs() < 1e-20, "{g:?}");
    let r5 = (-19.8f64).exp();
    assert!((g[5] + r5 / 6.0).abs() < 1e-20);

    let full = cfg.with_cumulative_gradient(CumulativeGradient::FullPrefix);
    let out = registry.compute("ppo", &input, &full).unwrap();
    let gf = to_host(&lp.grad(&out.loss.backward()).unwrap()).unwrap();
    // Row 1 (no cap): token 4's gradient also carries token 5's; the clamped token none.
    assert!(
        (gf[4] + ((-19.9f64).exp() + r5) / 6.0).abs() < 1e-20,
        "{gf:?}"
    );
    assert_eq!(gf[3], 0.0);
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let dev = Device::flex();
    let registry = LossRegistry::with_builtins();
    let cfg = PolicyLossConfig::new();
    let good = batch(&dev);

    let err = registry
        .compute("pppo", &good, &cfg)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("unknown policy loss 'pppo'") && err.contains("dapo") && err.contains("ctpo"),
        "{err}"
    );

    let mut bad = good.clone();
    bad.advantages = t2(vec![0.0; 4], 2, 2, &dev);
    let err = registry.compute("ppo", &bad, &cfg).unwrap_err().to_string();
    assert!(err.contains("`advantages` has shape [2, 2]"), "{err}");

    let bad = good
        .clone()
        .with_rollout_is_weights(t2(vec![1.0; 3], 3, 1, &dev));
    assert!(registry.compute("ppo", &bad, &cfg).is_err());

    let err = registry
        .compute("ppo", &good, &cfg.clone().with_clip_ratio_low(-0.1))
        .unwrap_err();
    assert!(err.to_string().contains("clip_ratio_low"), "{err}");
    let err = registry
        .compute("ppo", &good, &cfg.clone().with_dual_clip(Some(0.9)))
        .unwrap_err();
    assert!(err.to_string().contains("dual_clip"), "{err}");
    // DAPO's Clip-Higher requires high >= low; plain PPO does not.
    let lowered = registry
        .resolve("dapo")
        .unwrap()
        .config
        .with_clip_ratio_high(0.1);
    assert!(registry.compute("dapo", &good, &lowered).is_err());
    assert!(registry.compute("ppo", &good, &lowered).is_ok());

    let err = registry
        .compute("grpo", &good, &registry.resolve("grpo").unwrap().config)
        .unwrap_err();
    assert!(err.to_string().contains("ref_log_prob"), "{err}");
    let err = registry
        .compute("ppo", &good, &cfg.clone().with_entropy_coef(0.01))
        .unwrap_err();
    assert!(err.to_string().contains("entropy"), "{err}");
}

#[test]
fn kl_and_entropy_terms_add_to_the_loss() {
    let dev = Device::flex();
    let registry = LossRegistry::with_builtins();
    let input = batch(&dev);
    let reference = input.old_log_prob.clone() - 0.3;
    let entropy = input.old_log_prob.clone().ones_like() * 2.0;
    let cfg = PolicyLossConfig::new();
    let base = to_host(&registry.compute("ppo", &input, &cfg).unwrap().loss).unwrap()[0];
    let full_input = input.with_ref_log_prob(reference).with_entropy(entropy);
    let out = registry
        .compute(
            "ppo",
            &full_input,
            &cfg.clone().with_kl_coef(0.1).with_entropy_coef(0.01),
        )
        .unwrap();
    let m = out.metrics.read().unwrap();
    let (kl, h) = (m.kl.unwrap(), m.entropy.unwrap());
    assert!((h - 2.0).abs() < 1e-7 && kl > 0.0);
    let total = to_host(&out.loss).unwrap()[0];
    // token-mean KL is the masked mean here (one reduction), so the sum is exact up to eps.
    assert!(
        (total - (base + 0.1 * kl - 0.01 * 2.0)).abs() < 1e-7,
        "{total} vs {base}"
    );
}
