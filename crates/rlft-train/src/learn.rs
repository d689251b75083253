//! The learner: `ppo_epochs` × `mini_batches` optimiser steps over a prepared batch, each
//! accumulating micro-batch gradients (micro-batches cut by rows and tokens, the output head in
//! chunks: [`crate::learner`]) under global token normalisation, the critic beside the
//! policy, NaN/Inf steps skipped with weights and optimiser state restored, and the global
//! gradient-norm clip.

use crate::correction::{CorrectionMode, Opsm};
use crate::distributed::sum_gradients;
use crate::learner::{LossOut, chunk_for_budget, chunked_backward};
use crate::offpolicy::StepDiagnostics;
use crate::optim::{adamw, clip_grads};
use crate::report::UpdateStats;
use crate::score::Row;
use crate::trainer::{LOGITS_CHUNK_BYTES, Trainer};
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

impl Trainer {
    /// `ppo_epochs` × `mini_batches` optimiser steps; returns their statistics (clip fractions,
    /// KL, entropy, gradient norm, value loss, whether the step was skipped).
    pub(crate) fn update(
        &mut self,
        rows: &[Row],
        lr: f64,
        diag: &mut StepDiagnostics,
    ) -> Result<UpdateStats> {
        let a = self.recipe.algorithm.clone();
        let n = rows.len();
        let mut sums = [0.0f64; 4];
        let mut routing = RoutingStats::default();
        let mut count = 0.0f64;
        let mut norms = Vec::new();
        let mut value_losses = Vec::new();
        let mut bad = false;
        // A NaN found after earlier optimiser steps of this batch must not leave them applied:
        // with several steps per batch, keep the starting weights and optimiser state.
        let several = a.ppo_epochs * a.mini_batches > 1;
        // (With one step per batch a NaN stops it before the step: nothing to restore, and the
        // optimizer updates parameters that nothing else holds in place.)
        let before = several.then(|| self.policy().clone());
        let before_optim = several.then(|| self.learner.optim.to_record());
        let before_critic = several.then(|| self.models.critic.clone()).flatten();
        let before_critic_optim = several
            .then(|| self.learner.critic_optim.as_ref().map(|o| o.to_record()))
            .flatten();
        for epoch in 0..a.ppo_epochs {
            // A fixed, step-dependent permutation of the rows.
            let mut order: Vec<usize> = (0..n).collect();
            let mut s = spread(self.state.step as u64 + 1) ^ epoch as u64;
            for i in (1..n).rev() {
                s = xorshift64(s);
                order.swap(i, (s % (i as u64 + 1)) as usize);
            }
            let per = n.div_ceil(a.mini_batches);
            for mini in order.chunks(per) {
                // Rows in their original order, so a group's rows meet in one micro-batch and
                // share their prompt there (`LearnerBatch`); the mini-batch's sum is the same.
                let mut mini = mini.to_vec();
                mini.sort_unstable();
                let tokens: f32 = mini.iter().map(|&i| rows[i].mask.iter().sum::<f32>()).sum();
                let seqs = mini
                    .iter()
                    .filter(|&&i| rows[i].mask.iter().any(|&m| m > 0.0))
                    .count();
                let ranks = self.learner.ranks.len() + 1;
                // Every rank's loss is normalised by the whole mini-batch and the ranks'
                // gradients are summed: `dp_size` stays 1 (see `crate::distributed`).
                let global = GlobalBatchInfo {
                    dp_size: 1,
                    batch_num_tokens: Some(tokens as f64),
                    global_batch_size: Some(seqs as f64),
                    loss_scale_factor: Some(self.recipe.rollout.max_total_tokens as f64),
                };
                let mut policy_grads = Vec::with_capacity(ranks);
                let mut critic_grads = Vec::with_capacity(ranks);
                let mut step_value_loss = 0.0;
                let shards = crate::distributed::shard(&mini, ranks);
                // Every rank past the first computes on its own fork of this step's weights
                // (on its device, or on the first rank's): ranks share no autodiff graph.
                let replicas: Vec<Option<(Transformer, Option<ValueModel>)>> = shards
                    .iter()
                    .enumerate()
                    .map(|(k, shard)| {
                        let device = k.checked_sub(1).map(|r| &self.learner.ranks[r])?;
                        (!shard.is_empty()).then(|| {
                            (
                                self.policy().clone().fork(device),
                                self.models.critic.clone().map(|c| c.fork(device)),
                            )
                        })
                    })
                    .collect();
                let this = &*self;
                let jobs: Vec<_> = shards
                    .iter()
                    .zip(&replicas)
                    .enumerate()
                    .filter(|(_, (shard, _))| !shard.is_empty())
                    .map(|(k, (shard, replica))| {
                        let (policy, critic, device) = match (replica, k.checked_sub(1)) {
                            (Some((p, c)), Some(r)) => (p, c.as_ref(), &this.learner.ranks[r]),
                            _ => (
                                this.policy(),
                                this.models.critic.as_ref(),
                                &this.learner.device,
                            ),
                        };
                        (k, move || {
                            let mut rank_diag = StepDiagnostics::default();
                            this.rank_gradients(
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
                let parts = match &self.learner.rank_pools {
                    Some(pools) => pools.run(jobs),
                    None => jobs.into_iter().map(|(_, job)| job()).collect(),
                };
                for part in parts {
                    let (part, rank_diag) = part?;
                    diag.merge(rank_diag);
                    for (s, p) in sums.iter_mut().zip(part.sums) {
                        *s += p;
                    }
                    count += part.micro_batches;
                    routing.add(part.routing);
                    step_value_loss += part.value_losses.iter().sum::<f64>();
                    policy_grads.push(part.policy);
                    critic_grads.extend(part.critic);
                }
                if self.models.critic.is_some() {
                    // Each micro-batch's value loss is its share of the mini-batch's (global
                    // normalisation): their sum is the step's, whatever the micro-batching.
                    value_losses.push(step_value_loss);
                }
                let grads = sum_gradients(self.policy(), policy_grads, &self.learner.device);
                let critic_grads = self
                    .models
                    .critic
                    .as_ref()
                    .map(|c| sum_gradients(c, critic_grads, &self.learner.device));
                let (grads, norm) =
                    clip_grads(grads, self.policy(), self.recipe.optimizer.grad_clip);
                norms.push(norm);
                // The critic's step is checked too: a NaN in it would poison every later value
                // and advantage.
                let critic_grads = self
                    .models
                    .critic
                    .as_ref()
                    .zip(critic_grads)
                    .map(|(c, g)| clip_grads(g, c, self.recipe.optimizer.grad_clip));
                if !norm.is_finite()
                    || sums.iter().any(|v| !v.is_finite())
                    || value_losses.iter().any(|v: &f64| !v.is_finite())
                    || critic_grads.as_ref().is_some_and(|(_, n)| !n.is_finite())
                {
                    bad = true;
                    break;
                }
                let policy = self.take_policy();
                self.models.policy = Some(self.learner.optim.step(lr, policy, grads));
                if let (Some(critic), Some(o), Some((g, _))) = (
                    self.models.critic.take(),
                    self.learner.critic_optim.as_mut(),
                    critic_grads,
                ) {
                    self.models.critic = Some(o.step(lr, critic, g));
                }
            }
            if bad {
                break;
            }
        }
        if bad {
            // Weights and optimiser state untouched.
            if let Some(before) = before {
                self.models.policy = Some(before);
            }
            if let Some(record) = before_optim {
                self.learner.optim = adamw(&self.recipe.optimizer).load_record(record);
            }
            if let Some(c) = before_critic {
                self.models.critic = Some(c);
            }
            if let Some(record) = before_critic_optim {
                self.learner.critic_optim = Some(adamw(&self.recipe.optimizer).load_record(record));
            }
        }
        let c = count.max(1.0);
        let gn = norms.iter().copied().fold(0.0, f64::max);
        Ok(UpdateStats {
            clip_low: sums[0] / c,
            clip_high: sums[1] / c,
            kl: sums[2] / c,
            entropy: sums[3] / c,
            grad_norm: gn,
            value_loss: (!value_losses.is_empty())
                .then(|| value_losses.iter().sum::<f64>() / value_losses.len() as f64),
            routing_mismatch: routing.fractions().map(|f| f.0),
            router_drift: routing.fractions().map(|f| f.1),
            moe_aux_loss: routing.aux_loss(),
            skipped: bad,
        })
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
        // The learner's policy version during this step (its batch's step number).
        let learner_version = self.state.step as u64 + 1;
        let mut accum = GradientsAccumulator::<Transformer>::new();
        let mut critic_accum = GradientsAccumulator::<ValueModel>::new();
        for micro in self.micro_batches(shard, rows) {
            let refs: Vec<&Row> = micro.iter().map(|&i| &rows[i]).collect();
            let ids = self.pack_on(&refs, device);
            let per_token = |field: &dyn Fn(&Row) -> &[f32]| self.per_token(&ids, &refs, field);
            let mask = per_token(&|r| &r.mask);
            let old = per_token(&|r| &r.old_lp);
            let adv = per_token(&|r| &r.adv);
            let weights = refs
                .iter()
                .all(|r| r.is_w.is_some())
                .then(|| per_token(&|r| r.is_w.as_deref().unwrap_or(&[])));
            let ref_lp = self
                .models
                .reference
                .is_some()
                .then(|| per_token(&|r| r.ref_lp.as_deref().unwrap_or(&[])));
            let off = &self.learner.algo.offpolicy;
            let bypass = off.mode == CorrectionMode::Bypass;
            let trl_opsm = matches!(off.opsm, Some((Opsm::Trl, _)));
            let width = ids.response_len();
            // μ, laid out once: on the host for a per-micro-batch correction (bypass, or
            // decoupled with the log-linear π_prox), on the device where a tensor needs it.
            let mu_h = if bypass || off.loglinear_prox || trl_opsm {
                aligned(&refs, width, |r| &r.behaviour_lp)
            } else {
                Vec::new()
            };
            let mu = (off.loglinear_prox || trl_opsm)
                .then(|| t2(device, mu_h.clone(), refs.len(), width));
            // Decoupled with the log-linear π_prox: built per micro-batch from μ, πθ and the
            // token versions (no π_old pass ran).
            let versions = off.loglinear_prox.then(|| per_token(&|r| &r.versions));
            let scores = Tensor::<1>::from_data(
                TensorData::new(
                    refs.iter().map(|r| r.score).collect::<Vec<f32>>(),
                    [refs.len()],
                ),
                device,
            );
            let mask_h = if bypass || off.loglinear_prox {
                aligned(&refs, width, |r| &r.mask)
            } else {
                Vec::new()
            };
            // Without an entropy bonus the entropy is only a metric: no gradient flows through
            // it, so the backward pass neither keeps nor walks it.
            let (grads, (mask, mv)) = chunked_backward(
                &ids,
                policy,
                Some(temperature),
                self.logits_chunk(),
                a.entropy_coef > 0.0,
                |lp, ent| -> Result<LossOut<(Tensor<2>, MetricValues)>> {
                    let (mut mask, mut weights, mut old) = (mask, weights, old);
                    // The per-micro-batch correction against μ: of the log-linear π_prox
                    // (which then anchors the ratio and whose IS weights multiply the loss), or
                    // in verl's bypass of πθ itself (detached; μ anchors the ratio).
                    let measured = match (&versions, &mu) {
                        (Some(versions), Some(mu)) => {
                            // AReaL counts the weights being trained as version v + 1 for a
                            // learner at v: tokens sampled at v get α = 0, π_prox = μ.
                            let t0 = std::time::Instant::now();
                            let prox = loglinear_prox(
                                &lp,
                                mu,
                                versions,
                                &mask,
                                learner_version as i64 + 1,
                            )?;
                            *diag.prox_secs.get_or_insert(0.0) += t0.elapsed().as_secs_f64();
                            old = prox.clone();
                            Some((prox, true))
                        }
                        _ if mask_h.iter().any(|m| *m > 0.5) => {
                            Some((lp.clone().detach(), off.bypass_applies_weights))
                        }
                        _ => None,
                    };
                    if let Some((train, apply_weights)) = measured {
                        let dims = [refs.len(), width];
                        let out =
                            diag.correct(&host(train), &mu_h, &mask_h, dims, &off.correction)?;
                        let f32s = |v: Vec<f64>| v.into_iter().map(|x| x as f32).collect();
                        mask = t2(device, f32s(out.mask), dims[0], dims[1]);
                        weights = out
                            .weights
                            .filter(|_| apply_weights)
                            .map(|w| t2(device, f32s(w), dims[0], dims[1]));
                    }
                    // Off-policy sequence masking: out of the loss, normalisers unchanged.
                    let t_opsm = std::time::Instant::now();
                    let keep = match off.opsm {
                        Some((Opsm::Trl, delta)) => {
                            let behaviour = mu.as_ref().ok_or_else(|| {
                                TrainError::Pipeline("OPSM's μ was not laid out".into())
                            })?;
                            let n = mask.clone().sum_dim(1).clamp_min(1.0);
                            let row_adv = (adv.clone() * mask.clone()).sum_dim(1) / n;
                            Some(opsm_trl(&lp, behaviour, &row_adv, &mask, delta)?)
                        }
                        Some((Opsm::Slime, delta)) => {
                            Some(opsm_slime(&lp, &old, &adv, &mask, delta)?.0)
                        }
                        Some((Opsm::Off, _)) | None => None,
                    };
                    if keep.is_some() {
                        diag.correction_secs += t_opsm.elapsed().as_secs_f64();
                    }
                    // TRL's top-entropy masking: only the most uncertain tokens get policy loss.
                    let entropy_keep = a
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
                },
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
                let old_v = per_token(&|r| r.old_values.as_deref().unwrap_or(&[]));
                let ret = per_token(&|r| r.returns.as_deref().unwrap_or(&[]));
                let v = ids
                    .response(critic.forward(&ids.input()).unsqueeze_dim::<3>(2))
                    .squeeze_dim::<2>(2);
                let (vl, _) = rlft_algo::value::clipped_value_loss(
                    v,
                    old_v,
                    ret,
                    &mask,
                    a.value_clip,
                    LossAggregation::TokenMean,
                    &global,
                )?;
                let vl = vl * a.value_coef;
                out.value_losses.push(host(vl.clone())[0] as f64);
                let g = GradientsParams::from_grads(vl.backward(), critic);
                critic_accum.accumulate(critic, g);
            }
        }
        out.policy = accum.grads();
        out.critic = critic.map(|_| critic_accum.grads());
        Ok(out)
    }

    /// `indices` split into micro-batches in order: at most `algorithm.micro_batch_size` rows
    /// and, with `algorithm.micro_batch_tokens`, at most that many tokens (prompt + response)
    /// each — a row longer than the budget goes alone.
    pub(crate) fn micro_batches(&self, indices: &[usize], rows: &[Row]) -> Vec<Vec<usize>> {
        let a = &self.recipe.algorithm;
        let budget = a.micro_batch_tokens;
        let mut out: Vec<Vec<usize>> = Vec::new();
        let mut tokens = 0;
        for &i in indices {
            let t = rows[i].ids.len();
            let full = out.last().is_none_or(|m| {
                m.len() >= a.micro_batch_size || (budget > 0 && tokens + t > budget)
            });
            if full {
                out.push(Vec::new());
                tokens = 0;
            }
            if let Some(m) = out.last_mut() {
                m.push(i);
            }
            tokens += t;
        }
        out
    }

    /// Response positions per chunk of the output head and softmax
    /// (`algorithm.logits_chunk_tokens`, or a 1 GiB budget of f32 logits when 0).
    pub(crate) fn logits_chunk(&self) -> usize {
        match self.recipe.algorithm.logits_chunk_tokens {
            0 => chunk_for_budget(self.models.config.vocab_size, LOGITS_CHUNK_BYTES),
            n => n,
        }
    }

    /// Packs rows in the learner's layout (the sampler's rescoring layout, see
    /// [`LearnerBatch`]).
    pub(crate) fn pack(&self, rows: &[&Row]) -> LearnerBatch {
        self.pack_on(rows, &self.learner.device)
    }

    /// As [`Trainer::pack`], on `device`.
    pub(crate) fn pack_on(&self, rows: &[&Row], device: &Device) -> LearnerBatch {
        let seqs: Vec<(&[i64], usize)> = rows.iter().map(|r| (&r.ids[..], r.prompt_len)).collect();
        let pad = self.tokenizer.pad_id.unwrap_or(0) as i64;
        let mut batch = LearnerBatch::new(&seqs, pad, device);
        if rows.iter().any(|r| !r.kept.is_empty()) {
            let kept: Vec<&[Option<Vec<u32>>]> = rows.iter().map(|r| &r.kept[..]).collect();
            batch = batch.with_kept_sets(&kept);
        }
        if rows.iter().any(|r| r.routing.is_some()) {
            let routing: Vec<_> = rows.iter().map(|r| r.routing.as_ref()).collect();
            let a = &self.recipe.algorithm;
            batch = batch.with_routing(&routing, a.router_replay, a.moe_aux_coef);
        }
        batch
    }

    /// The per-response-token values `field` of the rows packed as `batch`, as `[n, R]` (`R` the
    /// longest response, zeros past each row's values), on the batch's device.
    pub(crate) fn per_token(
        &self,
        batch: &LearnerBatch,
        rows: &[&Row],
        field: impl Fn(&Row) -> &[f32],
    ) -> Tensor<2> {
        let r = batch.response_len();
        t2(batch.device(), aligned(rows, r, field), rows.len(), r)
    }
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

/// The per-response-token values `field` of `rows` as a row-major `[rows, width]` host array,
/// zeros past each row's values.
pub(crate) fn aligned(rows: &[&Row], width: usize, field: impl Fn(&Row) -> &[f32]) -> Vec<f32> {
    let mut vals = vec![0.0f32; rows.len() * width];
    for (k, row) in rows.iter().enumerate() {
        let f = field(row);
        vals[k * width..k * width + f.len()].copy_from_slice(f);
    }
    vals
}

pub(crate) fn t2(device: &Device, v: Vec<f32>, b: usize, t: usize) -> Tensor<2> {
    Tensor::from_data(TensorData::new(v, [b, t]), device)
}
