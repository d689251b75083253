//! TRL 1.16's `GRPOTrainer._compute_loss`: `dapo`, `grpo`, `vespo` and `luspo` loss types, with
//! off-policy sequence masking, top-entropy masking and the bias-corrected KL.

use crate::Result;
use crate::case::Case;
use crate::compare::Compare;
use burn::tensor::Tensor;
use rlft_algo::aggregation::{GlobalBatchInfo, LossAggregation};
use rlft_algo::diagnostics::trl_clip_ratios;
use rlft_algo::filters::{opsm_trl, top_entropy_mask};
use rlft_algo::kl::KlEstimator;
use rlft_algo::loss::{LossRegistry, PolicyLoss, PolicyLossConfig, PolicyLossInput};
use rlft_algo::ratio::RatioLevel;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;

/// TRL's loss type as rlft's loss: its name, ratio level, configuration and the built loss.
fn trl_loss(
    c: &Case<'_>,
) -> Result<(
    &'static str,
    RatioLevel,
    PolicyLossConfig,
    Arc<dyn PolicyLoss>,
)> {
    let mode = c.str(&["config", "loss_mode"])?;
    let trl = |k: &str| c.get(&["config", "trl", k]);
    let num = |k: &str| trl(k).and_then(Value::as_f64);
    let (name, aggregation) = match mode {
        "trl/dapo" => ("ppo", LossAggregation::TokenMean),
        "trl/grpo" => ("ppo", LossAggregation::SampleMean),
        "trl/vespo" => ("vespo", LossAggregation::TokenMean),
        "trl/luspo" => ("luspo", LossAggregation::SeqMeanTokenSum),
        other => return Err(c.err(format!("unknown TRL loss_mode '{other}'"))),
    };
    let level = match trl("importance_sampling_level").and_then(Value::as_str) {
        Some("sequence") => RatioLevel::SequenceMean,
        Some("token") | None => RatioLevel::Token,
        Some(other) => return Err(c.err(format!("unknown importance_sampling_level '{other}'"))),
    };
    let registry = LossRegistry::with_builtins();
    let mut cfg = registry.resolve(name).map_err(|e| c.algo(e))?.config;
    let eps = num("epsilon").unwrap_or(0.2);
    cfg.clip_ratio_low = eps;
    cfg.clip_ratio_high = num("epsilon_high").unwrap_or(eps);
    cfg.dual_clip = None;
    cfg.ratio_level = level;
    cfg.aggregation = aggregation;
    cfg.kl_coef = num("beta").unwrap_or(0.0);
    cfg.kl_estimator = KlEstimator::K3;
    cfg.kl_bias_correction = trl("use_bias_correction_kl")
        .and_then(Value::as_bool)
        .unwrap_or(true);
    let vespo = serde_json::json!({
        "pos": [num("vespo_k_pos").unwrap_or(2.0), num("vespo_lambda_pos").unwrap_or(3.0)],
        "neg": [num("vespo_k_neg").unwrap_or(3.0), num("vespo_lambda_neg").unwrap_or(2.0)],
    });
    let settings = registry
        .section_of(name)
        .map_err(|e| c.algo(e))?
        .map(|_| vespo);
    let loss = registry
        .build(name, settings.as_ref())
        .map_err(|e| c.algo(e))?;
    Ok((name, level, cfg, loss))
}

pub(crate) fn policy_loss(c: &Case<'_>, cmp: &mut Compare) -> Result<()> {
    let num = |k: &str| c.get(&["config", "trl", k]).and_then(Value::as_f64);
    let (name, level, cfg, loss) = trl_loss(c)?;
    let log_prob = c.tensor::<2>("log_prob")?.require_grad();
    let [b, t] = log_prob.dims();
    let (mask, mask_v) = c.mask()?;
    let old = c.tensor::<2>("old_log_prob")?;
    let adv_row: Tensor<2> = c.tensor::<1>("advantages_seq")?.reshape([b, 1]);
    let adv = adv_row.clone().expand([b as i64, t as i64]);
    let entropy = c.tensor::<2>("entropies")?;
    // TRL's normalisers: num_items_in_batch tokens, every row of the batch.
    let global = GlobalBatchInfo {
        batch_num_tokens: num("num_items_in_batch"),
        global_batch_size: Some(b as f64),
        ..GlobalBatchInfo::local()
    };
    let mut input = PolicyLossInput::new(log_prob.clone(), old.clone(), adv.clone(), mask.clone())
        .with_entropy(entropy.clone())
        .with_global(global);
    if let Some(r) = c.opt_tensor("ref_log_prob")? {
        input = input.with_ref_log_prob(r);
    }
    if let Some(r) = c.opt_tensor("importance_sampling_ratio")? {
        input = input.with_sampling_is_ratio(r);
    }
    let mut masks: Vec<(&str, Tensor<2>)> = Vec::new();
    if let Some(delta) = num("off_policy_mask_threshold") {
        let mu = c.opt_tensor("sampling_log_prob")?.unwrap_or(old.clone());
        let keep = opsm_trl(&log_prob, &mu, &adv_row, &mask, delta).map_err(|e| c.algo(e))?;
        input = input.with_loss_mask(keep.clone());
        masks.push(("off_policy_mask", keep));
    }
    let rho = num("top_entropy_quantile").unwrap_or(1.0);
    if rho < 1.0 {
        let keep = top_entropy_mask(&entropy, &mask, rho).map_err(|e| c.algo(e))?;
        input = input.with_loss_mask(keep.clone());
        masks.push(("entropy_mask", keep));
    }
    let out = loss.compute(&input, &cfg).map_err(|e| c.algo(e))?;
    let m = out.metrics.read().map_err(|e| c.algo(e))?;
    let extras = out.metrics.read_extras().map_err(|e| c.algo(e))?;
    c.loss_and_grad(cmp, out.loss, &log_prob, "log_prob", Some(&mask_v))?;
    for (key, t) in masks {
        cmp.tensor(key, &c.host(&t)?, &c.want(&["outputs", key])?, None, false);
    }
    let mut got: BTreeMap<String, f64> = BTreeMap::new();
    got.extend(m.entropy.map(|v| ("entropy".to_string(), v)));
    got.extend(m.kl.map(|v| ("kl".to_string(), v)));
    if name != "vespo" {
        let ratio = c.host(&out.metrics.ratios)?;
        got.extend(trl_clip_ratios(
            &ratio,
            &c.host(&adv)?,
            &mask_v,
            [b, t],
            level == RatioLevel::SequenceMean,
            (cfg.clip_ratio_low, cfg.clip_ratio_high),
        ));
    }
    for (k, v) in &extras {
        if c.get(&["outputs", k]).is_some() {
            cmp.tensor(k, v, &c.want(&["outputs", k])?, None, false);
        } else if v.len() == 1 {
            got.insert(k.clone(), v[0]);
        }
    }
    cmp.metrics(c.metrics(), &got);
    Ok(())
}
