//! Rewards: answer extraction, exact numeric match, format and length terms, DAPO's overlong
//! shaping, and weighted sums of them, each sample scored on a bounded [`WorkerPool`] under its
//! own deadline. A reward that returns an error, times out or returns NaN marks the sample
//! failed (counted, excluded from the loss). A reward that panics has a bug: the batch stops
//! with [`RolloutError::RewardPanicked`](crate::RolloutError::RewardPanicked) (the pool's worker
//! survives). A pool whose every worker is stuck in a reward function that never returns stops
//! the run too, with [`RolloutError::WorkersStuck`](crate::RolloutError::WorkersStuck).

mod terms;

pub use terms::{
    AnswerFormat, ExactMatch, FormatReward, LengthPenalty, Named, OverlongShaping, RegexMatch,
    parse_number,
};

use crate::Result;
use crate::pool::{JobOutcome, WorkerPool};
use serde::{Deserialize, Serialize};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// What a reward function sees of one sample.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RewardInput {
    /// The prompt text.
    pub prompt: String,
    /// The model's completion (all assistant turns; tool observations included for multi-turn).
    pub completion: String,
    /// The reference answer.
    pub answer: String,
    /// Further acceptable answers, when the ground truth is a list (`["Paris", "Paris,
    /// France"]`, verl's Search-R1 `{"target": [...]}`): a verifying term accepts any of
    /// [`RewardInput::answers`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub alternatives: Vec<String>,
    /// Dataset metadata.
    pub metadata: serde_json::Value,
    /// Generated tokens (observation tokens excluded).
    pub response_len: usize,
    /// Cut off by the length limit.
    pub truncated: bool,
}

impl RewardInput {
    /// Every acceptable answer: [`RewardInput::answer`], then the alternatives.
    pub fn answers(&self) -> Vec<&str> {
        std::iter::once(self.answer.as_str())
            .chain(self.alternatives.iter().map(String::as_str))
            .collect()
    }
}

/// A reward function. Implement it to add your own; `Err` marks the sample failed. It runs on
/// a [`RewardSet`]'s worker pool under the set's per-sample deadline: a call that never returns
/// holds a worker for good, so give slow work (a subprocess, a request) its own timeout.
pub trait Reward: Send + Sync {
    /// Name used in metrics (`reward/<name>`).
    fn name(&self) -> &str;
    /// The score of one sample.
    fn score(&self, input: &RewardInput) -> Result<f64, String>;
}

/// The result of scoring one sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum RewardOutcome {
    /// Weighted total and each term `(name, unweighted value)`.
    Scored {
        /// Σ weight · value.
        total: f64,
        /// Per-term values.
        terms: Vec<(String, f64)>,
    },
    /// A term returned an error or a value that is not finite.
    Failed(String),
    /// Scoring ran past its deadline (a failure too: it counts in `reward/failed` and in
    /// `reward/timeouts`); the message names the term that was running.
    TimedOut(String),
}

impl RewardOutcome {
    /// The total, if scored.
    pub fn total(&self) -> Option<f64> {
        match self {
            Self::Scored { total, .. } => Some(*total),
            Self::Failed(_) | Self::TimedOut(_) => None,
        }
    }

    /// Whether scoring ran past its deadline.
    pub fn is_timeout(&self) -> bool {
        matches!(self, Self::TimedOut(_))
    }
}

/// Several rewards combined with weights, each sample scored on a shared bounded worker pool
/// under its own deadline.
#[derive(Clone)]
pub struct RewardSet {
    terms: Vec<(f64, Arc<dyn Reward>)>,
    /// Longest one sample's scoring may take, counted from when a worker starts it.
    pub timeout: Duration,
    workers: usize,
    /// Started on the first [`score`](Self::score); clones share it.
    pool: Arc<OnceLock<WorkerPool>>,
}

impl std::fmt::Debug for RewardSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<(f64, &str)> = self.terms.iter().map(|(w, r)| (*w, r.name())).collect();
        f.debug_struct("RewardSet")
            .field("terms", &names)
            .field("timeout", &self.timeout)
            .field("workers", &self.workers)
            .finish()
    }
}

impl Default for RewardSet {
    fn default() -> Self {
        Self {
            terms: Vec::new(),
            timeout: Duration::from_secs(5),
            workers: WorkerPool::default_size(),
            pool: Arc::default(),
        }
    }
}

impl RewardSet {
    /// An empty set with a 5 s timeout and [`WorkerPool::default_size`] workers.
    pub fn new() -> Self {
        Self::default()
    }

    /// Scores on at most `workers` threads (at least 1). The set (and its clones made from now
    /// on) gets a pool of its own.
    pub fn with_workers(mut self, workers: usize) -> Self {
        self.workers = workers.max(1);
        self.pool = Arc::default();
        self
    }

    /// The worker count.
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// The worker pool the samples are scored on, shared by this set's clones (its
    /// [`stats`](WorkerPool::stats) show busy and stuck workers).
    pub fn pool(&self) -> &WorkerPool {
        self.pool
            .get_or_init(|| WorkerPool::new("reward", self.workers))
    }

    /// Adds `reward` with `weight`.
    pub fn with(mut self, weight: f64, reward: impl Reward + 'static) -> Self {
        self.terms.push((weight, Arc::new(reward)));
        self
    }

    /// Adds a shared reward with `weight`.
    pub fn with_arc(mut self, weight: f64, reward: Arc<dyn Reward>) -> Self {
        self.terms.push((weight, reward));
        self
    }

    /// Sets the per-sample timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Names of the terms.
    pub fn names(&self) -> Vec<String> {
        self.terms
            .iter()
            .map(|(_, r)| r.name().to_string())
            .collect()
    }

    /// Scores every sample on the pool, each under [`timeout`](Self::timeout) from its own start
    /// (waiting in the queue does not count). A sample past its deadline is
    /// [`RewardOutcome::TimedOut`] at once and its late result discarded; its function keeps the
    /// worker until it returns.
    ///
    /// # Errors
    ///
    /// [`RolloutError::WorkersStuck`](crate::RolloutError::WorkersStuck) when every worker is stuck in a reward function that does
    /// not return, so the remaining samples could never be scored;
    /// [`RolloutError::RewardPanicked`](crate::RolloutError::RewardPanicked) when a reward
    /// function panicked.
    pub fn score(&self, inputs: Vec<RewardInput>) -> Result<Vec<RewardOutcome>> {
        let pool = self.pool();
        let tickets = inputs
            .into_iter()
            .map(|input| {
                let terms = self.terms.clone();
                pool.submit("reward set", self.timeout, move || {
                    score_one(&terms, &input)
                })
            })
            .collect::<Result<Vec<_>>>()?;
        tickets
            .into_iter()
            .map(|t| {
                Ok(match t.wait()? {
                    JobOutcome::Finished(outcome) => outcome,
                    JobOutcome::Panicked(msg) => {
                        return Err(crate::RolloutError::RewardPanicked { msg });
                    }
                    JobOutcome::TimedOut { label, after } => RewardOutcome::TimedOut(format!(
                        "{label} timed out after {after:?}; the sample counts as failed (make it \
                         faster or raise the reward timeout)"
                    )),
                })
            })
            .collect()
    }
}

fn score_one(terms: &[(f64, Arc<dyn Reward>)], input: &RewardInput) -> RewardOutcome {
    let mut total = 0.0;
    let mut values = Vec::with_capacity(terms.len());
    for (w, r) in terms {
        crate::pool::set_job_label(|| format!("reward '{}'", r.name()));
        match r.score(input) {
            Ok(v) if v.is_finite() => {
                total += w * v;
                values.push((r.name().to_string(), v));
            }
            Ok(v) => return RewardOutcome::Failed(format!("reward '{}' returned {v}", r.name())),
            Err(e) => return RewardOutcome::Failed(format!("reward '{}' failed: {e}", r.name())),
        }
    }
    RewardOutcome::Scored {
        total,
        terms: values,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Slow;
    impl Reward for Slow {
        fn name(&self) -> &str {
            "slow"
        }
        fn score(&self, _: &RewardInput) -> Result<f64, String> {
            std::thread::sleep(Duration::from_secs(2));
            Ok(1.0)
        }
    }
    struct Nan;
    impl Reward for Nan {
        fn name(&self) -> &str {
            "nan"
        }
        fn score(&self, x: &RewardInput) -> Result<f64, String> {
            match x.completion.as_str() {
                "panic" => panic!("boom"),
                "err" => Err("bad".into()),
                _ => Ok(f64::NAN),
            }
        }
    }

    #[test]
    fn weighted_sum_and_failures() {
        let input = |c: &str| RewardInput {
            completion: c.into(),
            answer: "7".into(),
            response_len: 30,
            ..Default::default()
        };
        let set = RewardSet::new()
            .with(1.0, ExactMatch::new(AnswerFormat::LastNumber))
            .with(0.5, FormatReward(AnswerFormat::AnswerTag))
            .with(
                1.0,
                LengthPenalty {
                    target: 20,
                    coef: 0.2,
                },
            );
        let out = set
            .score(vec![input("<answer>7</answer>"), input("8")])
            .unwrap();
        assert!((out[0].total().unwrap() - (1.0 + 0.5 - 0.1)).abs() < 1e-12);
        assert!((out[1].total().unwrap() - (-0.1)).abs() < 1e-12);

        let bad = RewardSet::new().with(1.0, Nan);
        let out = bad.score(vec![input("x"), input("err")]).unwrap();
        assert!(out.iter().all(|o| o.total().is_none()), "{out:?}");
        assert!(bad.score(vec![input("x"), input("panic")]).is_err());

        let slow = RewardSet::new()
            .with(1.0, Slow)
            .with_timeout(Duration::from_millis(100));
        let t = std::time::Instant::now();
        let out = slow.score(vec![input("x")]).unwrap();
        assert!(matches!(&out[0], RewardOutcome::TimedOut(m) if m.contains("'slow' timed out")));
        assert!(t.elapsed() < Duration::from_secs(1));
    }

    /// Hangs on `hang` until the test opens the gate; panics on `panic`; else 1 after 2 ms.
    struct Hang(crate::pool::testing::Gate);
    impl Reward for Hang {
        fn name(&self) -> &str {
            "hang"
        }
        fn score(&self, x: &RewardInput) -> Result<f64, String> {
            match x.completion.as_str() {
                "hang" => self.0.hang(),
                "panic" => panic!("boom"),
                _ => std::thread::sleep(Duration::from_millis(2)),
            }
            Ok(1.0)
        }
    }

    fn inputs(n: usize, special: &[(usize, &str)]) -> Vec<RewardInput> {
        (0..n)
            .map(|i| RewardInput {
                completion: special
                    .iter()
                    .find(|s| s.0 == i)
                    .map_or("ok", |s| s.1)
                    .into(),
                ..Default::default()
            })
            .collect()
    }

    #[test]
    fn a_hung_reward_fails_at_its_deadline_and_the_run_goes_on() {
        let gate = crate::pool::testing::Gate::default();
        let set = RewardSet::new()
            .with(1.0, ExactMatch::new(AnswerFormat::LastNumber))
            .with(1.0, Hang(gate.clone()))
            .with_timeout(Duration::from_millis(200))
            .with_workers(4);
        let t = std::time::Instant::now();
        let out = set.score(inputs(16, &[(5, "hang")])).unwrap();
        let took = t.elapsed();
        assert!(
            matches!(&out[5], RewardOutcome::TimedOut(m) if m.contains("reward 'hang' timed out after 200ms")),
            "{:?}",
            out[5]
        );
        assert!(out[5].is_timeout() && out[5].total().is_none());
        assert!(
            out.iter()
                .enumerate()
                .all(|(i, o)| i == 5 || o.total() == Some(1.0))
        );
        // At the sample's deadline, not later.
        assert!(
            (Duration::from_millis(200)..Duration::from_secs(2)).contains(&took),
            "{took:?}"
        );
        let s = set.pool().stats();
        assert_eq!((s.size, s.stuck), (4, 1), "{s:?}");
        // Later batches score normally on the three free workers; the pool never grows.
        let clone = set.clone();
        for _ in 0..19 {
            let out = clone.score(inputs(16, &[])).unwrap();
            assert!(out.iter().all(|o| o.total() == Some(1.0)), "{out:?}");
            let s = set.pool().stats();
            assert!(s.alive <= 4 && s.max_alive <= 4, "{s:?}");
        }
        assert_eq!(set.pool().stats().stuck, 1);
        gate.open();
        crate::pool::testing::wait_idle(set.pool());
        assert!(set.pool().stats().max_alive <= 4);
    }

    #[test]
    fn a_panicking_reward_stops_the_batch_and_the_worker_survives() {
        let set = RewardSet::new()
            .with(1.0, Hang(Default::default()))
            .with_workers(1);
        let err = set.score(inputs(3, &[(1, "panic")])).unwrap_err();
        assert!(
            matches!(&err, crate::RolloutError::RewardPanicked { msg } if msg.contains("boom")),
            "{err}"
        );
        // The pool's worker caught the panic and goes on scoring.
        let out = set.score(inputs(2, &[])).unwrap();
        assert!(out.iter().all(|o| o.total() == Some(1.0)), "{out:?}");
        let s = set.pool().stats();
        assert_eq!((s.alive, s.max_alive), (1, 1));
    }

    #[test]
    fn every_reward_worker_stuck_is_a_clear_error() {
        let gate = crate::pool::testing::Gate::default();
        let set = RewardSet::new()
            .with(1.0, Hang(gate.clone()))
            .with_timeout(Duration::from_millis(100))
            .with_workers(2);
        let t = std::time::Instant::now();
        let err = set
            .score(inputs(4, &[(0, "hang"), (1, "hang")]))
            .unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        let msg = err.to_string();
        for want in [
            "all 2 reward worker threads are stuck",
            "reward 'hang' on 2 worker(s)",
            "make the reward function return",
            "with_workers",
        ] {
            assert!(msg.contains(want), "{want}: {msg}");
        }
        gate.open();
        crate::pool::testing::wait_idle(set.pool());
        assert!(set.score(inputs(4, &[])).is_ok());
    }
}
