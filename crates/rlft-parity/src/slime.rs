//! slime's `loss_function` → `policy_loss_function` (`slime/policy_loss`): PPO or CISPO, OPSM,
//! and the MIS helper's TIS / RS / veto / batch normalisation, with slime's sample-mean metrics.

use crate::Result;
use crate::case::Case;
use crate::compare::Compare;
use burn::tensor::Tensor;
use rlft_algo::aggregation::{GlobalBatchInfo, LossAggregation, aggregate_loss};
use rlft_algo::correction::IsLevel;
use rlft_algo::filters::opsm_slime;
use rlft_algo::loss::{LossRegistry, PolicyLossConfig, PolicyLossInput};
use rlft_algo::mis::{SlimeMisConfig, TisMode, slime_mis};
use serde_json::Value;
use std::collections::BTreeMap;

fn mis_config(c: &Case<'_>) -> Result<SlimeMisConfig> {
    let s = |k: &str| c.get(&["config", "slime", k]);
    let str_ = |k: &str| s(k).and_then(Value::as_str).unwrap_or("");
    let num = |k: &str| s(k).and_then(Value::as_f64);
    let level = |k: &str| str_(k).parse::<IsLevel>().map_err(|e| c.algo(e));
    Ok(SlimeMisConfig {
        tis_level: level("tis_level")?,
        tis_mode: match str_("tis_mode") {
            "truncate" => TisMode::Truncate,
            "clip" => TisMode::Clip,
            "mask" => TisMode::Mask,
            o => return Err(c.err(format!("unknown tis_mode '{o}'"))),
        },
        tis_lower: num("tis_lower_bound"),
        tis_upper: num("tis_upper_bound").unwrap_or(2.0),
        rs: if s("use_rs").and_then(Value::as_bool).unwrap_or(false) {
            Some((
                level("rs_level")?,
                num("rs_lower_bound"),
                num("rs_upper_bound"),
            ))
        } else {
            None
        },
        veto: num("rs_veto_threshold"),
        batch_normalize: s("tis_batch_normalize")
            .and_then(Value::as_bool)
            .unwrap_or(false),
    })
}

/// slime's loss as rlft's: its registry name and configuration.
fn slime_loss(c: &Case<'_>) -> Result<(&'static str, PolicyLossConfig)> {
    let s = |k: &str| c.get(&["config", "slime", k]);
    let num = |k: &str| s(k).and_then(Value::as_f64);
    let name = match s("advantage_estimator").and_then(Value::as_str) {
        Some("cispo") => "cispo",
        _ => "ppo",
    };
    let mut cfg = LossRegistry::with_builtins()
        .resolve(name)
        .map_err(|e| c.algo(e))?
        .config;
    let eps = num("eps_clip").unwrap_or(0.2);
    cfg.clip_ratio_low = eps;
    cfg.clip_ratio_high = num("eps_clip_high").unwrap_or(eps);
    cfg.dual_clip = num("eps_clip_c");
    cfg.aggregation = LossAggregation::SampleMean;
    Ok((name, cfg))
}

pub(crate) fn policy_loss(c: &Case<'_>, cmp: &mut Compare) -> Result<()> {
    let s = |k: &str| c.get(&["config", "slime", k]);
    let num = |k: &str| s(k).and_then(Value::as_f64);
    let flag = |k: &str| s(k).and_then(Value::as_bool).unwrap_or(false);
    let (name, cfg) = slime_loss(c)?;
    let registry = LossRegistry::with_builtins();
    let log_prob = c.tensor::<2>("log_prob")?.require_grad();
    let [b, _] = log_prob.dims();
    let (mask, mask_v) = c.mask()?;
    let old = c.tensor::<2>("old_log_prob")?;
    let adv = c.tensor::<2>("advantages")?;
    let entropy = c.tensor::<2>("entropies")?;
    let batch = c
        .opt_num(&["config", "step_global_batch_size"])
        .unwrap_or(b as f64);
    let global = GlobalBatchInfo {
        global_batch_size: Some(batch),
        ..GlobalBatchInfo::local()
    };
    let mut input = PolicyLossInput::new(log_prob.clone(), old.clone(), adv.clone(), mask.clone())
        .with_global(global);
    let mut got = BTreeMap::new();
    let mut tensors: Vec<(&str, Tensor<2>)> = Vec::new();
    if flag("use_opsm") {
        let delta = num("opsm_delta").unwrap_or(0.0);
        let (keep, frac) =
            opsm_slime(&log_prob, &old, &adv, &mask, delta).map_err(|e| c.algo(e))?;
        input = input.with_loss_mask(keep.clone());
        got.insert("opsm_clipfrac".to_string(), c.host(&frac)?[0]);
        tensors.push(("opsm_mask", keep));
    }
    let mut metric_mask = mask.clone();
    let mut behaviour = None;
    if flag("use_tis") {
        let mu = c.tensor::<2>("rollout_log_prob")?;
        let mis = slime_mis(&old, &mu, &mask, &mis_config(c)?).map_err(|e| c.algo(e))?;
        input = input
            .with_rollout_is_weights(mis.weights.clone())
            .with_loss_mask(mis.mask.clone());
        metric_mask = mis.mask.clone();
        got.extend(mis.metrics);
        behaviour = Some(mu);
        tensors.push(("tis_weights", mis.weights));
        tensors.push(("modified_response_mask", mis.mask));
    }
    let out = registry
        .compute(name, &input, &cfg)
        .map_err(|e| c.algo(e))?;
    let m = out.metrics.read().map_err(|e| c.algo(e))?;
    let clipped = out
        .metrics
        .extras
        .get("clipped")
        .cloned()
        .ok_or_else(|| c.err("the loss reports no per-token clip indicator"))?;
    c.loss_and_grad(cmp, out.loss, &log_prob, "log_prob", Some(&mask_v))?;
    let one = GlobalBatchInfo {
        global_batch_size: Some(1.0),
        ..GlobalBatchInfo::local()
    };
    let sample_sum = |x: Tensor<2>, num_mask: &Tensor<2>| -> Result<f64> {
        let v = aggregate_loss(
            x * num_mask.clone(),
            &mask,
            LossAggregation::SampleMean,
            &one,
        )
        .map_err(|e| c.algo(e))?;
        Ok(c.host(&v)?[0])
    };
    let lp = log_prob.clone().detach();
    got.insert("loss".into(), m.pg_loss * batch);
    got.insert("pg_loss".into(), m.pg_loss * batch);
    got.insert("entropy_loss".into(), sample_sum(entropy, &metric_mask)?);
    got.insert("pg_clipfrac".into(), sample_sum(clipped, &metric_mask)?);
    got.insert(
        "ppo_kl".into(),
        sample_sum(old.clone() - lp.clone(), &metric_mask)?,
    );
    if let Some(mu) = behaviour {
        got.insert(
            "train_rollout_logprob_abs_diff".into(),
            sample_sum((old.clone() - mu).abs(), &metric_mask)?,
        );
    }
    got.insert("ois".into(), sample_sum((lp - old).exp(), &mask)?);
    for (key, t) in tensors {
        let want = c.want(&["outputs", key])?;
        cmp.tensor(key, &c.host(&t)?, &want, None, false);
    }
    cmp.metrics(c.metrics(), &got);
    Ok(())
}
