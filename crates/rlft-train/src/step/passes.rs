//! The learner's passes over a consumed batch's rows: π_old (π_prox), reference log-probs and
//! critic values for every row, advantages from the outcome rewards (with KL in the reward where
//! the recipe places it), and the decoupled correction against μ. They run when a batch is
//! consumed, so π_prox is the learner's policy at that moment whichever version sampled it.

use super::prepare::Prepare;
use crate::batch::{KlInReward, Row, Rows, aligned, t2};
use crate::correction::CorrectionMode;
use crate::offpolicy::StepDiagnostics;
use crate::recipe::KlPlacement;
use crate::{Result, TrainError, host};
use burn::module::Module;
use rlft_algo::decoupled::{m2po_mask, rejection_sampling};
use std::time::Instant;

impl Prepare<'_> {
    /// Fills π_old, π_ref, values and advantages for every row; corrects the batch against μ
    /// where the recipe asks (decoupled) and measures the gap (whenever π_old was computed).
    pub(super) fn fill(
        &self,
        batch: &mut Rows,
        off_policy: bool,
        diag: &mut StepDiagnostics,
    ) -> Result<()> {
        let a = &self.recipe.algorithm;
        let on_policy = a.ppo_epochs == 1 && a.mini_batches == 1;
        let old_pass = self
            .learner
            .algo
            .offpolicy
            .needs_old_pass(on_policy, off_policy);
        let (prox, prox_secs) = self.frozen_passes(&mut batch.rows, old_pass)?;
        // The anchor (π_old, or μ for a cumulative ratio against the behaviour policy) is set
        // before the advantages, whose KL-in-reward reads it.
        if old_pass && !self.learner.algo.offpolicy.anchors_at_behaviour() {
            for (row, p) in batch.rows.iter_mut().zip(&prox) {
                row.old_lp.clone_from(p);
            }
        }
        self.advantages(batch)?;
        // After the advantages: rejection masks the loss, it does not move an outcome reward.
        if old_pass {
            diag.prox_secs = Some(prox_secs);
            self.correct_rows(batch, &prox, diag)?;
        }
        Ok(())
    }

    /// The frozen passes over the batch, micro-batch by micro-batch: π_old (returned with its
    /// seconds, where `old_pass`), the reference's log-probs and the critic's values (into the
    /// rows).
    fn frozen_passes(&self, rows: &mut [Row], old_pass: bool) -> Result<(Vec<Vec<f32>>, f64)> {
        let temperature = self.recipe.rollout.temperature;
        let policy = self.models.policy().valid();
        let critic = self.models.critic.as_ref().map(|c| c.valid());
        let mut prox: Vec<Vec<f32>> = vec![Vec::new(); rows.len()];
        let mut prox_secs = 0.0;
        let all: Vec<usize> = (0..rows.len()).collect();
        let logits_chunk = self.learner.logits_chunk;
        for chunk in self.learner.packing.micro_batches(&all, rows) {
            let chunk = &chunk[..];
            let refs: Vec<&Row> = chunk.iter().map(|&i| &rows[i]).collect();
            let ids = self.learner.pack(&refs);
            // Frozen (`valid()`) models live on the plain device.
            let ids_plain = ids.to_device(&self.learner.plain);
            if old_pass {
                let t0 = Instant::now();
                let lp =
                    host(ids_plain.logprobs_chunked(&policy, Some(temperature), logits_chunk)?);
                for (k, &i) in chunk.iter().enumerate() {
                    prox[i] = ids.unpack(&lp, k, rows[i].resp_len());
                }
                prox_secs += t0.elapsed().as_secs_f64();
            }
            if let Some(reference) = &self.models.reference {
                // The reference routes with its own router: replay holds the policy only.
                let ids_ref = ids.to_device(&reference.device).without_routing();
                let lp = host(ids_ref.logprobs_chunked(
                    &reference.model,
                    Some(temperature),
                    logits_chunk,
                )?);
                for (k, &i) in chunk.iter().enumerate() {
                    rows[i].ref_lp = Some(ids.unpack(&lp, k, rows[i].resp_len()));
                }
            }
            if let Some(c) = &critic {
                let v = host(
                    ids_plain
                        .response(c.forward(&ids_plain.input()).unsqueeze_dim::<3>(2))
                        .squeeze_dim::<2>(2),
                );
                for (k, &i) in chunk.iter().enumerate() {
                    let values = ids.unpack(&v, k, rows[i].resp_len());
                    if values.iter().any(|x| !x.is_finite()) {
                        return Err(TrainError::Diverged(
                            "the critic's values are NaN/Inf (its weights diverged); start a new run \
                             with a lower optimizer.lr or algorithm.value_coef (a resumed run \
                             keeps its settings)"
                                .into(),
                        ));
                    }
                    rows[i].old_values = Some(values);
                }
            }
        }
        Ok((prox, prox_secs))
    }

    /// Token rewards (the outcome at the last trained token, minus β·KL per token where the KL
    /// is in the reward) and values in the response-aligned layout `[N, R_max]`, through the
    /// advantage estimator into each row's advantages and returns.
    fn advantages(&self, rows: &mut Rows) -> Result<()> {
        let kl =
            (self.recipe.algorithm.kl_placement == KlPlacement::Reward).then_some(KlInReward {
                beta: self.beta,
                estimator: self.learner.algo.config.kl_estimator,
            });
        let critic = self.models.critic.is_some();
        let input = rows.advantage_input(&self.learner.plain, kl, critic)?;
        let out = self.learner.algo.advantage.compute(&input)?;
        rows.set_advantages(out, critic);
        Ok(())
    }

    /// With π_old (π_prox) computed for every row: measures its gap to μ over the step, and in
    /// decoupled mode corrects the batch (IS weights of π_prox against μ, rejection mask).
    fn correct_rows(
        &self,
        batch: &mut Rows,
        prox: &[Vec<f32>],
        diag: &mut StepDiagnostics,
    ) -> Result<()> {
        let off = &self.learner.algo.offpolicy;
        let rmax = batch.width();
        let rows = &mut batch.rows;
        let n = rows.len();
        let refs: Vec<&Row> = rows.iter().collect();
        let behaviour = aligned(&refs, rmax, |r| &r.behaviour_lp);
        let mask = aligned(&refs, rmax, |r| &r.mask);
        let mut train = vec![0.0f32; n * rmax];
        for (i, p) in prox.iter().enumerate() {
            train[i * rmax..i * rmax + p.len()].copy_from_slice(p);
        }
        let decoupled = off.mode == CorrectionMode::Decoupled;
        let none = Default::default();
        let config = if decoupled { &off.correction } else { &none };
        if mask.iter().any(|m| *m > 0.5) {
            let out = diag.correct(&train, &behaviour, &mask, [n, rmax], config)?;
            // M2PO: over the whole step, the tokens whose (log μ − log π_prox)² are largest.
            let t_masks = std::time::Instant::now();
            let keep = if decoupled {
                self.step_masks(&behaviour, &train, &mask, [n, rmax])?
            } else {
                None
            };
            if keep.is_some() {
                diag.correction_secs += t_masks.elapsed().as_secs_f64();
            }
            if decoupled {
                for (i, row) in rows.iter_mut().enumerate() {
                    let span = i * rmax..i * rmax + row.resp_len();
                    row.mask = out.mask[span.clone()]
                        .iter()
                        .zip(
                            keep.as_ref()
                                .map_or(&mask[span.clone()], |k| &k[span.clone()]),
                        )
                        .map(|(&m, &k)| if k > 0.5 { m as f32 } else { 0.0 })
                        .collect();
                    row.is_w = out
                        .weights
                        .as_ref()
                        .map(|w| w[span].iter().map(|&v| v as f32).collect());
                }
            }
        }
        Ok(())
    }

    /// The masks decoupled mode takes over the whole step from μ (`behaviour`) and π_prox
    /// (`prox`), row-major `[rows, cols]` host arrays: M2PO, KPop and slime's veto, multiplied
    /// into one keep mask (`None` when none is set).
    fn step_masks(
        &self,
        behaviour: &[f32],
        prox: &[f32],
        mask: &[f32],
        [n, cols]: [usize; 2],
    ) -> Result<Option<Vec<f32>>> {
        let off = &self.learner.algo.offpolicy;
        if off.m2po_threshold.is_none() && off.kpop.is_none() && off.veto_threshold.is_none() {
            return Ok(None);
        }
        let d = &self.learner.plain;
        let (mu_t, prox_t, mask_t) = (
            t2(d, behaviour.to_vec(), n, cols),
            t2(d, prox.to_vec(), n, cols),
            t2(d, mask.to_vec(), n, cols),
        );
        let mut keep: Vec<f32> = mask
            .iter()
            .map(|&m| if m > 0.5 { 1.0 } else { 0.0 })
            .collect();
        let mut and = |k: Vec<f32>| {
            for (a, b) in keep.iter_mut().zip(k) {
                *a = if *a > 0.5 && b > 0.5 { 1.0 } else { 0.0 };
            }
        };
        if let Some(threshold) = off.m2po_threshold {
            and(host(m2po_mask(&mu_t, &prox_t, &mask_t, threshold)?));
        }
        if let Some(cfg) = &off.kpop {
            and(host(rejection_sampling(&prox_t, &mu_t, &mask_t, cfg)?.mask));
        }
        if let Some(veto) = off.veto_threshold {
            // slime's veto: a row with a catastrophic token (π_prox/μ below the bound) is out.
            let log_veto = veto.ln();
            let mut rows = vec![1.0f32; n * cols];
            for i in 0..n {
                let span = i * cols..(i + 1) * cols;
                let vetoed = span.clone().any(|k| {
                    mask[k] > 0.5 && f64::from(prox[k]) - f64::from(behaviour[k]) < log_veto
                });
                if vetoed {
                    rows[span].fill(0.0);
                }
            }
            and(rows);
        }
        Ok(Some(keep))
    }
}
