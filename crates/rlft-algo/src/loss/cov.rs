//! The covariance-guided losses of "The Entropy Mechanism of RL for Reasoning LMs": Clip-Cov and
//! KL-Cov. Both pick tokens by the covariance of advantage and log-prob **over the whole batch**,
//! so they are batch-coupled: a micro-batch selects among its own tokens only, and the loss is
//! not invariant to how a batch is split (unlike every other built-in loss).

use super::{LossContext, LossSettings, LossTerms, PolicyLoss, SettingError};
use crate::Result;
use crate::masked::{COUNT_EPS, from_host, to_host, zero_padding};
use burn::tensor::{Bool, Tensor};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use serde::{Deserialize, Serialize};

/// The fraction of the valid tokens a covariance loss selects (at least one).
fn check_fraction(key: &str, v: f64) -> std::result::Result<(), SettingError> {
    if v.is_finite() && v > 0.0 && v <= 1.0 {
        Ok(())
    } else {
        Err(SettingError::new(
            key,
            format!(
                "must be in (0, 1] (the fraction of tokens selected; verl's default 0.0002), got {v}"
            ),
        ))
    }
}

/// `[algorithm.clip_cov]`: which tokens Clip-Cov detaches.
#[derive(schemars::JsonSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClipCovSettings {
    /// Fraction of the valid tokens whose gradient is detached (at least one; verl's 0.0002).
    pub ratio: f64,
    /// Candidates have a covariance above this (verl's 1.0).
    pub lb: f64,
    /// Candidates have a covariance below this (verl's 5.0).
    pub ub: f64,
}

impl Default for ClipCovSettings {
    fn default() -> Self {
        Self {
            ratio: 0.0002,
            lb: 1.0,
            ub: 5.0,
        }
    }
}

impl LossSettings for ClipCovSettings {
    const SECTION: &'static str = "clip_cov";
    fn check(&self) -> std::result::Result<(), SettingError> {
        check_fraction("ratio", self.ratio)?;
        if self.lb.partial_cmp(&self.ub) != Some(std::cmp::Ordering::Less) {
            return Err(SettingError::new(
                "ub",
                format!(
                    "must be above lb (defaults 1.0 and 5.0), got lb = {}, ub = {}",
                    self.lb, self.ub
                ),
            ));
        }
        Ok(())
    }
}

/// `[algorithm.kl_cov]`: which tokens KL-Cov penalises, and how much.
#[derive(schemars::JsonSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KlCovSettings {
    /// Fraction of the valid tokens that get the |log ρ| penalty (at least one; verl's 0.0002).
    pub ratio: f64,
    /// Coefficient of the |log ρ| penalty (verl's `ppo_kl_coef`, 0.1).
    pub ppo_kl_coef: f64,
}

impl Default for KlCovSettings {
    fn default() -> Self {
        Self {
            ratio: 0.0002,
            ppo_kl_coef: 0.1,
        }
    }
}

impl LossSettings for KlCovSettings {
    const SECTION: &'static str = "kl_cov";
    fn check(&self) -> std::result::Result<(), SettingError> {
        check_fraction("ratio", self.ratio)?;
        SettingError::at_least("ppo_kl_coef", self.ppo_kl_coef, 0.0, true)
    }
}

/// Host copies of the per-token quantities the selection reads.
struct Tokens {
    adv: Vec<f64>,
    log_prob: Vec<f64>,
    valid: Vec<bool>,
}

impl Tokens {
    fn read(ctx: &LossContext<'_>) -> Result<Self> {
        let mask = to_host(&ctx.input.response_mask)?;
        Ok(Self {
            adv: to_host(&ctx.input.advantages)?,
            log_prob: to_host(&ctx.input.log_prob.clone().detach())?,
            valid: mask.iter().map(|m| *m > 0.5).collect(),
        })
    }

    fn n_valid(&self) -> usize {
        self.valid.iter().filter(|v| **v).count()
    }

    /// `max(1, ⌊ratio · n_valid⌋)`, verl's number of tokens to pick.
    fn quota(&self, ratio: f64) -> usize {
        ((ratio * self.n_valid() as f64) as usize).max(1)
    }

    /// A `[batch, T]` selection mask from picked element indices.
    fn selection(&self, picked: &[usize], like: &Tensor<2>) -> Tensor<2, Bool> {
        let mut sel = vec![0.0; self.valid.len()];
        for &k in picked {
            sel[k] = 1.0;
        }
        from_host(sel, like.dims(), like).greater_elem(0.5)
    }
}

/// Clip-Cov: PPO's clipped surrogate (no dual clip, no ±20 clamp), with the gradient detached on a
/// random subset of tokens whose covariance `(A − mean A)·(log πθ − mean log πθ)` lies in
/// `(lb, ub)` and that PPO did not clip already: `max(1, ⌊ratio·n⌋)` of them, drawn by a host
/// RNG seeded with the input's [`seed`](super::PolicyLossInput::seed) (vary it per step for fresh
/// draws).
#[derive(Debug, Clone, Default)]
pub struct ClipCov {
    /// The settings.
    pub settings: ClipCovSettings,
}

impl PolicyLoss for ClipCov {
    fn batch_coupled(&self) -> bool {
        true
    }

    fn terms(&self, ctx: &LossContext<'_>) -> Result<LossTerms> {
        let (cfg, s) = (ctx.config, &self.settings);
        let mask = &ctx.input.response_mask;
        let adv = ctx.input.advantages.clone();
        let ratio = ctx.token_log_ratio().exp();
        let unclipped = adv.clone().neg() * ratio.clone();
        let clipped = adv.clone().neg()
            * ratio
                .clone()
                .clamp(1.0 - cfg.clip_ratio_low, 1.0 + cfg.clip_ratio_high);
        let clip_by_origin = to_host(
            &clipped
                .clone()
                .greater(unclipped.clone())
                .float()
                .cast(mask.dtype()),
        )?;
        let tok = Tokens::read(ctx)?;
        let mean = |x: &[f64]| {
            let s: f64 = (0..x.len()).filter(|&k| tok.valid[k]).map(|k| x[k]).sum();
            s / (tok.n_valid() as f64 + COUNT_EPS)
        };
        let (adv_mean, lp_mean) = (mean(&tok.adv), mean(&tok.log_prob));
        let mut candidates: Vec<usize> = (0..tok.valid.len())
            .filter(|&k| {
                let cov = (tok.adv[k] - adv_mean) * (tok.log_prob[k] - lp_mean);
                tok.valid[k] && clip_by_origin[k] < 0.5 && cov > s.lb && cov < s.ub
            })
            .collect();
        let take = tok.quota(s.ratio).min(candidates.len());
        let mut rng = StdRng::seed_from_u64(ctx.input.seed);
        let (picked, _) = candidates.partial_shuffle(&mut rng, take);
        let selected = tok.selection(picked, mask);
        let loss = unclipped.max_pair(clipped).mask_fill(selected.clone(), 0.0);
        let (a_neg, _) = ctx.advantage_signs();
        let mut terms = LossTerms::per_token(loss);
        terms.clip_frac_low = Some(ctx.fraction(selected.clone().bool_and(a_neg.clone())));
        terms.clip_frac_high = Some(ctx.fraction(selected.bool_and(a_neg.bool_not())));
        terms.ratio = Some(ratio);
        Ok(terms)
    }
}

/// KL-Cov: the unclipped `−A·ρ` (no ±20 clamp), plus `ppo_kl_coef·|log ρ|` on the
/// `max(1, ⌊ratio·n⌋)` tokens with the largest covariance
/// `(A − mean A)·(log πθ − mean log πθ)` (plain means over valid tokens; first index on ties).
#[derive(Debug, Clone, Default)]
pub struct KlCov {
    /// The settings.
    pub settings: KlCovSettings,
}

impl PolicyLoss for KlCov {
    fn batch_coupled(&self) -> bool {
        true
    }

    fn terms(&self, ctx: &LossContext<'_>) -> Result<LossTerms> {
        let s = &self.settings;
        let d = ctx.token_log_ratio();
        let ratio = d.clone().exp();
        let base = ctx.input.advantages.clone().neg() * ratio.clone();
        let tok = Tokens::read(ctx)?;
        let valid: Vec<usize> = (0..tok.valid.len()).filter(|&k| tok.valid[k]).collect();
        let picked: Vec<usize> = if valid.is_empty() {
            Vec::new()
        } else {
            let n = valid.len() as f64;
            let adv_mean = valid.iter().map(|&k| tok.adv[k]).sum::<f64>() / n;
            let lp_mean = valid.iter().map(|&k| tok.log_prob[k]).sum::<f64>() / n;
            let cov = |k: usize| (tok.adv[k] - adv_mean) * (tok.log_prob[k] - lp_mean);
            let mut order = valid.clone();
            order.sort_by(|&a, &b| cov(b).total_cmp(&cov(a)));
            order.truncate(tok.quota(s.ratio));
            order
        };
        let selected = tok.selection(&picked, &ctx.input.response_mask);
        let penalty = zero_padding(d.abs(), &ctx.input.response_mask) * s.ppo_kl_coef;
        let penalty = penalty.mask_fill(selected.bool_not(), 0.0);
        let mut terms = LossTerms::per_token(base + penalty);
        terms.ratio = Some(ratio);
        Ok(terms)
    }
}
