//! verl 0.9.1's core kinds: policy losses, advantages, KL penalties, entropy, log-probs and
//! the value loss.

use crate::Result;
use crate::case::Case;
use crate::compare::Compare;
use burn::tensor::{Int, Tensor, TensorData};
use rlft_algo::advantage::{AdvantageEstimator, AdvantageInput};
use rlft_algo::aggregation::{GlobalBatchInfo, aggregate_loss};
use rlft_algo::entropy::entropy_from_logits;
use rlft_algo::kl::{KlEstimator, kl_penalty};
use rlft_algo::logprob::logprobs_from_logits;
use rlft_algo::loss::{
    LossRegistry, MetricValues, PolicyLoss, PolicyLossConfig, PolicyLossInput, PolicyLossMetrics,
};
use rlft_algo::value::clipped_value_loss;
use serde_json::Value;
use std::collections::BTreeMap;

/// verl's clip settings from `config.actor` applied to `cfg`. `uses_c`: the loss reads
/// `clip_ratio_c` (vanilla PPO always dual-clips with it, DPPO truncates its ratio at it).
pub(crate) fn actor_clip(c: &Case<'_>, cfg: &mut PolicyLossConfig, uses_c: bool) {
    let actor = |k: &str| c.opt_num(&["config", "actor", k]);
    let clip = actor("clip_ratio").unwrap_or(0.2);
    cfg.clip_ratio_low = actor("clip_ratio_low").unwrap_or(clip);
    cfg.clip_ratio_high = actor("clip_ratio_high").unwrap_or(clip);
    cfg.dual_clip = uses_c.then(|| actor("clip_ratio_c").unwrap_or(3.0));
}

/// rlft's loss metrics under verl's `actor/*` names.
pub(crate) fn actor_metrics(mode: &str, m: &MetricValues) -> BTreeMap<String, f64> {
    // geo_mean splits its clip fraction by the advantage's sign; the clipped surrogates by bound.
    let (clipfrac, lower) = match mode {
        "geo_mean" => (m.clip_frac_high, m.clip_frac_low),
        _ => (m.clip_frac_low + m.clip_frac_high, m.clip_frac_dual),
    };
    // KL-Cov reports the mean absolute log-ratio under verl's `ppo_kl` name.
    let kl = if mode == "kl_cov" {
        m.mean_abs_log_ratio
    } else {
        m.approx_kl
    };
    [
        ("actor/pg_clipfrac", clipfrac),
        ("actor/pg_clipfrac_lower", lower),
        ("actor/ppo_kl", kl),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

pub(crate) fn policy_loss(c: &Case<'_>, cmp: &mut Compare) -> Result<()> {
    let mode = c.str(&["config", "loss_mode"])?;
    let name = match mode {
        "vanilla" => "ppo",
        other => other,
    };
    let registry = LossRegistry::with_builtins();
    let mut cfg = registry.resolve(name).map_err(|e| c.algo(e))?.config;
    actor_clip(
        c,
        &mut cfg,
        matches!(mode, "vanilla" | "dppo_tv" | "dppo_kl"),
    );
    cfg.aggregation = c.agg(&["config", "loss_agg_mode"])?;
    cfg.kl_coef = 0.0;
    // The loss's own settings, under the names of its recipe section.
    let actor = |k: &str| c.opt_num(&["config", "actor", k]);
    let policy = |k: &str| c.opt_num(&["config", "policy_loss", k]);
    let keys: &[(&str, Option<f64>)] = match name {
        "sapo" => &[("tau_pos", actor("tau_pos")), ("tau_neg", actor("tau_neg"))],
        "dro" => &[("beta", policy("dro_beta"))],
        "clip_cov" => &[
            ("ratio", policy("clip_cov_ratio")),
            ("lb", policy("clip_cov_lb")),
            ("ub", policy("clip_cov_ub")),
        ],
        "kl_cov" => &[
            ("ratio", policy("kl_cov_ratio")),
            ("ppo_kl_coef", policy("ppo_kl_coef")),
        ],
        _ => &[],
    };
    let settings: serde_json::Map<String, Value> = keys
        .iter()
        .filter_map(|(k, v)| v.map(|v| (k.to_string(), v.into())))
        .collect();
    let settings = (!keys.is_empty()).then_some(Value::Object(settings));
    let loss = registry
        .build(name, settings.as_ref())
        .map_err(|e| c.algo(e))?;
    let (m, _) = run_loss(c, cmp, loss.as_ref(), &cfg)?;
    cmp.metrics(c.metrics(), &actor_metrics(mode, &m));
    Ok(())
}

/// Runs `loss` with `cfg` on the case's `log_prob`, `old_log_prob`,
/// `advantages`, `response_mask`, global batch info and optional `rollout_is_weights`; compares
/// the loss and its gradient; returns the metrics (read and as tensors).
pub(crate) fn run_loss(
    c: &Case<'_>,
    cmp: &mut Compare,
    loss: &dyn PolicyLoss,
    cfg: &PolicyLossConfig,
) -> Result<(MetricValues, PolicyLossMetrics)> {
    let log_prob = c.tensor::<2>("log_prob")?.require_grad();
    let (mask, mask_v) = c.mask()?;
    let mut input = PolicyLossInput::new(
        log_prob.clone(),
        c.tensor("old_log_prob")?,
        c.tensor("advantages")?,
        mask,
    )
    .with_global(c.global());
    if let Some(w) = c.opt_tensor("rollout_is_weights")? {
        input = input.with_rollout_is_weights(w);
    }
    let out = loss.compute(&input, cfg).map_err(|e| c.algo(e))?;
    let m = out.metrics.read().map_err(|e| c.algo(e))?;
    c.loss_and_grad(cmp, out.loss, &log_prob, "log_prob", Some(&mask_v))?;
    Ok((m, out.metrics))
}

pub(crate) fn advantage(c: &Case<'_>, cmp: &mut Compare) -> Result<()> {
    let eps = c.opt_num(&["config", "epsilon"]).unwrap_or(1e-6);
    let gamma = c
        .opt_num(&["config", "gamma"])
        .or_else(|| c.opt_num(&["config", "config.gamma"]));
    let norm = ["norm_adv_by_std_in_grpo", "config.norm_adv_by_std_in_grpo"]
        .iter()
        .find_map(|k| c.get(&["config", k]).and_then(Value::as_bool))
        .unwrap_or(true);
    let est = match c.str(&["config", "estimator"])? {
        "grpo" => AdvantageEstimator::Grpo {
            norm_by_std: norm,
            epsilon: eps,
        },
        "grpo_passk" => AdvantageEstimator::GrpoPassk {
            norm_by_std: norm,
            epsilon: eps,
        },
        "gpg" => AdvantageEstimator::Gpg {
            f_norm: c.opt_num(&["config", "f_norm"]).unwrap_or(1.0),
        },
        "opo" => AdvantageEstimator::Opo,
        "remax" => AdvantageEstimator::Remax,
        "rloo" => AdvantageEstimator::Rloo,
        "reinforce_plus_plus" => AdvantageEstimator::ReinforcePlusPlus {
            gamma: gamma.unwrap_or(1.0),
        },
        "reinforce_plus_plus_baseline" => AdvantageEstimator::ReinforcePlusPlusBaseline,
        "gae" => AdvantageEstimator::Gae {
            gamma: gamma.unwrap_or(1.0),
            lam: c.num(&["config", "lam"])?,
        },
        other => {
            return Err(c.err(format!("advantage estimator '{other}' has no rlft mapping")));
        }
    };
    let (mask, mask_v) = c.mask()?;
    let mut input = AdvantageInput::new(c.tensor("token_level_rewards")?, mask);
    if c.get(&["inputs", "index"]).is_some() {
        let (_, ids) = c.raw("inputs", "index")?;
        input = input.with_groups(ids.iter().map(|v| *v as u64).collect());
    }
    if let Some(v) = c.opt_tensor("values")? {
        input = input.with_values(v);
    }
    if c.get(&["inputs", "reward_baselines"]).is_some() {
        input = input.with_reward_baselines(c.raw("inputs", "reward_baselines")?.1);
    }
    let out = est.compute(&input).map_err(|e| c.algo(e))?;
    for (name, got) in [("advantages", &out.advantages), ("returns", &out.returns)] {
        let want = c.want(&["outputs", name])?;
        cmp.tensor(name, &c.host(got)?, &want, Some(&mask_v), false);
    }
    Ok(())
}

pub(crate) fn kl(c: &Case<'_>, cmp: &mut Compare) -> Result<()> {
    let est: KlEstimator = c
        .str(&["config", "kl_penalty"])?
        .parse()
        .map_err(|e| c.algo(e))?;
    let log_prob = c.tensor::<2>("log_prob")?.require_grad();
    let (mask, mask_v) = c.mask()?;
    let reference = c.tensor("ref_log_prob")?;
    let kl = kl_penalty(log_prob.clone(), reference, est, Some(&mask)).map_err(|e| c.algo(e))?;
    per_token_term(c, cmp, "kl", kl, (&mask, &mask_v), &log_prob, "log_prob")
}

pub(crate) fn entropy(c: &Case<'_>, cmp: &mut Compare) -> Result<()> {
    let logits = c.tensor::<3>("logits")?.require_grad();
    let (mask, mask_v) = c.mask()?;
    let h = entropy_from_logits(logits.clone(), None).map_err(|e| c.algo(e))?;
    per_token_term(c, cmp, "entropy", h, (&mask, &mask_v), &logits, "logits")
}

/// Compares a per-token quantity (where masked), its locally aggregated loss and the gradient of
/// that loss with respect to `leaf`.
fn per_token_term<const D: usize>(
    c: &Case<'_>,
    cmp: &mut Compare,
    name: &str,
    values: Tensor<2>,
    (mask, mask_v): (&Tensor<2>, &[f64]),
    leaf: &Tensor<D>,
    leaf_name: &str,
) -> Result<()> {
    let mode = c.agg(&["config", "loss_agg_mode"])?;
    let loss = aggregate_loss(values.clone(), mask, mode, &GlobalBatchInfo::local())
        .map_err(|e| c.algo(e))?;
    let want = c.want(&["outputs", name])?;
    cmp.tensor(name, &c.host(&values)?, &want, Some(mask_v), false);
    c.loss_and_grad(cmp, loss, leaf, leaf_name, Some(mask_v))
}

pub(crate) fn logprob(c: &Case<'_>, cmp: &mut Compare) -> Result<()> {
    let logits = c.tensor::<3>("logits")?.require_grad();
    let (shape, labels) = c.raw("inputs", "labels")?;
    let dims: [usize; 2] = shape
        .try_into()
        .map_err(|_| c.err("labels must be [B, T]"))?;
    let labels: Vec<i64> = labels.iter().map(|v| *v as i64).collect();
    let labels = Tensor::<2, Int>::from_data(TensorData::new(labels, dims), &c.device);
    let lp = logprobs_from_logits(logits.clone(), labels, None).map_err(|e| c.algo(e))?;
    let loss = (lp.clone() * c.tensor::<2>("upstream")?).sum();
    cmp.tensor(
        "log_prob",
        &c.host(&lp)?,
        &c.want(&["outputs", "log_prob"])?,
        None,
        false,
    );
    c.loss_and_grad(cmp, loss, &logits, "logits", None)
}

pub(crate) fn value_loss(c: &Case<'_>, cmp: &mut Compare) -> Result<()> {
    let mode = c.agg(&["config", "loss_agg_mode"])?;
    let vpreds = c.tensor::<2>("vpreds")?.require_grad();
    let (mask, mask_v) = c.mask()?;
    let (loss, frac) = clipped_value_loss(
        vpreds.clone(),
        c.tensor("values")?,
        c.tensor("returns")?,
        &mask,
        c.num(&["config", "cliprange_value"])?,
        mode,
        &GlobalBatchInfo::local(),
    )
    .map_err(|e| c.algo(e))?;
    let got = BTreeMap::from([("vf_clipfrac".to_string(), c.host(&frac)?[0])]);
    cmp.metrics(c.metrics(), &got);
    c.loss_and_grad(cmp, loss, &vpreds, "vpreds", Some(&mask_v))
}
