//! Range and enum checks of every recipe value, with messages that name the key and what is
//! allowed.

use super::Recipe;
use crate::{Result, TrainError};

/// The largest count a recipe may give for anything that is allocated or looped over per item.
pub const MAX_SIZE: usize = 1 << 20;

impl Recipe {
    /// Checks every value's range against the built-in losses; messages say what is allowed.
    pub fn validate(&self) -> Result<()> {
        self.validate_with(&rlft_algo::loss::LossRegistry::with_builtins())
    }

    /// As [`Recipe::validate`], looking `algorithm.loss` up in `registry`.
    pub fn validate_with(&self, registry: &rlft_algo::loss::LossRegistry) -> Result<()> {
        let bad = |key: &str, msg: String| Err(TrainError::Recipe(format!("{key}: {msg}")));
        if let Some(d) = self.task.dataset.as_deref().filter(|d| !d.is_empty()) {
            return bad(
                "task.dataset",
                format!(
                    "was replaced by [data]: write `[data] train = {d:?}` and score it with \
                     [[reward]] terms (e.g. kind = \"exact\" for the last number)"
                ),
            );
        }
        super::data::check(&self.data, &self.reward, self.rollout.max_new_tokens)?;
        super::data::check_tools(&self.tool)?;
        let r = &self.rollout;
        let a = &self.algorithm;
        if r.group_size < 2 && !self.model.critic {
            return bad(
                "rollout.group_size",
                format!(
                    "must be at least 2 for group baselines, got {}",
                    r.group_size
                ),
            );
        }
        // Counts: at least `min` (0 where a check below says more, with its reason), and at most
        // MAX_SIZE, since each allocates or loops per item (a huge value is a typo, not a run).
        for (k, v, min) in [
            ("rollout.prompts_per_step", r.prompts_per_step, 1),
            ("rollout.group_size", r.group_size, 0),
            ("rollout.max_new_tokens", r.max_new_tokens, 1),
            ("rollout.max_turns", r.max_turns, 1),
            ("rollout.max_total_tokens", r.max_total_tokens, 1),
            ("rollout.max_prompt_len", r.max_prompt_len, 0),
            ("algorithm.ppo_epochs", a.ppo_epochs, 1),
            ("algorithm.mini_batches", a.mini_batches, 1),
            ("algorithm.micro_batch_size", a.micro_batch_size, 1),
            ("algorithm.max_gen_batches", a.max_gen_batches, 0),
            ("sft.batch_size", self.sft.batch_size, 0),
            ("eval.size", self.eval.size, 1),
            ("eval.k", self.eval.k, 1),
        ] {
            if v < min {
                return bad(k, format!("must be at least {min}"));
            }
            if v > MAX_SIZE {
                return bad(k, format!("must be at most {MAX_SIZE}, got {v}"));
            }
        }
        if !(r.temperature.is_finite() && r.temperature > 0.0) {
            return bad(
                "rollout.temperature",
                format!(
                    "must be a finite number > 0 for RL sampling (0 is greedy), got {}",
                    r.temperature
                ),
            );
        }
        if !(r.top_p > 0.0 && r.top_p <= 1.0) {
            return bad(
                "rollout.top_p",
                format!("must be in (0, 1] (1 keeps every token), got {}", r.top_p),
            );
        }
        if !(0.0..1.0).contains(&r.min_p) {
            return bad(
                "rollout.min_p",
                format!("must be in [0, 1) (0 keeps every token), got {}", r.min_p),
            );
        }
        rlft_rollout::SamplingConfig::new()
            .with_temperature(r.temperature)
            .with_top_k(r.top_k)
            .with_top_p(r.top_p)
            .with_min_p(r.min_p)
            .validate()
            .or_else(|e| bad("rollout", e.to_string()))?;
        for (k, v) in [
            ("algorithm.kl_coef", a.kl_coef),
            ("algorithm.entropy_coef", a.entropy_coef),
            ("algorithm.value_coef", a.value_coef),
            ("algorithm.overlong_factor", a.overlong_factor),
            ("optimizer.weight_decay", self.optimizer.weight_decay),
            ("optimizer.grad_clip", self.optimizer.grad_clip),
            ("sft.weight_decay", self.sft.weight_decay),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return bad(k, format!("must be a finite number ≥ 0, got {v}"));
            }
        }
        for (k, v) in [("optimizer.lr", self.optimizer.lr), ("sft.lr", self.sft.lr)] {
            if !(v.is_finite() && v > 0.0 && v < 1.0) {
                return bad(k, format!("must be in (0, 1), got {v}"));
            }
        }
        for (k, v) in [
            ("optimizer.beta1", self.optimizer.beta1),
            ("optimizer.beta2", self.optimizer.beta2),
        ] {
            if !(0.0..1.0).contains(&v) {
                return bad(k, format!("must be in [0, 1), got {v}"));
            }
        }
        if self.optimizer.eps.is_nan() || self.optimizer.eps <= 0.0 {
            return bad("optimizer.eps", "must be > 0".into());
        }
        for (k, v) in [("algorithm.gamma", a.gamma), ("algorithm.lam", a.lam)] {
            if !(0.0..=1.0).contains(&v) {
                return bad(k, format!("must be in [0, 1], got {v}"));
            }
        }
        for (k, v) in [
            ("algorithm.clip_low", a.clip_low),
            ("algorithm.clip_high", a.clip_high),
        ] {
            if let Some(v) = v
                && !(v.is_finite() && v >= 0.0)
            {
                return bad(
                    k,
                    format!("must be a finite number ≥ 0 (leave it out for the preset's), got {v}"),
                );
            }
        }
        if r.max_prompt_len == 0 {
            return bad(
                "rollout.max_prompt_len",
                "must be at least 1 (prompts longer than it are dropped; 0 would drop them all)"
                    .into(),
            );
        }
        if self.sft.steps > 0 && self.sft.batch_size == 0 {
            return bad(
                "sft.batch_size",
                "must be at least 1 when sft.steps > 0 (set sft.steps = 0 to skip the warm-up)"
                    .into(),
            );
        }
        if a.dynamic_sampling && a.max_gen_batches == 0 {
            return bad(
                "algorithm.max_gen_batches",
                "must be ≥ 1 with dynamic sampling".into(),
            );
        }
        if a.overlong_cache_len > r.max_new_tokens {
            return bad(
                "algorithm.overlong_cache_len",
                format!("must be ≤ rollout.max_new_tokens ({})", r.max_new_tokens),
            );
        }
        for (k, v) in [
            ("schedule.min_lr_ratio", self.schedule.min_lr_ratio),
            ("sft.min_lr_ratio", self.sft.min_lr_ratio),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return bad(k, format!("must be in [0, 1], got {v}"));
            }
        }
        if self.model.lora.rank > 0 {
            rlft_model::LoraConfig::new(self.model.lora.rank, self.model.lora.alpha)
                .with_target_modules(self.model.lora.target_modules.clone())
                .validate()
                .or_else(|e| bad("model.lora", e.to_string()))?;
        }
        let s = &self.model.scratch;
        for (k, v, max) in [
            ("model.scratch.hidden_size", s.hidden_size, 1 << 16),
            (
                "model.scratch.intermediate_size",
                s.intermediate_size,
                1 << 18,
            ),
            ("model.scratch.layers", s.layers, 1024),
            ("model.scratch.heads", s.heads, 1024),
            ("model.scratch.kv_heads", s.kv_heads, 1024),
        ] {
            if v == 0 || v > max {
                return bad(k, format!("must be in 1..={max}, got {v}"));
            }
        }
        if !s.heads.is_multiple_of(s.kv_heads) || !s.hidden_size.is_multiple_of(s.heads) {
            return bad(
                "model.scratch",
                "heads must divide hidden_size and be a multiple of kv_heads".into(),
            );
        }
        let width = s.hidden_size / s.heads;
        if width < 2 || !width.is_multiple_of(2) {
            return bad(
                "model.scratch",
                format!(
                    "the head width hidden_size / heads = {width} must be even (RoPE rotates \
                     pairs); e.g. hidden_size = {} for {} heads",
                    s.heads * 2 * width.div_ceil(2).max(1),
                    s.heads
                ),
            );
        }
        rlft_rollout::TaskKind::parse(&self.task.name)
            .map(|_| ())
            .or_else(|e| bad("task.name", e.to_string()))?;
        if !(1..=3).contains(&self.task.difficulty) {
            return bad(
                "task.difficulty",
                format!("must be 1, 2 or 3, got {}", self.task.difficulty),
            );
        }
        for op in &self.task.ops {
            if !["+", "-", "*"].contains(&op.as_str()) {
                return bad(
                    "task.ops",
                    format!("'{op}': use any of \"+\", \"-\", \"*\""),
                );
            }
        }
        let e = self.sft.teacher_error;
        if !(0.0..=1.0).contains(&e) {
            return bad("sft.teacher_error", format!("must be in [0, 1], got {e}"));
        }
        if e > 0.0 && self.task.name != "arithmetic" {
            return bad(
                "sft.teacher_error",
                format!(
                    "only the arithmetic task has numeric answers to get wrong, not '{}'; set it to 0",
                    self.task.name
                ),
            );
        }
        if self.checkpoint.keep == 0 {
            return bad("checkpoint.keep", "must be at least 1".into());
        }
        if let Err((key, e)) = self.asynchrony.check() {
            return bad(key, e);
        }
        if let Err((key, e)) = self.distributed.check(&self.device) {
            return bad(key, e);
        }
        if let Some(d) = &self.model.reference_device {
            if self.algorithm.kl_coef == 0.0 {
                return bad(
                    "model.reference_device",
                    "there is no reference model with algorithm.kl_coef = 0; remove it or set \
                     kl_coef > 0"
                        .into(),
                );
            }
            if let Err(e) = rlft_algo::device::parse(d) {
                return bad("model.reference_device", e.to_string());
            }
        }
        if let Some(d) = &self.rollout.device {
            if self.asynchrony.mode != crate::staleness::AsyncMode::Async {
                return bad(
                    "rollout.device",
                    "applies to async.mode = \"async\" only (the rollout workers' device); \
                     remove it or set async.mode = \"async\""
                        .into(),
                );
            }
            if let Err(e) = rlft_algo::device::parse(d) {
                return bad("rollout.device", e.to_string());
            }
        }
        crate::algorithm::resolve_algorithm(self, registry)?;
        Ok(())
    }
}
