//! The CTPO authors' losses (`cum-token-cumprod`, `cum-token-geomean` and their `-la`
//! length-adaptive variants), with their `pg_update/*` diagnostics.

use crate::Result;
use crate::case::Case;
use crate::compare::Compare;
use crate::verl::{actor_clip, actor_metrics, run_loss};
use rlft_algo::clip::CtpoBounds;
use rlft_algo::diagnostics::quantile_sorted;
use rlft_algo::loss::LossRegistry;
use rlft_algo::masked::to_host;
use rlft_algo::ratio::RatioLevel;

/// Whether `loss_mode` is one of the authors' cumulative-token losses.
pub(crate) fn is_ctpo(loss_mode: &str) -> bool {
    loss_mode.starts_with("cum-token-")
}

pub(crate) fn policy_loss(c: &Case<'_>, cmp: &mut Compare) -> Result<()> {
    let mode = c.str(&["config", "loss_mode"])?;
    let (geometric, adaptive) = match mode {
        "cum-token-cumprod" => (false, false),
        "cum-token-geomean" => (true, false),
        "cum-token-cumprod-la" => (false, true),
        "cum-token-geomean-la" => (true, true),
        other => return Err(c.err(format!("unknown CTPO loss_mode '{other}'"))),
    };
    // Plain variants are vanilla PPO on the cumulative ratio; `-la` ones are rlft's `ctpo`.
    let name = if adaptive { "ctpo" } else { "ppo" };
    let registry = LossRegistry::with_builtins();
    let mut cfg = registry.resolve(name).map_err(|e| c.algo(e))?.config;
    actor_clip(c, &mut cfg, !adaptive);
    cfg.ratio_level = RatioLevel::Cumulative;
    cfg.cumulative_geometric_mean = geometric;
    cfg.aggregation = c.agg(&["config", "loss_agg_mode"])?;
    cfg.kl_coef = 0.0;
    let bounds = if adaptive {
        let la = |k: &str| c.num(&["config", "ctpo", k]);
        Some(CtpoBounds {
            c_low: la("la_clip_low")?,
            c_high: la("la_clip_high")?,
            c_dual: la("la_clip_c")?,
            power: la("clip_ratio_la_power")?,
        })
    } else {
        None
    };
    if let Some(b) = bounds {
        cfg.ctpo = b;
    }
    let loss = registry.get(name).map_err(|e| c.algo(e))?;
    let (m, metrics) = run_loss(c, cmp, loss.as_ref(), &cfg)?;
    let ratios = metrics.valid_ratios().map_err(|e| c.algo(e))?;
    let mask_v = c.host(&metrics.mask)?;

    let mut got = actor_metrics("vanilla", &m);
    let mut put = |k: &str, v: f64| {
        got.insert(format!("pg_update/{k}"), v);
    };
    let n = m.valid_tokens;
    let rate = |count: f64| if n > 0.0 { count / n } else { 0.0 };
    let stats = Stats::of(&ratios);
    put("is_ratio/mean", stats.mean);
    put("is_ratio/min", stats.min);
    put("is_ratio/max", stats.max);
    for (q, key) in [
        (0.25, "p25"),
        (0.5, "p50"),
        (0.75, "p75"),
        (0.9, "p90"),
        (0.95, "p95"),
        (0.99, "p99"),
    ] {
        put(&format!("is_ratio/{key}"), stats.quantile(q));
    }
    let total = m.clip_count_high + m.clip_count_low + m.clip_count_dual;
    for (key, count) in [
        ("high", m.clip_count_high),
        ("low", m.clip_count_low),
        ("dual", m.clip_count_dual),
        ("total", total),
    ] {
        put(&format!("clip/{key}/count"), count);
        put(&format!("clip/{key}/rate"), rate(count));
    }
    put("clip/valid_token_count", n);
    put("clip/neg_adv_token_count", m.neg_adv_tokens);
    if let Some(b) = bounds.filter(|b| b.power != 0.0) {
        let scale = to_host(&b.scale(&metrics.mask)).map_err(|e| c.algo(e))?;
        let mut s: Vec<f64> = scale
            .into_iter()
            .zip(&mask_v)
            .filter(|(_, m)| **m > 0.5)
            .map(|(s, _)| s)
            .collect();
        s.sort_by(f64::total_cmp);
        let st = Stats::of(&s);
        put("la_scale/mean", st.mean);
        put("la_scale/min", st.min);
        put("la_scale/max", st.max);
        put("la_scale/p50", st.quantile(0.5));
        let exp_mean =
            |c: f64| Stats::of(&s.iter().map(|x| (c * x).exp()).collect::<Vec<_>>()).mean;
        put("la_clip_high_ratio/mean", exp_mean(b.c_high));
        put("la_clip_low_ratio/mean", exp_mean(-b.c_low));
        put("la_clip_c_ratio/mean", exp_mean(b.c_dual));
    }
    cmp.metrics(c.metrics(), &got);
    Ok(())
}

/// Plain mean, extremes and quantiles of sorted values (0 when empty, as the authors report).
struct Stats<'a> {
    sorted: &'a [f64],
    mean: f64,
    min: f64,
    max: f64,
}

impl<'a> Stats<'a> {
    fn of(sorted: &'a [f64]) -> Self {
        let n = sorted.len();
        Self {
            sorted,
            mean: if n > 0 {
                sorted.iter().sum::<f64>() / n as f64
            } else {
                0.0
            },
            min: sorted.first().copied().unwrap_or(0.0),
            max: sorted.last().copied().unwrap_or(0.0),
        }
    }

    fn quantile(&self, q: f64) -> f64 {
        if self.sorted.is_empty() {
            0.0
        } else {
            quantile_sorted(self.sorted, q)
        }
    }
}
