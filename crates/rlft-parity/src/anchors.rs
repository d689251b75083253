//! ROLL's TOPR, prime-rl's losses and its MaxRL advantages: thin mappings onto rlft's
//! registered losses and estimators.

use crate::Result;
use crate::case::Case;
use crate::compare::Compare;
use rlft_algo::advantage::{AdvantageEstimator, AdvantageInput};
use rlft_algo::aggregation::GlobalBatchInfo;
use rlft_algo::loss::{LossRegistry, PolicyLossInput};
use std::collections::BTreeMap;

/// ROLL `pg_variant="topr"` (`roll/topr`).
pub(crate) fn roll_topr(c: &Case<'_>, cmp: &mut Compare) -> Result<()> {
    let roll = |k: &str| c.opt_num(&["config", "roll", k]);
    let registry = LossRegistry::with_builtins();
    let mut cfg = registry.resolve("topr").map_err(|e| c.algo(e))?.config;
    let weights = serde_json::json!({"weights": [
        roll("topr_positive_weight").unwrap_or(1.0),
        roll("topr_negative_weight").unwrap_or(1.0),
    ]});
    let loss = registry
        .build("topr", Some(&weights))
        .map_err(|e| c.algo(e))?;
    cfg.aggregation = c.agg(&["config", "roll", "loss_agg_mode"])?;
    let log_prob = c.tensor::<2>("log_prob")?.require_grad();
    let (mask, mask_v) = c.mask()?;
    let global = GlobalBatchInfo {
        batch_num_tokens: roll("batch_num_tokens"),
        global_batch_size: roll("global_valid_samples"),
        ..GlobalBatchInfo::local()
    };
    let mut input = PolicyLossInput::new(
        log_prob.clone(),
        c.tensor("old_log_prob")?,
        c.tensor("advantages")?,
        mask,
    )
    .with_scores(c.tensor("scores")?)
    .with_global(global);
    if let Some(r) = c.opt_tensor("ref_log_prob")? {
        input = input.with_ref_log_prob(r);
    }
    let out = loss.compute(&input, &cfg).map_err(|e| c.algo(e))?;
    let extras = out.metrics.read_extras().map_err(|e| c.algo(e))?;
    c.loss_and_grad(cmp, out.loss, &log_prob, "log_prob", Some(&mask_v))?;
    let got: BTreeMap<String, f64> = extras
        .into_iter()
        .filter_map(|(k, v)| v.first().map(|x| (k, *x)))
        .collect();
    cmp.metrics(c.metrics(), &got);
    Ok(())
}

/// prime-rl's `compute_loss` with `default_loss_fn` (`prime_rl/default`) or `ipo_loss_fn`
/// (`prime_rl/ipo`).
pub(crate) fn prime_rl(c: &Case<'_>, cmp: &mut Compare) -> Result<()> {
    let name = match c.str(&["config", "loss_mode"])? {
        "prime_rl/default" => "prime_rl",
        "prime_rl/ipo" => "prime_rl_ipo",
        other => return Err(c.err(format!("unknown prime-rl loss_mode '{other}'"))),
    };
    let p = |k: &str| c.opt_num(&["config", "prime_rl", k]);
    let registry = LossRegistry::with_builtins();
    let mut cfg = registry.resolve(name).map_err(|e| c.algo(e))?.config;
    cfg.clip_ratio_low = p("dppo_mask_low").unwrap_or(0.2);
    cfg.clip_ratio_high = p("dppo_mask_high").unwrap_or(0.2);
    let mut settings = serde_json::json!({
        "adv_tau": p("adv_tau").unwrap_or(1.0),
        "kl_tau": p("kl_tau").unwrap_or(1e-3),
    });
    if name == "prime_rl_ipo" {
        settings["ipo_threshold"] = p("ipo_threshold").unwrap_or(0.1).into();
    }
    let loss = registry
        .build(name, Some(&settings))
        .map_err(|e| c.algo(e))?;
    let log_prob = c.tensor::<2>("log_prob")?.require_grad();
    let (mask, mask_v) = c.mask()?;
    let global = GlobalBatchInfo {
        batch_num_tokens: p("rl_scale"),
        ..GlobalBatchInfo::local()
    };
    let input = PolicyLossInput::new(
        log_prob.clone(),
        c.tensor("old_log_prob")?,
        c.tensor("advantages")?,
        mask,
    )
    .with_global(global);
    let out = loss.compute(&input, &cfg).map_err(|e| c.algo(e))?;
    let extras = out.metrics.read_extras().map_err(|e| c.algo(e))?;
    c.loss_and_grad(cmp, out.loss, &log_prob, "log_prob", Some(&mask_v))?;
    cmp.sample_metrics(c.get(&["outputs", "sample_metrics"]), &extras);
    cmp.metrics(c.metrics(), &BTreeMap::new());
    Ok(())
}

/// prime-rl's `MaxRLAlgorithm.score_group` (`prime_rl/max_rl`).
pub(crate) fn max_rl(c: &Case<'_>, cmp: &mut Compare) -> Result<()> {
    let (mask, mask_v) = c.mask()?;
    let (_, ids) = c.raw("inputs", "index")?;
    let input = AdvantageInput::new(c.tensor("token_level_rewards")?, mask)
        .with_groups(ids.iter().map(|v| *v as u64).collect());
    let out = AdvantageEstimator::MaxRl
        .compute(&input)
        .map_err(|e| c.algo(e))?;
    let want = c.want(&["outputs", "advantages"])?;
    cmp.tensor(
        "advantages",
        &c.host(&out.advantages)?,
        &want,
        Some(&mask_v),
        true,
    );
    if c.get(&["outputs", "returns"]).is_some() {
        let want = c.want(&["outputs", "returns"])?;
        cmp.tensor(
            "returns",
            &c.host(&out.returns)?,
            &want,
            Some(&mask_v),
            true,
        );
    }
    Ok(())
}
