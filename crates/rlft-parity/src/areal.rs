//! AReaL's `grpo_loss_fn` (`areal/grpo_loss_fn`): decoupled PPO with a recomputed or
//! log-linear proximal policy, M2PO masking and rejection sampling (ratio or KPop's binary KL).

use crate::Result;
use crate::case::Case;
use crate::compare::Compare;
use burn::tensor::Tensor;
use rlft_algo::decoupled::{
    RejectionAgg, RejectionConfig, RejectionLevel, RejectionMetric, loglinear_prox, m2po_mask,
    rejection_sampling,
};
use rlft_algo::loss::{LossRegistry, PolicyLossInput};
use serde_json::Value;
use std::collections::BTreeMap;

fn rejection_config(c: &Case<'_>) -> Result<Option<RejectionConfig>> {
    let Some(rs) = c
        .get(&["config", "areal", "rejection_sampling"])
        .filter(|v| !v.is_null())
    else {
        return Ok(None);
    };
    let s = |k: &str| rs.get(k).and_then(Value::as_str).unwrap_or("");
    if s("action") != "mask" {
        return Err(c.err(format!(
            "rejection action '{}' has no rlft mapping",
            s("action")
        )));
    }
    Ok(Some(RejectionConfig {
        level: match s("level") {
            "token" => RejectionLevel::Token,
            "sequence" => RejectionLevel::Sequence,
            o => return Err(c.err(format!("unknown rejection level '{o}'"))),
        },
        metric: match s("metric") {
            "ratio" => RejectionMetric::Ratio,
            "binary_kl" => RejectionMetric::BinaryKl,
            o => return Err(c.err(format!("unknown rejection metric '{o}'"))),
        },
        agg: match s("agg") {
            "mean" | "" => RejectionAgg::Mean,
            "sum" => RejectionAgg::Sum,
            "max" => RejectionAgg::Max,
            o => return Err(c.err(format!("unknown rejection agg '{o}'"))),
        },
        upper: rs
            .get("upper")
            .and_then(Value::as_f64)
            .ok_or_else(|| c.err("rejection_sampling without upper"))?,
        lower: rs.get("lower").and_then(Value::as_f64),
    }))
}

pub(crate) fn policy_loss(c: &Case<'_>, cmp: &mut Compare) -> Result<()> {
    let a = |k: &str| c.opt_num(&["config", "areal", k]);
    let log_prob = c.tensor::<2>("log_prob")?.require_grad();
    let (mask, mask_v) = c.mask()?;
    let mu = c.tensor::<2>("behave_log_prob")?;
    let prox = match c.opt_str(&["config", "areal", "prox_logp_method"]) {
        Some("loglinear") => loglinear_prox(
            &log_prob,
            &mu,
            &c.tensor("versions")?,
            &mask,
            a("current_version").unwrap_or(0.0) as i64,
        )
        .map_err(|e| c.algo(e))?,
        Some("recompute") | None => c.tensor("prox_log_prob_input")?,
        Some(o) => return Err(c.err(format!("prox_logp_method '{o}' has no rlft mapping"))),
    };
    let loss_mask = match a("m2_threshold") {
        Some(thr) => m2po_mask(&mu, &prox, &mask, thr).map_err(|e| c.algo(e))?,
        None => mask.clone(),
    };
    let rejection = match rejection_config(c)? {
        Some(cfg) => Some(rejection_sampling(&prox, &mu, &loss_mask, &cfg).map_err(|e| c.algo(e))?),
        None => None,
    };
    let registry = LossRegistry::with_builtins();
    let mut cfg = registry.resolve("ppo").map_err(|e| c.algo(e))?.config;
    let eps = a("eps_clip").unwrap_or(0.2);
    cfg.clip_ratio_low = eps;
    cfg.clip_ratio_high = a("eps_clip_higher").unwrap_or(eps);
    cfg.dual_clip = a("c_clip");
    let mut input = PolicyLossInput::new(
        log_prob.clone(),
        prox.clone(),
        c.tensor("advantages")?,
        loss_mask.clone(),
    )
    .with_behaviour_log_prob(mu.clone());
    if let Some(r) = &rejection {
        input = input.with_rollout_is_weights(r.weight.clone());
    }
    let out = registry
        .compute("ppo", &input, &cfg)
        .map_err(|e| c.algo(e))?;
    let m = out.metrics.read().map_err(|e| c.algo(e))?;
    c.loss_and_grad(cmp, out.loss, &log_prob, "log_prob", Some(&mask_v))?;
    let mut tensors: Vec<(&str, Tensor<2>, bool)> = vec![("prox_log_prob", prox, true)];
    if a("m2_threshold").is_some() {
        tensors.push(("m2po_loss_mask", loss_mask, false));
    }
    let mut got = BTreeMap::from([
        ("n_valid_tokens".to_string(), m.valid_tokens),
        (
            "clipped_tokens".to_string(),
            m.clip_count_low + m.clip_count_high,
        ),
        ("dual_clipped_tokens".to_string(), m.clip_count_dual),
        ("importance_weight/avg".to_string(), m.ratio_mean),
        (
            "clip_ratio/avg".to_string(),
            (m.clip_count_low + m.clip_count_high) / m.valid_tokens.max(1.0),
        ),
    ]);
    if let Some(r) = rejection {
        got.insert("behave_imp_weight/avg".into(), r.weight_mean);
        got.insert("behave_filtered_ratio/avg".into(), r.filtered_ratio);
        got.insert("rs_filtered_fraction".into(), r.filtered_fraction);
        tensors.push(("rs_loss_mask", r.mask, false));
        tensors.push(("behave_imp_weight", r.weight, false));
    }
    for (key, t, masked) in tensors {
        let want = c.want(&["outputs", key])?;
        let mask = masked.then_some(mask_v.as_slice());
        cmp.tensor(key, &c.host(&t)?, &want, mask, false);
    }
    cmp.metrics(c.metrics(), &got);
    Ok(())
}
