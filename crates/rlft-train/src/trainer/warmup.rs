//! The supervised warm-up before RL: `data.sft`'s demonstrations or the task's reference
//! completions, with its own AdamW, log and checkpoints.

use super::Trainer;
use super::run::stopping;
use super::saving::save_checkpoint;
use crate::batch::{Row, per_token};
use crate::demos::Demo;
use crate::metrics::{MetricsLog, StepMetrics};
use crate::optim::{adamw, clip_grads};
use crate::{Result, TrainError};
use burn::optim::{GradientsParams, ModuleOptimizer};
use rlft_algo::seed::unit_hash;
use rlft_rollout::Split;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

/// The warm-up's AdamW (its learning rate and weight decay, the recipe's betas).
pub(crate) fn sft_adamw(t: &Trainer) -> ModuleOptimizer {
    let s = &t.recipe.sft;
    adamw(&crate::recipe::OptimizerSection {
        lr: s.lr,
        weight_decay: s.weight_decay,
        ..t.recipe.optimizer.clone()
    })
}

/// Supervised warm-up on `data.sft`'s demonstrations or the task's reference completions
/// (`sft.steps` steps), logged to
/// `output_dir/sft_metrics.jsonl`, checkpointed every `checkpoint.every` steps. Returns
/// whether it ran to its end (false: stopped by `stop`, after a checkpoint).
pub(crate) fn sft(t: &mut Trainer, stop: Option<&Arc<AtomicBool>>) -> Result<bool> {
    let s = t.recipe.sft.clone();
    if s.steps == 0 || t.state.sft_done {
        t.state.sft_done = true;
        return Ok(true);
    }
    let path = t.recipe.output_dir.join("sft_metrics.jsonl");
    let mut log = MetricsLog::open(&path, t.resumed.then_some(t.state.sft_step))?;
    if log.torn_lines > 0 {
        eprintln!(
            "note: {}: dropped a torn last line (a write cut short); the warm-up steps after \
             the checkpoint are recomputed",
            path.display()
        );
    }
    if t.learner.sft_optim.is_none() {
        t.learner.sft_optim = Some(sft_adamw(t));
    }
    let eos = crate::demos::eos(&t.tokenizer);
    let schedule = s.lr_schedule();
    let every = t.recipe.checkpoint.every;
    let skipped = t.sft_set.as_ref().map_or(0, |d| d.skipped);
    for step in t.state.sft_step..s.steps {
        let start = Instant::now();
        let mut rows = Vec::with_capacity(s.batch_size);
        for i in 0..s.batch_size {
            let n = step * s.batch_size + i;
            // `data.sft`'s demonstrations in file order, cycling; else the task's reference
            // completions (observation turns masked out).
            let demo = match &t.sft_set {
                Some(set) => set.rows[n % set.rows.len()].clone(),
                None => {
                    let index = 1_000_000 + n as u64;
                    let mut ex = t.task.example(Split::Train, index);
                    if unit_hash(t.recipe.seed, index) < s.teacher_error {
                        ex = t.task.off_by_one(ex);
                    }
                    let turns = t.task.reference_turns(&ex);
                    let prompt = ex.prompt.render(&t.tokenizer)?;
                    Demo::encode(&t.tokenizer, &prompt, &turns, eos, t.sft_max_len)?.ok_or_else(
                        || {
                            TrainError::Recipe(format!(
                                "sft.max_len: the task's reference demonstration for {:?} is \
                                 longer than {} tokens; raise sft.max_len",
                                ex.prompt.user_text(),
                                t.sft_max_len
                            ))
                        },
                    )?
                }
            };
            rows.push(Row::demonstration(&demo.prompt, &demo.response, demo.mask));
        }
        let refs: Vec<&Row> = rows.iter().collect();
        let ids = t.learner.pack(&refs);
        let mask = per_token(&ids, &refs, |r| &r.mask);
        let lp = ids.logprobs(t.models.policy(), None)?;
        let tokens: f32 = rows.iter().map(|r| r.mask.iter().sum::<f32>()).sum();
        let loss = (lp * mask).sum().neg() * (1.0 / tokens.max(1.0));
        let loss_v: f32 = loss.clone().into_scalar();
        let grads = GradientsParams::from_grads(loss.backward(), t.models.policy());
        let (grads, norm) = clip_grads(grads, t.models.policy(), s.grad_clip);
        // Linear warm-up over the first tenth of the steps (from-scratch models diverge at
        // full learning rate on their first updates), then the recipe's schedule.
        let lr = schedule.lr(s.lr, step);
        if norm.is_finite() && loss_v.is_finite() {
            let policy = t.models.take_policy();
            if let Some(o) = t.learner.sft_optim.as_mut() {
                t.models.policy = Some(o.step(lr, policy, grads));
            }
        }
        let mut m = StepMetrics::new();
        m.insert("step".into(), json!(step + 1));
        m.insert("loss".into(), json!(loss_v));
        m.insert("grad_norm".into(), json!(norm));
        m.insert("lr".into(), json!(lr));
        m.insert("sft/skipped".into(), json!(skipped));
        m.insert("time/step_s".into(), json!(start.elapsed().as_secs_f64()));
        log.write(m)?;
        t.state.sft_step = step + 1;
        crate::fault::point(|| format!("warmup:{}", step + 1));
        // The flag is read once: a Ctrl-C between two reads must not skip the checkpoint.
        // At the last warm-up step the warm-up's end (`step-0`) is the checkpoint.
        let stop_now = stopping(stop);
        let last = step + 1 == s.steps;
        if !last && (stop_now || (every > 0 && (step + 1).is_multiple_of(every))) {
            save_checkpoint(t)?;
        }
        if !last && stop_now {
            return Ok(false);
        }
    }
    t.state.sft_done = true;
    t.learner.sft_optim = None;
    Ok(true)
}
