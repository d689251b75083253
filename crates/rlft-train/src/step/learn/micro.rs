//! A micro-batch's loss: its per-token inputs laid out beside the packed rows, the correction
//! against μ, the sequence and entropy masks, the policy loss from the registry and, replaying
//! sampling masks, the mass outside the kept sets.

use super::Learn;
use crate::Result;
use crate::TrainError;
use crate::batch::{Row, aligned, per_token, t2};
use crate::chunked::{LossOut, Scores};
use crate::correction::{CorrectionMode, Opsm};
use crate::host;
use crate::offpolicy::StepDiagnostics;
use burn::tensor::{Device, Tensor, TensorData};
use rlft_algo::aggregation::{GlobalBatchInfo, aggregate_loss};
use rlft_algo::decoupled::loglinear_prox;
use rlft_algo::filters::{opsm_slime, opsm_trl, top_entropy_mask};
use rlft_algo::loss::{MetricValues, PolicyLossInput};
use rlft_algo::masked::masked_mean;
use rlft_rollout::LearnerBatch;

impl Learn<'_> {
    /// A micro-batch's per-token inputs to the loss, laid out on `device`.
    pub(super) fn micro_inputs(
        &self,
        ids: &LearnerBatch,
        refs: &[&Row],
        device: &Device,
    ) -> MicroInputs {
        let per_token = |field: &dyn Fn(&Row) -> &[f32]| per_token(ids, refs, field);
        let off = &self.learner.algo.offpolicy;
        let bypass = off.mode == CorrectionMode::Bypass;
        let trl_opsm = matches!(off.opsm, Some((Opsm::Trl, _)));
        let width = ids.response_len();
        // μ, laid out once: on the host for a per-micro-batch correction (bypass, or decoupled
        // with the log-linear π_prox), on the device where a tensor needs it.
        let mu_h = if bypass || off.loglinear_prox || trl_opsm {
            aligned(refs, width, |r| &r.behaviour_lp)
        } else {
            Vec::new()
        };
        let mu =
            (off.loglinear_prox || trl_opsm).then(|| t2(device, mu_h.clone(), refs.len(), width));
        MicroInputs {
            mask: per_token(&|r| &r.mask),
            old: per_token(&|r| &r.old_lp),
            adv: per_token(&|r| &r.adv),
            weights: refs
                .iter()
                .all(|r| r.is_w.is_some())
                .then(|| per_token(&|r| r.is_w.as_deref().unwrap_or(&[]))),
            // Rows carry the reference's log-probs when the run has a reference.
            ref_lp: refs
                .iter()
                .all(|r| r.ref_lp.is_some())
                .then(|| per_token(&|r| r.ref_lp.as_deref().unwrap_or(&[]))),
            mu_h,
            mu,
            // Decoupled with the log-linear π_prox: built per micro-batch from μ, πθ and the
            // token versions (no π_old pass ran).
            versions: off.loglinear_prox.then(|| per_token(&|r| &r.versions)),
            scores: Tensor::<1>::from_data(
                TensorData::new(
                    refs.iter().map(|r| r.score).collect::<Vec<f32>>(),
                    [refs.len()],
                ),
                device,
            ),
            mask_h: if bypass || off.loglinear_prox {
                aligned(refs, width, |r| &r.mask)
            } else {
                Vec::new()
            },
            dims: [refs.len(), width],
        }
    }

    /// The loss of a micro-batch at the learner's log-probs and entropies (and, replaying
    /// sampling masks, the mass inside the kept sets), after its corrections against μ and its
    /// masks; hands back the mask it trained, the loss's metrics and the mean mass outside the
    /// kept sets.
    pub(super) fn micro_loss(
        &self,
        mut inp: MicroInputs,
        scores: Scores,
        global: GlobalBatchInfo,
        device: &Device,
        diag: &mut StepDiagnostics,
    ) -> Result<LossOut<(Tensor<2>, MetricValues, Option<f64>)>> {
        let Scores {
            lp,
            ent,
            kept_log_mass,
        } = scores;
        self.correct_micro(&mut inp, &lp, device, diag)?;
        let off = &self.learner.algo.offpolicy;
        let MicroInputs {
            mask,
            old,
            adv,
            weights,
            ref_lp,
            mu,
            scores,
            ..
        } = inp;
        // Off-policy sequence masking: out of the loss, normalisers unchanged.
        let t_opsm = std::time::Instant::now();
        let keep = match off.opsm {
            Some((Opsm::Trl, delta)) => {
                let behaviour = mu
                    .as_ref()
                    .ok_or_else(|| TrainError::Pipeline("OPSM's μ was not laid out".into()))?;
                let n = mask.clone().sum_dim(1).clamp_min(1.0);
                let row_adv = (adv.clone() * mask.clone()).sum_dim(1) / n;
                Some(opsm_trl(&lp, behaviour, &row_adv, &mask, delta)?)
            }
            Some((Opsm::Slime, delta)) => Some(opsm_slime(&lp, &old, &adv, &mask, delta)?.0),
            Some((Opsm::Off, _)) | None => None,
        };
        if keep.is_some() {
            diag.correction_secs += t_opsm.elapsed().as_secs_f64();
        }
        // TRL's top-entropy masking: only the most uncertain tokens get policy loss.
        let entropy_keep = self
            .recipe
            .algorithm
            .top_entropy_quantile
            .map(|rho| top_entropy_mask(&ent.clone().detach(), &mask, rho))
            .transpose()?;
        let mut input = PolicyLossInput::new(lp, old, adv, mask.clone())
            .with_entropy(ent)
            .with_global(global)
            .with_scores(scores)
            .with_seed(self.learner.loss_seed);
        for k in keep.into_iter().chain(entropy_keep) {
            input = input.with_loss_mask(k);
        }
        if let Some(w) = weights {
            input = input.with_rollout_is_weights(w);
        }
        if let Some(r) = ref_lp {
            input = input.with_ref_log_prob(r);
        }
        let out = self
            .learner
            .algo
            .policy
            .compute(&input, &self.learner.algo.config)?;
        let mv = out.metrics.read()?;
        let (loss, outside) = match kept_log_mass {
            Some(inside) => self.outside_mass(out.loss, inside, &mask, &global)?,
            None => (out.loss, None),
        };
        Ok(LossOut {
            loss,
            extra: (mask, mv, outside),
        })
    }

    /// Replaying sampling masks: the mean mass outside the kept sets over `mask`'s tokens
    /// (`rollout/mass_outside_kept`), and `loss` with `algorithm.outside_mass_coef` times
    /// `−log` of the mass inside them, aggregated as the policy loss is.
    fn outside_mass(
        &self,
        loss: Tensor<1>,
        inside: Tensor<2>,
        mask: &Tensor<2>,
        global: &GlobalBatchInfo,
    ) -> Result<(Tensor<1>, Option<f64>)> {
        let outside = masked_mean(inside.clone().detach().exp().neg() + 1.0, mask);
        let outside = f64::from(host(outside)[0]);
        let coef = self.recipe.algorithm.outside_mass_coef;
        if coef == 0.0 {
            return Ok((loss, Some(outside)));
        }
        let aggregation = self.learner.algo.config.aggregation;
        let penalty = aggregate_loss(inside.neg(), mask, aggregation, global)?;
        Ok((loss + penalty * coef, Some(outside)))
    }

    /// The per-micro-batch correction against μ: of the log-linear π_prox (which then anchors
    /// the ratio and whose IS weights multiply the loss), or in verl's bypass of πθ itself
    /// (detached; μ anchors the ratio). Updates the inputs' mask, IS weights and anchor.
    fn correct_micro(
        &self,
        inp: &mut MicroInputs,
        lp: &Tensor<2>,
        device: &Device,
        diag: &mut StepDiagnostics,
    ) -> Result<()> {
        let off = &self.learner.algo.offpolicy;
        let measured = match (&inp.versions, &inp.mu) {
            (Some(versions), Some(mu)) => {
                // AReaL counts the weights being trained as version v + 1 for a learner at v
                // (this step's batch number): tokens sampled at v get α = 0, π_prox = μ.
                let learner_version = self.step as i64 + 1;
                let t0 = std::time::Instant::now();
                let prox = loglinear_prox(lp, mu, versions, &inp.mask, learner_version + 1)?;
                *diag.prox_secs.get_or_insert(0.0) += t0.elapsed().as_secs_f64();
                inp.old = prox.clone();
                Some((prox, true))
            }
            _ if inp.mask_h.iter().any(|m| *m > 0.5) => {
                Some((lp.clone().detach(), off.bypass_applies_weights))
            }
            _ => None,
        };
        if let Some((train, apply_weights)) = measured {
            let dims = inp.dims;
            let out = diag.correct(&host(train), &inp.mu_h, &inp.mask_h, dims, &off.correction)?;
            let f32s = |v: Vec<f64>| v.into_iter().map(|x| x as f32).collect();
            inp.mask = t2(device, f32s(out.mask), dims[0], dims[1]);
            inp.weights = out
                .weights
                .filter(|_| apply_weights)
                .map(|w| t2(device, f32s(w), dims[0], dims[1]));
        }
        Ok(())
    }
}

/// A micro-batch's per-token inputs to the loss (`[rows, width]` on its device, `_h` on the
/// host).
pub(super) struct MicroInputs {
    mask: Tensor<2>,
    /// The ratio's anchor.
    old: Tensor<2>,
    adv: Tensor<2>,
    /// Decoupled mode's IS weights.
    weights: Option<Tensor<2>>,
    ref_lp: Option<Tensor<2>>,
    /// μ on the host, where a per-micro-batch correction needs it.
    mu_h: Vec<f32>,
    /// μ on the device, where the log-linear π_prox or TRL's OPSM needs it.
    mu: Option<Tensor<2>>,
    /// The token versions, for the log-linear π_prox.
    versions: Option<Tensor<2>>,
    /// Each row's shaped outcome reward.
    scores: Tensor<1>,
    mask_h: Vec<f32>,
    dims: [usize; 2],
}
