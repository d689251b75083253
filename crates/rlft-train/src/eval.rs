//! Held-out evaluation: greedy accuracy (overall and per `data_source`), and pass@k and mean@k
//! over `eval.k` temperature samples per problem.

use crate::Result;
use crate::metrics::StepMetrics;
use crate::rollout_side::collect::rollout_config;
use crate::score::{is_correct, mean_std};
use crate::trainer::Trainer;
use burn::module::Module;
use rlft_rollout::{RolloutSetup, SamplingConfig, rollout};
use serde_json::json;
use std::collections::BTreeMap;

impl Trainer {
    /// The `data_source` and the correctness (0 or 1) of `group` samples of every eval problem
    /// (a prompt past `rollout.max_prompt_len` is skipped).
    fn eval_samples(
        &self,
        step: usize,
        group: usize,
        sampling: SamplingConfig,
    ) -> Result<Vec<(Option<String>, Vec<f64>)>> {
        let model = self.policy().valid();
        let mut out = Vec::with_capacity(self.eval_set.len());
        for chunk in self.eval_set.chunks(32) {
            let cfg = rollout_config(&self.recipe, group, sampling.clone());
            let setup = RolloutSetup {
                tokenizer: &self.tokenizer,
                env: self.side.env.as_ref(),
                rewards: &self.side.rewards,
                cfg: &cfg,
            };
            let b = rollout(
                &model,
                setup,
                chunk,
                step as u64,
                self.recipe.seed ^ 0xE7A1 ^ (step as u64) << 20,
            )?;
            out.extend(b.groups.iter().map(|g| {
                let correct = g
                    .trajectories
                    .iter()
                    .map(|t| is_correct(t, &self.side.correctness))
                    .collect();
                (g.example.data_source().map(String::from), correct)
            }));
        }
        Ok(out)
    }

    /// Held-out evaluation of the policy as it stands, at the current RL step: what
    /// [`Trainer::run`](crate::Trainer::run) logs every `eval.every` steps: `eval/accuracy`
    /// (greedy), `eval/<data_source>/accuracy`, `eval/pass@<k>` and `eval/mean@<k>`; empty
    /// without eval problems. For trainers that drive
    /// [`Trainer::train_step`](crate::Trainer::train_step) themselves.
    ///
    /// # Errors
    /// A failed generation or reward.
    pub fn evaluate(&self) -> Result<StepMetrics> {
        self.evaluate_at(self.state.step)
    }

    /// The eval metrics at `step` (the sampled evaluation's seeds are a function of it):
    /// `eval/accuracy` (greedy), `eval/<data_source>/accuracy` when the problems name sources,
    /// `eval/pass@<k>` (a problem counts when any of its `k` samples is correct), and
    /// `eval/mean@<k>` (the mean accuracy of the samples). None without eval problems (own
    /// `data.train` and no `data.eval`).
    pub(crate) fn evaluate_at(&self, step: usize) -> Result<StepMetrics> {
        let mut m = StepMetrics::new();
        if self.eval_set.is_empty() {
            return Ok(m);
        }
        let mean = |v: &[f64]| mean_std(v).0;
        let greedy = self.eval_samples(
            step,
            1,
            self.recipe.rollout.sampling().with_temperature(0.0),
        )?;
        let all: Vec<f64> = greedy.iter().flat_map(|(_, c)| c.iter().copied()).collect();
        m.insert("eval/accuracy".into(), json!(mean(&all)));
        let mut by_source: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        for (source, c) in &greedy {
            if let Some(s) = source {
                by_source.entry(s).or_default().extend(c);
            }
        }
        for (source, v) in by_source {
            m.insert(format!("eval/{source}/accuracy"), json!(mean(&v)));
        }
        let k = self.recipe.eval.k.max(1);
        let sampled = self.eval_samples(step, k, self.recipe.rollout.sampling())?;
        let pass: Vec<f64> = sampled
            .iter()
            .map(|(_, c)| if c.iter().any(|&c| c > 0.0) { 1.0 } else { 0.0 })
            .collect();
        let all: Vec<f64> = sampled
            .iter()
            .flat_map(|(_, c)| c.iter().copied())
            .collect();
        m.insert(format!("eval/pass@{k}"), json!(mean(&pass)));
        let mean_k = mean(&all);
        m.insert(format!("eval/mean@{k}"), json!(mean_k));
        Ok(m)
    }
}
