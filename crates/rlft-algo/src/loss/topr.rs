//! TOPR, tapered off-policy REINFORCE (ROLL's `pg_variant="topr"`): plain REINFORCE on rows
//! with a positive reward, REINFORCE weighted by the ratio truncated to `[0, 1]` on the others.

use super::{LossContext, LossSettings, LossTerms, LossValue, PolicyLoss, SettingError};
use crate::aggregation::LossAggregation;
use crate::masked::{COUNT_EPS, zero_padding};
use crate::{AlgoError, Result};
use burn::tensor::Tensor;
use serde::{Deserialize, Serialize};

/// `[algorithm.topr]`: ROLL's TOPR row weights.
#[derive(schemars::JsonSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ToprSettings {
    /// `[positive, negative]`: the weights of rows with a positive and a non-positive score
    /// (ROLL's default `[1, 1]`).
    pub weights: [f64; 2],
}

impl Default for ToprSettings {
    fn default() -> Self {
        Self {
            weights: [1.0, 1.0],
        }
    }
}

impl LossSettings for ToprSettings {
    const SECTION: &'static str = "topr";
    fn check(&self) -> std::result::Result<(), SettingError> {
        let [p, n] = self.weights;
        if p.is_finite() && n.is_finite() && p >= 0.0 && n >= 0.0 {
            Ok(())
        } else {
            Err(SettingError::new(
                "weights",
                format!("must both be finite and ≥ 0, got [{p}, {n}]"),
            ))
        }
    }
}

/// `L = w⁺·(−A·log πθ)` on rows with score `> 0`, `w⁻·(−sg(clamp(ρ, 0, 1))·A·log πθ)` on rows
/// with score `≤ 0` (`ρ = πθ/π_old` unclamped, `[w⁺, w⁻]` the settings' `weights`).
///
/// TOPR reduces its loss itself with ROLL's `agg_loss` and per-row sample weights
/// `B·1/(B + 1e-8)` (uniform weights normalised as ROLL does), `N` = `batch_num_tokens` and
/// `G` = `global_batch_size` (local counts when unset):
/// - `token-mean`: `Σ_i w_i Σ_t L·m / N`;
/// - `seq-mean-token-mean`: `Σ_i w_i [n_i>0] (Σ_t L·m / (n_i + 1e-8)) / (G + 1e-8)`;
/// - `seq-mean-token-sum`: `Σ_i w_i [n_i>0] Σ_t L·m / (G + 1e-8)`;
/// - `seq-mean-token-sum-norm`: `Σ_i w_i [n_i>0] Σ_t L·m / T` (`loss_scale_factor` replaces T).
///
/// Rollout IS weights and the loss mask multiply `L` before the reduction. Extras: ROLL's
/// `actor/*` metrics (see the docs' stale-samples chapter).
///
/// # Shapes
/// - scores `[batch]`, every other input `[batch, T]`.
#[derive(Debug, Clone, Default)]
pub struct Topr {
    /// The settings.
    pub settings: ToprSettings,
}

/// ROLL's `agg_loss` with optional per-row weights (`[batch, 1]`) and normalisers.
fn roll_agg(
    loss: Tensor<2>,
    mask: &Tensor<2>,
    mode: LossAggregation,
    weights: Option<&Tensor<2>>,
    tokens: Option<f64>,
    samples: Option<f64>,
    width: Option<f64>,
) -> Result<Tensor<1>> {
    let [_, t] = mask.dims();
    let rows = zero_padding(loss, mask).sum_dim(1);
    let rows = match weights {
        Some(w) => rows * w.clone(),
        None => rows,
    };
    let n = mask.clone().sum_dim(1);
    let nonempty = n.clone().greater_elem(0.5).float().cast(mask.dtype());
    let g = || match samples {
        Some(g) => n.zeros_like().sum() + g,
        None => nonempty.clone().sum(),
    };
    let out = match mode {
        LossAggregation::TokenMean => {
            let total = rows.sum();
            match tokens {
                Some(n) => total * (1.0 / n.max(1.0)),
                None => total / mask.clone().sum().clamp_min(1.0),
            }
        }
        LossAggregation::SeqMeanTokenMean => {
            (rows / (n.clone() + COUNT_EPS) * nonempty.clone()).sum() / (g() + COUNT_EPS)
        }
        LossAggregation::SeqMeanTokenSum => (rows * nonempty.clone()).sum() / (g() + COUNT_EPS),
        LossAggregation::SeqMeanTokenSumNorm => {
            (rows * nonempty.clone()).sum() * (1.0 / width.unwrap_or(t as f64))
        }
        other => {
            return Err(AlgoError::InvalidSpec {
                name: "loss aggregation".into(),
                value: other.to_string(),
                allowed: "TOPR reduces with ROLL's agg_loss: token-mean, seq-mean-token-mean, seq-mean-token-sum or seq-mean-token-sum-norm".into(),
            });
        }
    };
    Ok(out.reshape([1]))
}

impl PolicyLoss for Topr {
    fn terms(&self, ctx: &LossContext<'_>) -> Result<LossTerms> {
        let input = ctx.input;
        let mask = &input.response_mask;
        let [b, _] = mask.dims();
        let scores = ctx.scores("topr")?;
        let dtype = input.log_prob.dtype();
        let pos = scores.clone().greater_elem(0.0).float().cast(dtype);
        let neg = pos.clone().neg() + 1.0;
        let pos2: Tensor<2> = pos.clone().unsqueeze_dim(1);
        let neg2: Tensor<2> = neg.clone().unsqueeze_dim(1);
        let adv = zero_padding(input.advantages.clone(), mask);
        let lp = zero_padding(input.log_prob.clone(), mask);
        let log_r = ctx.token_log_ratio();
        let ratio = log_r.clone().exp();
        let truncated = ratio.clone().clamp(0.0, 1.0).detach();
        let pos_loss = (adv.clone() * lp.clone()).neg() * pos2.clone();
        let neg_loss = (truncated * adv * lp).neg() * neg2.clone();
        let [wp, wn] = self.settings.weights;
        let loss = pos_loss.clone() * wp + neg_loss.clone() * wn;
        let loss = match &input.rollout_is_weights {
            Some(w) => loss * w.clone(),
            None => loss,
        };
        let loss = match &input.loss_mask {
            Some(k) => loss * k.clone(),
            None => loss,
        };
        let weights = pos2.ones_like() * (b as f64 / (b as f64 + COUNT_EPS));
        let total = weighted_agg(ctx, loss.clone(), mask, Some(&weights))?;
        let parts = ToprParts {
            scores,
            pos,
            neg,
            pos2,
            neg2,
            ratio: ratio.clone(),
            log_r,
            loss,
            total: total.clone(),
            weights,
            pos_loss,
            neg_loss,
        };
        let extras = parts.metrics(ctx, [wp, wn])?;
        let mut terms = LossTerms::from_value(LossValue::Reduced(total));
        for (k, t) in extras {
            terms.extras.insert(k.into(), t.detach().reshape([1, 1]));
        }
        terms.ratio = Some(ratio.detach());
        Ok(terms)
    }
}

/// What TOPR's metrics read of its loss (`[B]` per row, `[B, T]` per token).
struct ToprParts {
    scores: Tensor<1>,
    pos: Tensor<1>,
    neg: Tensor<1>,
    pos2: Tensor<2>,
    neg2: Tensor<2>,
    ratio: Tensor<2>,
    log_r: Tensor<2>,
    loss: Tensor<2>,
    total: Tensor<1>,
    weights: Tensor<2>,
    pos_loss: Tensor<2>,
    neg_loss: Tensor<2>,
}

impl ToprParts {
    /// ROLL's `actor/*` metrics of the step, with the positive and negative weights `[wp, wn]`.
    fn metrics(
        self,
        ctx: &LossContext<'_>,
        weights: [f64; 2],
    ) -> Result<Vec<(&'static str, Tensor<1>)>> {
        let mut v = self.actor_metrics(ctx)?;
        v.extend(self.topr_metrics(ctx, weights)?);
        Ok(v)
    }

    /// The metrics ROLL's actor reports for every loss: ratios, losses, KL, samples, weights.
    fn actor_metrics(&self, ctx: &LossContext<'_>) -> Result<Vec<(&'static str, Tensor<1>)>> {
        let input = ctx.input;
        let mask = &input.response_mask;
        let [b, _] = mask.dims();
        let samples = input.global.global_batch_size;
        let det = |x: Tensor<2>| x.detach();
        let n = mask.clone().sum_dim(1);
        let g = match samples {
            Some(g) => n.zeros_like().sum() + g,
            None => n
                .clone()
                .greater_elem(0.5)
                .float()
                .cast(input.log_prob.dtype())
                .sum(),
        };
        let valid = mask.clone().greater_elem(0.5);
        let r = det(self.ratio.clone());
        let lr = det(self.log_r.clone());
        let rows = |x: Tensor<1>| x * (1.0 / b.max(1) as f64);
        let ratio_mean = roll_agg(
            r.clone(),
            mask,
            LossAggregation::SeqMeanTokenMean,
            None,
            None,
            samples,
            None,
        )?;
        let mut v = vec![
            ("actor/ratio_mean@sum", ratio_mean),
            ("actor/ratio_max@max", zero_padding(r.clone(), mask).max()),
            (
                "actor/ratio_min@min",
                r.clone().mask_fill(valid.bool_not(), 1e10).min(),
            ),
            ("actor/pg_loss@sum", agg(ctx, det(self.loss.clone()), mask)?),
            ("actor/weighted_pg_loss@sum", self.total.clone().detach()),
            ("actor/total_loss@sum", self.total.clone().detach()),
            (
                "actor/approxkl@sum",
                agg(ctx, lr.clone().square() * 0.5, mask)?,
            ),
            ("actor/policykl@sum", agg(ctx, lr, mask)?),
            ("actor/valid_samples@sum", g.clone()),
            ("actor/total_samples@sum", g.zeros_like() + b as f64),
            ("actor/valid_sample_ratio", g * (1.0 / b.max(1) as f64)),
            (
                "actor/sample_weights_mean",
                rows(self.weights.clone().sum()),
            ),
            ("actor/sample_weights_min", self.weights.clone().min()),
            ("actor/sample_weights_max", self.weights.clone().max()),
        ];
        if let Some(rf) = &input.ref_log_prob {
            let x = zero_padding(rf.clone() - input.log_prob.clone().detach(), mask);
            let kl = (x.clone().exp() - x - 1.0).clamp(-10.0, 10.0);
            v.push(("actor/kl_loss@sum", agg(ctx, kl, mask)?));
        }
        Ok(v)
    }

    /// TOPR's own metrics: positive and negative rows, their scores, weights and losses.
    fn topr_metrics(
        &self,
        ctx: &LossContext<'_>,
        [wp, wn]: [f64; 2],
    ) -> Result<Vec<(&'static str, Tensor<1>)>> {
        let mask = &ctx.input.response_mask;
        let [b, _] = mask.dims();
        let (pos, neg) = (&self.pos, &self.neg);
        let pos_mask = mask.clone() * self.pos2.clone();
        let neg_mask = mask.clone() * self.neg2.clone();
        let scores_mean = self.scores.clone().sum() * (1.0 / b.max(1) as f64);
        let centered = self.scores.clone() - scores_mean.clone();
        let std = (centered.square().sum() * (1.0 / (b.max(2) - 1) as f64)).sqrt();
        let (pos_loss, neg_loss) = (
            self.pos_loss.clone().detach(),
            self.neg_loss.clone().detach(),
        );
        Ok(vec![
            ("actor/topr_positive_samples@sum", pos.clone().sum()),
            ("actor/topr_negative_samples@sum", neg.clone().sum()),
            (
                "actor/topr_positive_ratio",
                pos.clone().sum() * (1.0 / (b as f64 + COUNT_EPS)),
            ),
            (
                "actor/topr_negative_ratio",
                neg.clone().sum() * (1.0 / (b as f64 + COUNT_EPS)),
            ),
            ("actor/topr_scores_mean", scores_mean.clone()),
            ("actor/topr_scores_std", std),
            ("actor/topr_positive_weight", scores_mean.zeros_like() + wp),
            ("actor/topr_negative_weight", scores_mean.zeros_like() + wn),
            (
                "actor/topr_positive_loss",
                agg(ctx, pos_loss.clone(), &pos_mask)?,
            ),
            (
                "actor/topr_negative_loss",
                agg(ctx, neg_loss.clone(), &neg_mask)?,
            ),
            (
                "actor/topr_weighted_positive_loss",
                agg(ctx, pos_loss * wp, &pos_mask)?,
            ),
            (
                "actor/topr_weighted_negative_loss",
                agg(ctx, neg_loss * wn, &neg_mask)?,
            ),
        ])
    }
}

/// `x` over `m` aggregated as ROLL aggregates the loss (the run's mode and normalisers), rows
/// unweighted.
fn agg(ctx: &LossContext<'_>, x: Tensor<2>, m: &Tensor<2>) -> Result<Tensor<1>> {
    weighted_agg(ctx, x, m, None)
}

/// `x` over `m` aggregated as ROLL aggregates the loss, each row weighted by `w` when given.
fn weighted_agg(
    ctx: &LossContext<'_>,
    x: Tensor<2>,
    m: &Tensor<2>,
    w: Option<&Tensor<2>>,
) -> Result<Tensor<1>> {
    let g = &ctx.input.global;
    roll_agg(
        x,
        m,
        ctx.config.aggregation,
        w,
        g.batch_num_tokens,
        g.global_batch_size,
        g.loss_scale_factor,
    )
}

#[cfg(test)]
mod tests {
    use crate::AlgoError;
    use crate::loss::{LossRegistry, PolicyLossConfig, PolicyLossInput};
    use crate::masked::to_host;
    use burn::tensor::{DType, Device, Tensor, TensorData};

    use crate::testing::t2_on as t2;

    /// A rewarded row learns as plain REINFORCE; an unrewarded row whose ratio grew above 1 is
    /// capped at weight 1, one whose ratio shrank keeps it; no scores is an error.
    #[test]
    fn positive_rows_are_reinforce_negative_rows_truncated() {
        let dev = Device::flex().autodiff();
        let lp = t2(vec![-1.0, -1.0, -0.5, -2.0], 2, 2, &dev).require_grad();
        let old = t2(vec![-0.5, -1.5, -1.0, -1.0], 2, 2, &dev);
        let adv = t2(vec![1.0, 1.0, -1.0, -1.0], 2, 2, &dev);
        let mask = t2(vec![1.0; 4], 2, 2, &dev);
        let scores = Tensor::from_data(TensorData::new(vec![1.0, 0.0], [2]), (&dev, DType::F64));
        let cfg = PolicyLossConfig::new();
        let input = PolicyLossInput::new(lp.clone(), old, adv, mask);
        let registry = LossRegistry::with_builtins();
        let err = registry.compute("topr", &input, &cfg).unwrap_err();
        assert!(matches!(
            err,
            AlgoError::MissingInput {
                input: "scores",
                ..
            }
        ));
        let out = registry
            .compute("topr", &input.with_scores(scores), &cfg)
            .unwrap();
        let g = to_host(&lp.grad(&out.loss.backward()).unwrap()).unwrap();
        let w = 2.0 / (2.0 + 1e-8) / 4.0;
        let want = [-w, -w, w, w * (-1.0f64).exp()];
        for (g, w) in g.iter().zip(want) {
            assert!((g - w).abs() < 1e-12, "{g} vs {w}");
        }
    }
}
