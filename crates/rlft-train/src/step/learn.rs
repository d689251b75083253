//! The learn stage: `ppo_epochs` × `mini_batches` optimiser steps over a prepared batch, each
//! accumulating micro-batch gradients (micro-batches cut by rows and tokens, the output head in
//! chunks: [`crate::chunked`]) under global token normalisation, the critic beside the
//! policy, NaN/Inf steps skipped with weights and optimiser state restored, and the global
//! gradient-norm clip.

use crate::batch::{Row, per_token};
use crate::chunked::chunked_backward;
use crate::correction::SamplingMask;
use crate::distributed::group::{
    MetricSums, ProcessGroup, RankPart, check_weights, decode, encode, grads_from_host,
    grads_to_host,
};
use crate::distributed::shard::sharded_step;
use crate::distributed::sum_gradients;
use crate::learner::Learner;
use crate::models::Models;
use crate::offpolicy::StepDiagnostics;
use crate::optim::{adamw, clip_grads};
use crate::recipe::Recipe;
use crate::report::UpdateStats;
use crate::{Result, host};
use burn::module::Module;
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::{Device, Tensor};
use rlft_algo::aggregation::{GlobalBatchInfo, LossAggregation};
use rlft_algo::seed::{spread, xorshift64};
use rlft_model::{Transformer, ValueModel};
use rlft_rollout::{LearnerBatch, RoutingStats};

mod micro;

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
        let replay = self.recipe.algorithm.sampling_mask == SamplingMask::Replay;
        Ok(acc.stats(bad, replay))
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
            let (grads, (mask, mv, outside)) = chunked_backward(
                &ids,
                policy,
                Some(temperature),
                self.learner.logits_chunk,
                a.entropy_coef > 0.0,
                |s| self.micro_loss(inputs, s, global, device, diag),
            )?;
            if let Some(r) = ids.take_routing_stats() {
                out.routing.add(r);
            }
            out.sums[0] += mv.clip_frac_low;
            out.sums[1] += mv.clip_frac_high;
            out.sums[2] += mv.kl.unwrap_or(0.0);
            out.sums[3] += mv.entropy.unwrap_or(0.0);
            out.sums[4] += outside.unwrap_or(0.0);
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

/// The update's metric sums over its mini-batches (per micro-batch), gradient norms and value
/// losses.
#[derive(Default)]
struct UpdateSums {
    sums: MetricSums,
    routing: RoutingStats,
    count: f64,
    norms: Vec<f64>,
    value_losses: Vec<f64>,
}

impl UpdateSums {
    /// The step's statistics; `skipped` when a NaN/Inf stopped it.
    /// The update's statistics; `replay`: the run replays sampling masks.
    fn stats(&self, skipped: bool, replay: bool) -> UpdateStats {
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
            mass_outside_kept: replay.then(|| self.sums[4] / c),
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
    sums: MetricSums,
    /// How the update passes' routing compared with the sampler's record.
    routing: RoutingStats,
    micro_batches: f64,
    value_losses: Vec<f64>,
}
