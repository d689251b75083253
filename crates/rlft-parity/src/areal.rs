//! AReaL's `grpo_loss_fn` (`areal/grpo_loss_fn`): decoupled PPO with a recomputed or
//! log-linear proximal policy, M2PO masking and rejection sampling (ratio or KPop's binary KL).

use crate::Result;
use crate::case::Case;
use crate::compare::Compare;
use burn::tensor::Tensor;
use rlft_algo::decoupled::{
    DecoupledConfig, RejectionAgg, RejectionConfig, RejectionLevel, RejectionMetric,
    prepare_decoupled,
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
    let mut input = PolicyLossInput::new(
        log_prob.clone(),
        c.tensor("behave_log_prob")?,
        c.tensor("advantages")?,
        mask,
    )
    .with_behaviour_log_prob(c.tensor("behave_log_prob")?);
    match c.opt_str(&["config", "areal", "prox_logp_method"]) {
        Some("loglinear") => input = input.with_versions(c.tensor("versions")?),
        Some("recompute") | None => {
            input = input.with_prox_log_prob(c.tensor("prox_log_prob_input")?)
        }
        Some(o) => return Err(c.err(format!("prox_logp_method '{o}' has no rlft mapping"))),
    }
    let dcfg = DecoupledConfig {
        current_version: a("current_version").map(|v| v as i64),
        m2_threshold: a("m2_threshold"),
        rejection: rejection_config(c)?,
    };
    let d = prepare_decoupled(input, &dcfg).map_err(|e| c.algo(e))?;
    let registry = LossRegistry::with_builtins();
    let mut cfg = registry.resolve("ppo").map_err(|e| c.algo(e))?.config;
    let eps = a("eps_clip").unwrap_or(0.2);
    cfg.clip_ratio_low = eps;
    cfg.clip_ratio_high = a("eps_clip_higher").unwrap_or(eps);
    cfg.dual_clip = a("c_clip");
    let out = registry
        .compute("ppo", &d.input, &cfg)
        .map_err(|e| c.algo(e))?;
    let m = out.metrics.read().map_err(|e| c.algo(e))?;
    c.loss_and_grad(cmp, out.loss, &log_prob, "log_prob", Some(&mask_v))?;
    let mut tensors: Vec<(&str, Tensor<2>, bool)> = vec![("prox_log_prob", d.prox_log_prob, true)];
    if let Some(m2) = d.m2po_mask {
        tensors.push(("m2po_loss_mask", m2, false));
    }
    let clipped = m.clip_count_low + m.clip_count_high;
    let mut got = BTreeMap::from([
        ("n_valid_tokens".to_string(), m.valid_tokens),
        ("clipped_tokens".to_string(), clipped),
        ("dual_clipped_tokens".to_string(), m.clip_count_dual),
        ("importance_weight/avg".to_string(), m.ratio_mean),
        (
            "clip_ratio/avg".to_string(),
            clipped / m.valid_tokens.max(1.0),
        ),
    ]);
    if let Some(r) = d.rejection {
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
