//! Held-out evaluation: greedy accuracy (overall and per `data_source`), and pass@k and mean@k
//! over `eval.k` temperature samples per problem.

use crate::Result;
use crate::metrics::StepMetrics;
use crate::recipe::Recipe;
use crate::rollout_side::collect::{RolloutSide, rollout_config};
use crate::step::prepare::{is_correct, mean_std};
use burn::module::Module;
use rlft_model::{Tokenizer, Transformer};
use rlft_rollout::{Example, RolloutSetup, SamplingConfig, rollout};
use serde_json::json;
use std::collections::BTreeMap;

/// What a held-out evaluation reads.
pub(crate) struct Evaluate<'a> {
    pub(crate) recipe: &'a Recipe,
    /// The policy as it stands (evaluated through its frozen copy).
    pub(crate) policy: &'a Transformer,
    pub(crate) tokenizer: &'a Tokenizer,
    /// The environment, the rewards and the correctness term.
    pub(crate) side: &'a RolloutSide,
    /// The held-out problems.
    pub(crate) eval_set: &'a [Example],
}

impl Evaluate<'_> {
    /// The `data_source` and the correctness (0 or 1) of `group` samples of every eval problem
    /// (a prompt past `rollout.max_prompt_len` is skipped).
    fn samples(
        &self,
        step: usize,
        group: usize,
        sampling: SamplingConfig,
    ) -> Result<Vec<(Option<String>, Vec<f64>)>> {
        let model = self.policy.valid();
        let mut out = Vec::with_capacity(self.eval_set.len());
        for chunk in self.eval_set.chunks(32) {
            let cfg = rollout_config(self.recipe, group, sampling.clone());
            let setup = RolloutSetup {
                tokenizer: self.tokenizer,
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

    /// The eval metrics at `step` (the sampled evaluation's seeds are a function of it):
    /// `eval/accuracy` (greedy), `eval/<data_source>/accuracy` when the problems name sources,
    /// `eval/pass@<k>` (a problem counts when any of its `k` samples is correct), and
    /// `eval/mean@<k>` (the mean accuracy of the samples). None without eval problems (own
    /// `data.train` and no `data.eval`).
    pub(crate) fn at(&self, step: usize) -> Result<StepMetrics> {
        let mut m = StepMetrics::new();
        if self.eval_set.is_empty() {
            return Ok(m);
        }
        let mean = |v: &[f64]| mean_std(v).0;
        let greedy = self.samples(
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
        let sampled = self.samples(step, k, self.recipe.rollout.sampling())?;
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
