//! The learn stage: `ppo_epochs` × `mini_batches` optimiser steps over a prepared batch, each
//! accumulating micro-batch gradients (micro-batches cut by rows and tokens, the output head in
//! chunks: [`crate::chunked`]) under global token normalisation, the critic beside the
//! policy, NaN/Inf steps skipped with weights and optimiser state restored, and the global
//! gradient-norm clip.

use crate::batch::{Row, aligned, per_token, t2};
use crate::chunked::{LossOut, chunked_backward};
use crate::correction::{CorrectionMode, Opsm};
use crate::distributed::group::{
    ProcessGroup, RankPart, check_weights, decode, encode, grads_from_host, grads_to_host,
};
use crate::distributed::shard::sharded_step;
use crate::distributed::sum_gradients;
use crate::learner::Learner;
use crate::models::Models;
use crate::offpolicy::StepDiagnostics;
use crate::optim::{adamw, clip_grads};
use crate::recipe::Recipe;
use crate::report::UpdateStats;
use crate::{Result, TrainError, host};
use burn::module::Module;
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::{Device, Tensor, TensorData};
use rlft_algo::aggregation::{GlobalBatchInfo, LossAggregation};
use rlft_algo::decoupled::loglinear_prox;
use rlft_algo::filters::{opsm_slime, opsm_trl, top_entropy_mask};
use rlft_algo::loss::{MetricValues, PolicyLossInput};
use rlft_algo::seed::{spread, xorshift64};
use rlft_model::{Transformer, ValueModel};
use rlft_rollout::{LearnerBatch, RoutingStats};

/// What an update reads and moves: the models it trains and the learner that trains them.
pub(crate) struct Learn<'a> {
    pub(crate) recipe: &'a Recipe,
    pub(crate) models: &'a mut Models,
    pub(crate) learner: &'a mut Learner,
    /// RL steps done before this one: the rows' permutation is a function of it, and the
    /// learner's policy version is this + 1.
    pub(crate) step: usize,
}

impl Learn<'_> {
    /// `ppo_epochs` × `mini_batches` optimiser steps; returns their statistics (clip fractions,
    /// KL, entropy, gradient norm, value loss, whether the step was skipped). With process
    /// ranks, they compare their weights after it every `distributed.check_every` RL steps.
    pub(crate) fn update(
        &mut self,
        rows: &[Row],
        lr: f64,
        diag: &mut StepDiagnostics,
    ) -> Result<UpdateStats> {
        let a = self.recipe.algorithm.clone();
        let n = rows.len();
        let mut acc = UpdateSums::default();
        // A NaN found after earlier optimiser steps of this batch must not leave them applied:
        // with several steps per batch, keep the starting weights and optimiser state.
        // (With one step per batch a NaN stops it before the step: nothing to restore, and the
        // optimizer updates parameters that nothing else holds in place.)
        let before = (a.ppo_epochs * a.mini_batches > 1).then(|| Before::take(self));
        let mut bad = false;
        'epochs: for epoch in 0..a.ppo_epochs {
            let order = permutation(n, self.step, epoch);
            let per = n.div_ceil(a.mini_batches);
            for mini in order.chunks(per) {
                // Rows in their original order, so a group's rows meet in one micro-batch and
                // share their prompt there (`LearnerBatch`); the mini-batch's sum is the same.
                let mut mini = mini.to_vec();
                mini.sort_unstable();
                if !self.mini_batch_step(rows, &mini, lr, &mut acc, diag)? {
                    bad = true;
                    break 'epochs;
                }
            }
        }
        if bad && let Some(before) = before {
            // Weights and optimiser state untouched.
            before.restore(self);
        }
        if let Some(group) = &self.learner.group {
            let (every, step) = (self.recipe.distributed.check_every, self.step + 1);
            if every > 0 && step.is_multiple_of(every) {
                check_weights(group.as_ref(), self.models.policy(), step)?;
            }
        }
        Ok(acc.stats(bad))
    }

    /// One optimiser step on the mini-batch `mini` (row indices, in order): the ranks'
    /// gradients summed in rank order, clipped, and applied to the policy (and critic) unless
    /// a loss, value loss or gradient norm is NaN/Inf; returns whether it was applied.
    fn mini_batch_step(
        &mut self,
        rows: &[Row],
        mini: &[usize],
        lr: f64,
        acc: &mut UpdateSums,
        diag: &mut StepDiagnostics,
    ) -> Result<bool> {
        let grad_clip = self.recipe.optimizer.grad_clip;
        let (policy_grads, critic_grads) = self.rank_parts(rows, mini, acc, diag)?;
        let device = &self.learner.device;
        let grads = sum_gradients(self.models.policy(), policy_grads, device);
        let critic_grads = self
            .models
            .critic
            .as_ref()
            .map(|c| sum_gradients(c, critic_grads, device));
        let (grads, norm) = clip_grads(grads, self.models.policy(), grad_clip);
        acc.norms.push(norm);
        // The critic's step is checked too: a NaN in it would poison every later value and
        // advantage.
        let critic_grads = self
            .models
            .critic
            .as_ref()
            .zip(critic_grads)
            .map(|(c, g)| clip_grads(g, c, grad_clip));
        if !norm.is_finite()
            || acc.sums.iter().any(|v| !v.is_finite())
            || acc.value_losses.iter().any(|v: &f64| !v.is_finite())
            || critic_grads.as_ref().is_some_and(|(_, n)| !n.is_finite())
        {
            return Ok(false);
        }
        let shards = self.learner.optimizer_shards();
        let policy = self.models.take_policy();
        self.models.policy = Some(match &shards {
            Some(group) => {
                sharded_step(group.as_ref(), &mut self.learner.optim, lr, policy, grads)?
            }
            None => self.learner.optim.step(lr, policy, grads),
        });
        if let (Some(critic), Some(o), Some((g, _))) = (
            self.models.critic.take(),
            self.learner.critic_optim.as_mut(),
            critic_grads,
        ) {
            self.models.critic = Some(match &shards {
                Some(group) => sharded_step(group.as_ref(), o, lr, critic, g)?,
                None => o.step(lr, critic, g),
            });
        }
        Ok(true)
    }

    /// Every rank's gradients of the mini-batch `mini`, in rank order, each rank on its shard
    /// of the rows (its metric sums added to `acc`, its diagnostics to `diag`).
    fn rank_parts(
        &self,
        rows: &[Row],
        mini: &[usize],
        acc: &mut UpdateSums,
        diag: &mut StepDiagnostics,
    ) -> Result<(Vec<GradientsParams>, Vec<GradientsParams>)> {
        let tokens: f32 = mini.iter().map(|&i| rows[i].mask.iter().sum::<f32>()).sum();
        let seqs = mini
            .iter()
            .filter(|&&i| rows[i].mask.iter().any(|&m| m > 0.0))
            .count();
        let ranks = match &self.learner.group {
            Some(group) => group.size(),
            None => self.learner.ranks.len() + 1,
        };
        // Every rank's loss is normalised by the whole mini-batch and the ranks' gradients are
        // summed: `dp_size` stays 1 (see `crate::distributed`).
        let global = GlobalBatchInfo {
            dp_size: 1,
            batch_num_tokens: Some(tokens as f64),
            global_batch_size: Some(seqs as f64),
            loss_scale_factor: Some(self.recipe.rollout.max_total_tokens as f64),
        };
        let mut policy_grads = Vec::with_capacity(ranks);
        let mut critic_grads = Vec::with_capacity(ranks);
        let mut step_value_loss = 0.0;
        let shards = crate::distributed::shard(mini, ranks);
        let parts = match &self.learner.group {
            Some(group) => self.process_parts(group.as_ref(), &shards, rows, global)?,
            None => self.thread_parts(&shards, rows, global),
        };
        for part in parts {
            let (part, rank_diag) = part?;
            diag.merge(rank_diag);
            for (s, p) in acc.sums.iter_mut().zip(part.sums) {
                *s += p;
            }
            acc.count += part.micro_batches;
            acc.routing.add(part.routing);
            step_value_loss += part.value_losses.iter().sum::<f64>();
            policy_grads.push(part.policy);
            critic_grads.extend(part.critic);
        }
        if self.models.critic.is_some() {
            // Each micro-batch's value loss is its share of the mini-batch's (global
            // normalisation): their sum is the step's, whatever the micro-batching.
            acc.value_losses.push(step_value_loss);
        }
        Ok((policy_grads, critic_grads))
    }

    /// The thread ranks' parts of a mini-batch, in rank order (ranks with rows only): every
    /// rank past the first computes on its own fork of this step's weights (on its device, or on
    /// the first rank's), so that ranks share no autodiff graph.
    fn thread_parts(
        &self,
        shards: &[&[usize]],
        rows: &[Row],
        global: GlobalBatchInfo,
    ) -> Vec<Result<(RankGradients, StepDiagnostics)>> {
        let replicas: Vec<Option<(Transformer, Option<ValueModel>)>> = shards
            .iter()
            .enumerate()
            .map(|(k, shard)| {
                let device = k.checked_sub(1).map(|r| &self.learner.ranks[r])?;
                (!shard.is_empty()).then(|| {
                    (
                        self.models.policy().clone().fork(device),
                        self.models.critic.clone().map(|c| c.fork(device)),
                    )
                })
            })
            .collect();
        let jobs: Vec<_> = shards
            .iter()
            .zip(&replicas)
            .enumerate()
            .filter(|(_, (shard, _))| !shard.is_empty())
            .map(|(k, (shard, replica))| {
                let (policy, critic, device) = match (replica, k.checked_sub(1)) {
                    (Some((p, c)), Some(r)) => (p, c.as_ref(), &self.learner.ranks[r]),
                    _ => (
                        self.models.policy(),
                        self.models.critic.as_ref(),
                        &self.learner.device,
                    ),
                };
                (k, move || {
                    let mut rank_diag = StepDiagnostics::default();
                    self.rank_gradients(
                        (policy, critic, device),
                        shard,
                        rows,
                        global,
                        &mut rank_diag,
                    )
                    .map(|g| (g, rank_diag))
                })
            })
            .collect();
        match &self.learner.rank_pools {
            Some(pools) => pools.run(jobs),
            None => jobs.into_iter().map(|(_, job)| job()).collect(),
        }
    }

    /// The process ranks' parts of a mini-batch, in rank order (ranks with rows only): this
    /// rank computes its shard's on its own copy of the policy, and every rank's crosses the
    /// group ([`crate::distributed::group`]), so that each rank sums the same gradients in the
    /// same order.
    fn process_parts(
        &self,
        group: &dyn ProcessGroup,
        shards: &[&[usize]],
        rows: &[Row],
        global: GlobalBatchInfo,
    ) -> Result<Vec<Result<(RankGradients, StepDiagnostics)>>> {
        let (policy, critic) = (self.models.policy(), self.models.critic.as_ref());
        let device = &self.learner.device;
        let shard = shards.get(group.rank()).copied().unwrap_or_default();
        let job = || {
            let mut diag = StepDiagnostics::default();
            self.rank_gradients((policy, critic, device), shard, rows, global, &mut diag)
                .map(|g| (g, diag))
        };
        // In the rank's own pool, as a thread rank computes its share.
        let computed = match (&self.learner.rank_pools, shard.is_empty()) {
            (_, true) => None,
            (Some(pools), false) => pools.run(vec![(0, job)]).pop(),
            (None, false) => Some(job()),
        };
        let mine = computed.transpose()?.map(|(g, diag)| RankPart {
            policy: grads_to_host(policy, g.policy),
            critic: critic.zip(g.critic).map(|(c, g)| grads_to_host(c, g)),
            sums: g.sums,
            micro_batches: g.micro_batches,
            value_losses: g.value_losses,
            routing: g.routing,
            diag,
        });
        let all = group.all_gather(encode(&mine)?)?;
        let mut parts = Vec::with_capacity(all.len());
        for (from, bytes) in all.iter().enumerate() {
            let Some(p) = decode::<Option<RankPart>>(bytes, from)? else {
                continue;
            };
            let critic_grads = match (critic, p.critic) {
                (Some(c), Some(g)) => Some(grads_from_host(c, g, device, from)?),
                _ => None,
            };
            let g = RankGradients {
                policy: grads_from_host(policy, p.policy, device, from)?,
                critic: critic_grads,
                sums: p.sums,
                routing: p.routing,
                micro_batches: p.micro_batches,
                value_losses: p.value_losses,
            };
            parts.push(Ok((g, p.diag)));
        }
        Ok(parts)
    }

    /// One learner rank's share of a mini-batch: the gradients of `shard`'s rows (micro-batch
    /// by micro-batch, normalised by `global`) for `policy` and `critic` on `device`, with the
    /// rank's metric sums.
    fn rank_gradients(
        &self,
        (policy, critic, device): (&Transformer, Option<&ValueModel>, &Device),
        shard: &[usize],
        rows: &[Row],
        global: GlobalBatchInfo,
        diag: &mut StepDiagnostics,
    ) -> Result<RankGradients> {
        let a = &self.recipe.algorithm;
        let temperature = self.recipe.rollout.temperature;
        let mut out = RankGradients::default();
        let mut accum = GradientsAccumulator::<Transformer>::new();
        let mut critic_accum = GradientsAccumulator::<ValueModel>::new();
        for micro in self.learner.packing.micro_batches(shard, rows) {
            let refs: Vec<&Row> = micro.iter().map(|&i| &rows[i]).collect();
            let ids = self.learner.packing.pack(&refs, device);
            let inputs = self.micro_inputs(&ids, &refs, device);
            // Without an entropy bonus the entropy is only a metric: no gradient flows through
            // it, so the backward pass neither keeps nor walks it.
            let (grads, (mask, mv)) = chunked_backward(
                &ids,
                policy,
                Some(temperature),
                self.learner.logits_chunk,
                a.entropy_coef > 0.0,
                |lp, ent| self.micro_loss(inputs, (lp, ent), global, device, diag),
            )?;
            if let Some(r) = ids.take_routing_stats() {
                out.routing.add(r);
            }
            out.sums[0] += mv.clip_frac_low;
            out.sums[1] += mv.clip_frac_high;
            out.sums[2] += mv.kl.unwrap_or(0.0);
            out.sums[3] += mv.entropy.unwrap_or(0.0);
            out.micro_batches += 1.0;
            accum.accumulate(policy, grads);
            if let Some(critic) = critic {
                let (vl, g) = self.value_loss(critic, (&ids, &refs), &mask, &global)?;
                out.value_losses.push(vl);
                critic_accum.accumulate(critic, g);
            }
        }
        out.policy = accum.grads();
        out.critic = critic.map(|_| critic_accum.grads());
        Ok(out)
    }

    /// A micro-batch's per-token inputs to the loss, laid out on `device`.
    fn micro_inputs(&self, ids: &LearnerBatch, refs: &[&Row], device: &Device) -> MicroInputs {
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

    /// The loss of a micro-batch at the learner's log-probs and entropies `(lp, ent)`, after
    /// its corrections against μ and its masks; hands back the mask it trained and the loss's
    /// metrics.
    fn micro_loss(
        &self,
        mut inp: MicroInputs,
        (lp, ent): (Tensor<2>, Tensor<2>),
        global: GlobalBatchInfo,
        device: &Device,
        diag: &mut StepDiagnostics,
    ) -> Result<LossOut<(Tensor<2>, MetricValues)>> {
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
        Ok(LossOut {
            loss: out.loss,
            extra: (mask, mv),
        })
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

    /// The critic's clipped value loss on a packed micro-batch under `mask`, and its gradient.
    fn value_loss(
        &self,
        critic: &ValueModel,
        (ids, refs): (&LearnerBatch, &[&Row]),
        mask: &Tensor<2>,
        global: &GlobalBatchInfo,
    ) -> Result<(f64, GradientsParams)> {
        let a = &self.recipe.algorithm;
        let old_v = per_token(ids, refs, |r| r.old_values.as_deref().unwrap_or(&[]));
        let ret = per_token(ids, refs, |r| r.returns.as_deref().unwrap_or(&[]));
        let v = ids
            .response(critic.forward(&ids.input()).unsqueeze_dim::<3>(2))
            .squeeze_dim::<2>(2);
        let (vl, _) = rlft_algo::value::clipped_value_loss(
            v,
            old_v,
            ret,
            mask,
            a.value_clip,
            LossAggregation::TokenMean,
            global,
        )?;
        let vl = vl * a.value_coef;
        let value = host(vl.clone())[0] as f64;
        Ok((value, GradientsParams::from_grads(vl.backward(), critic)))
    }
}

/// A micro-batch's per-token inputs to the loss (`[rows, width]` on its device, `_h` on the
/// host).
struct MicroInputs {
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

/// The update's metric sums over its mini-batches (clip low, clip high, kl, entropy, per
/// micro-batch), gradient norms and value losses.
#[derive(Default)]
struct UpdateSums {
    sums: [f64; 4],
    routing: RoutingStats,
    count: f64,
    norms: Vec<f64>,
    value_losses: Vec<f64>,
}

impl UpdateSums {
    /// The step's statistics; `skipped` when a NaN/Inf stopped it.
    fn stats(&self, skipped: bool) -> UpdateStats {
        let c = self.count.max(1.0);
        let vl = &self.value_losses;
        UpdateStats {
            clip_low: self.sums[0] / c,
            clip_high: self.sums[1] / c,
            kl: self.sums[2] / c,
            entropy: self.sums[3] / c,
            grad_norm: self.norms.iter().copied().fold(0.0, f64::max),
            value_loss: (!vl.is_empty()).then(|| vl.iter().sum::<f64>() / vl.len() as f64),
            routing_mismatch: self.routing.fractions().map(|f| f.0),
            router_drift: self.routing.fractions().map(|f| f.1),
            moe_aux_loss: self.routing.aux_loss(),
            skipped,
        }
    }
}

/// The weights and optimiser state before an update of several optimiser steps, to put back
/// when a later step finds a NaN.
struct Before {
    policy: Transformer,
    optim: burn::optim::OptimizerRecord,
    critic: Option<ValueModel>,
    critic_optim: Option<burn::optim::OptimizerRecord>,
}

impl Before {
    fn take(learn: &Learn<'_>) -> Self {
        Self {
            policy: learn.models.policy().clone(),
            optim: learn.learner.optim.to_record(),
            critic: learn.models.critic.clone(),
            critic_optim: learn.learner.critic_optim.as_ref().map(|o| o.to_record()),
        }
    }

    fn restore(self, learn: &mut Learn<'_>) {
        let optimizer = &learn.recipe.optimizer;
        learn.models.policy = Some(self.policy);
        learn.learner.optim = adamw(optimizer).load_record(self.optim);
        if let Some(c) = self.critic {
            learn.models.critic = Some(c);
        }
        if let Some(record) = self.critic_optim {
            learn.learner.critic_optim = Some(adamw(optimizer).load_record(record));
        }
    }
}

/// The fixed, step-dependent permutation of `n` rows in `epoch` of the update after `step`
/// steps.
fn permutation(n: usize, step: usize, epoch: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut s = spread(step as u64 + 1) ^ epoch as u64;
    for i in (1..n).rev() {
        s = xorshift64(s);
        order.swap(i, (s % (i as u64 + 1)) as usize);
    }
    order
}

/// One rank's gradients and metric sums over its micro-batches (clip low, clip high, kl,
/// entropy).
#[derive(Default)]
struct RankGradients {
    policy: GradientsParams,
    critic: Option<GradientsParams>,
    sums: [f64; 4],
    /// How the update passes' routing compared with the sampler's record.
    routing: RoutingStats,
    micro_batches: f64,
    value_losses: Vec<f64>,
}
