//! verl 0.9.1's rollout correction (`rollout_correction`) and its bypass-mode policy loss.

use crate::Result;
use crate::case::Case;
use crate::compare::Compare;
use crate::verl::{actor_clip, actor_metrics};
use rlft_algo::correction::{CorrectionConfig, IsConfig, rollout_correction};
use rlft_algo::loss::{LossRegistry, PolicyLossInput};
use serde_json::Value;
use std::collections::BTreeMap;

/// A threshold as verl accepts it: a number or a string.
fn spec(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::Number(n) => Some(n.to_string()),
        Value::String(s) => Some(s.clone()),
        _ => None,
    }
}

/// verl's comma-separated lists (`"token_k1,seq_mean_k3"`, `"0.5_2.0,0.1"`).
fn split_list(s: &str) -> Vec<&str> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect()
}

/// The correction settings under `config` (`path` leads to the object holding verl's keys).
fn correction_config(c: &Case<'_>, path: &[&str]) -> Result<CorrectionConfig> {
    let key = |k: &str| {
        let mut p = path.to_vec();
        p.push(k);
        c.get(&p)
    };
    let mut cfg = CorrectionConfig::default();
    if let Some(level) = key("rollout_is").and_then(Value::as_str) {
        let threshold = spec(key("rollout_is_threshold")).unwrap_or_else(|| "2.0".into());
        cfg.is = Some(IsConfig {
            level: level.parse().map_err(|e| c.algo(e))?,
            threshold: threshold.parse().map_err(|e| c.algo(e))?,
            batch_normalize: key("rollout_is_batch_normalize")
                .and_then(Value::as_bool)
                .unwrap_or(false),
        });
    }
    if let Some(rs) = key("rollout_rs").and_then(Value::as_str) {
        let thresholds = spec(key("rollout_rs_threshold"))
            .ok_or_else(|| c.err("rollout_rs without rollout_rs_threshold"))?;
        let (filters, thresholds) = (split_list(rs), split_list(&thresholds));
        cfg = cfg
            .with_rejection(&filters, &thresholds)
            .map_err(|e| c.algo(e))?;
    }
    Ok(cfg)
}

fn prefixed(metrics: &BTreeMap<String, f64>) -> impl Iterator<Item = (String, f64)> + '_ {
    metrics
        .iter()
        .map(|(k, v)| (format!("rollout_corr/{k}"), *v))
}

/// `compute_rollout_correction_and_rejection_mask(train_log_prob, rollout_log_prob, ...)`.
pub(crate) fn correction_case(c: &Case<'_>, cmp: &mut Compare) -> Result<()> {
    let cfg = correction_config(c, &["config"])?;
    let (mask, _) = c.mask()?;
    let out = rollout_correction(
        &c.tensor("train_log_prob")?,
        &c.tensor("rollout_log_prob")?,
        &mask,
        &cfg,
    )
    .map_err(|e| c.algo(e))?;
    match (&out.weights, c.get(&["outputs", "rollout_is_weights"])) {
        (Some(w), Some(_)) => cmp.tensor(
            "rollout_is_weights",
            &c.host(w)?,
            &c.want(&["outputs", "rollout_is_weights"])?,
            None,
            false,
        ),
        (None, None) => {}
        (got, _) => {
            return Err(c.err(format!(
                "IS weights: rlft {} them, the reference {}",
                if got.is_some() {
                    "computed"
                } else {
                    "did not compute"
                },
                if got.is_some() {
                    "has none"
                } else {
                    "has them"
                }
            )));
        }
    }
    cmp.tensor(
        "modified_response_mask",
        &c.host(&out.mask)?,
        &c.want(&["outputs", "modified_response_mask"])?,
        None,
        false,
    );
    cmp.metrics(c.metrics(), &prefixed(&out.metrics).collect());
    Ok(())
}

/// verl's `bypass_mode` loss: μ (`old_log_prob`) anchors the ratio; IS weights and rejection of
/// the detached πθ against μ; PPO-clip ignores the weights, REINFORCE applies them.
pub(crate) fn bypass_loss(c: &Case<'_>, cmp: &mut Compare) -> Result<()> {
    let corr = ["config", "rollout_correction"];
    let cfg = correction_config(c, &corr)?;
    let loss_type = c
        .opt_str(&["config", "rollout_correction", "loss_type"])
        .unwrap_or("ppo_clip");
    let log_prob = c.tensor::<2>("log_prob")?.require_grad();
    let behaviour = c.tensor::<2>("old_log_prob")?;
    let (mask, mask_v) = c.mask()?;
    let correction = rollout_correction(&log_prob.clone().detach(), &behaviour, &mask, &cfg)
        .map_err(|e| c.algo(e))?;
    let registry = LossRegistry::with_builtins();
    let (name, weights) = match loss_type {
        "ppo_clip" => ("ppo", None),
        "reinforce" => ("reinforce_is", correction.weights),
        other => return Err(c.err(format!("unknown bypass loss_type '{other}'"))),
    };
    let mut loss_cfg = registry.resolve(name).map_err(|e| c.algo(e))?.config;
    actor_clip(c, &mut loss_cfg, name == "ppo");
    loss_cfg.aggregation = c.agg(&["config", "loss_agg_mode"])?;
    let mut input = PolicyLossInput::new(
        log_prob.clone(),
        behaviour,
        c.tensor("advantages")?,
        correction.mask,
    )
    .with_global(c.global());
    if let Some(w) = weights {
        input = input.with_rollout_is_weights(w);
    }
    let out = registry
        .compute(name, &input, &loss_cfg)
        .map_err(|e| c.algo(e))?;
    let m = out.metrics.read().map_err(|e| c.algo(e))?;
    c.loss_and_grad(cmp, out.loss, &log_prob, "log_prob", Some(&mask_v))?;
    let mut got = actor_metrics("vanilla", &m);
    got.extend(prefixed(&correction.metrics));
    cmp.metrics(c.metrics(), &got);
    Ok(())
}
