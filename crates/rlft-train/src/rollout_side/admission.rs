//! Admission control and staleness accounting for asynchronous rollouts (plain types, no
//! threads: the worker threads in [`crate::rollout_side::workers`] and the property test below drive the
//! same code).
//!
//! Work is issued in **batches**: batch `n` (serial 1, 2, …) is what step `n` of a synchronous
//! run collects — `prompts_per_step` prompts, topped up by dynamic sampling — and the learner
//! consumes batches in serial order, one per step. AReaL's rule, counted in groups with
//! `B = prompts_per_step`: a rollout starts only while `accepted + running < (η + v + 1)·B`,
//! where `v` counts the updates behind the weights the worker will sample with. Every issued
//! batch holds `B` slots until it is consumed, so batch `n` starts only once the worker holds
//! the weights of version `w ≥ n − η` (versions are 1 for the initial weights and `k + 1` after
//! `k` updates); the learner consumes batch `n` at version `n`, so no group is older than η.
//! Groups that leave a batch free their slot to other prompts: filtered groups are replaced
//! within the batch (dynamic sampling), requeued prompts go into the next batch issued.
//!
//! At consumption a group's staleness is the learner's version minus the oldest version among
//! its tokens; a group older than η is requeued (its prompt issued again), dropped or kept
//! ([`OnStale`]), counted either way. A checkpoint stores the prompts of batches issued but not
//! consumed in front of the requeued ones ([`PipelineState`]): a resumed run issues them again,
//! so every prompt is consumed once and the bound holds from the first step after a resume.

pub use crate::recipe::OnStale;
use rlft_rollout::DataLoader;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};

/// A group's staleness: how many versions the learner at `learner_version` is ahead of the
/// oldest policy among the group's tokens (`oldest_version`). 0 is on-policy; the bound η
/// (`async.max_staleness`) caps it at consumption. The one definition every count of staleness
/// uses.
pub fn staleness(learner_version: u64, oldest_version: u64) -> u64 {
    learner_version.saturating_sub(oldest_version)
}

/// The admission state a checkpoint keeps.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PipelineState {
    /// Prompts to issue before fresh ones: those of batches issued but not consumed, in serial
    /// order, then the requeued ones.
    pub pending: Vec<usize>,
    /// Groups requeued so far.
    pub requeued: u64,
    /// Groups dropped so far.
    pub dropped: u64,
}

/// What consuming one batch decided, per group.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Consumed {
    /// Per group: train on it.
    pub keep: Vec<bool>,
    /// Groups requeued in this batch.
    pub requeued: usize,
    /// Groups dropped in this batch.
    pub dropped: usize,
}

/// The admission controller and the prompt source of the rollout side.
#[derive(Debug)]
pub struct Admission {
    eta: u64,
    loader: DataLoader,
    pending: VecDeque<usize>,
    /// Prompts drawn per issued, unconsumed batch.
    open: BTreeMap<u64, Vec<usize>>,
    issued: u64,
    consumed: u64,
    state: PipelineState,
}

impl Admission {
    /// A controller with staleness bound `eta` drawing fresh prompts from `loader`, after
    /// `consumed` batches (the steps done), continuing from `state` (the default for a new run).
    pub fn new(eta: usize, loader: DataLoader, consumed: u64, state: PipelineState) -> Self {
        Self {
            eta: eta as u64,
            loader,
            pending: state.pending.iter().copied().collect(),
            open: BTreeMap::new(),
            issued: consumed,
            consumed,
            state: PipelineState {
                pending: Vec::new(),
                ..state
            },
        }
    }

    /// η.
    pub fn eta(&self) -> usize {
        self.eta as usize
    }

    /// The serial of the next batch to issue.
    pub fn next_serial(&self) -> u64 {
        self.issued + 1
    }

    /// The serial of the next batch the learner consumes.
    pub fn next_to_consume(&self) -> u64 {
        self.consumed + 1
    }

    /// Whether a worker holding the weights of `version` may start the next batch.
    pub fn can_issue(&self, version: u64) -> bool {
        self.next_serial() <= self.eta + version
    }

    /// Issues the next batch (call only when [`Admission::can_issue`]); returns its serial.
    pub fn issue(&mut self) -> u64 {
        self.issued += 1;
        self.open.insert(self.issued, Vec::new());
        self.issued
    }

    /// Draws `n` prompts (dataset indices) for batch `serial`: requeued and re-issued prompts
    /// first, then fresh ones.
    pub fn draw(&mut self, serial: u64, n: usize) -> Vec<usize> {
        let from_pending = n.min(self.pending.len());
        let mut out: Vec<usize> = self.pending.drain(..from_pending).collect();
        out.extend(self.loader.next_indices(n - from_pending));
        self.open.entry(serial).or_default().extend(&out);
        out
    }

    /// Consumes batch `serial` (the next in order) at learner `version`: `oldest[i]` is the
    /// oldest policy version among group `i`'s tokens and `prompts[i]` its dataset index.
    ///
    /// # Panics
    /// Never; a batch consumed out of order is a caller bug reported by `debug_assert`.
    pub fn consume(
        &mut self,
        serial: u64,
        version: u64,
        oldest: &[u64],
        prompts: &[usize],
        on_stale: OnStale,
    ) -> Consumed {
        debug_assert_eq!(
            serial,
            self.next_to_consume(),
            "batches are consumed in order"
        );
        self.open.remove(&serial);
        self.consumed = self.consumed.max(serial);
        let mut out = Consumed::default();
        for (&v, &p) in oldest.iter().zip(prompts) {
            let stale = staleness(version, v) > self.eta;
            let keep = !stale || on_stale == OnStale::Keep;
            if stale && on_stale == OnStale::Requeue {
                self.pending.push_back(p);
                out.requeued += 1;
            } else if stale && on_stale == OnStale::Drop {
                out.dropped += 1;
            }
            out.keep.push(keep);
        }
        self.state.requeued += out.requeued as u64;
        self.state.dropped += out.dropped as u64;
        out
    }

    /// The state to checkpoint: batches in flight or queued are issued again after a resume.
    pub fn state(&self) -> PipelineState {
        let mut pending: Vec<usize> = self.open.values().flatten().copied().collect();
        pending.extend(&self.pending);
        PipelineState {
            pending,
            ..self.state.clone()
        }
    }

    /// The fresh-data position (for checkpoints).
    pub fn cursor(&self) -> rlft_rollout::DataCursor {
        self.loader.cursor()
    }
}

/// `staleness/*` metrics of one step: `learner_version` minus each group's oldest token
/// version; the histogram counts `0..=eta` and `over` as fractions of the step's groups.
pub fn staleness_metrics(
    learner_version: u64,
    oldest: &[u64],
    eta: usize,
) -> BTreeMap<String, f64> {
    let s: Vec<u64> = oldest
        .iter()
        .map(|&v| staleness(learner_version, v))
        .collect();
    let n = s.len().max(1) as f64;
    let mut m = BTreeMap::new();
    m.insert("staleness/mean".into(), s.iter().sum::<u64>() as f64 / n);
    m.insert(
        "staleness/max".into(),
        s.iter().copied().max().unwrap_or(0) as f64,
    );
    for k in 0..=eta {
        let c = s.iter().filter(|&&x| x == k as u64).count();
        m.insert(format!("staleness/hist/{k}"), c as f64 / n);
    }
    let over = s.iter().filter(|&&x| x > eta as u64).count();
    m.insert("staleness/hist/over".into(), over as f64 / n);
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rlft_rollout::DataCursor;
    use std::collections::BTreeSet;

    fn loader(len: usize) -> DataLoader {
        DataLoader::new(len, 7, DataCursor::default()).unwrap()
    }

    #[test]
    fn eta_zero_issues_one_batch_per_version() {
        let mut a = Admission::new(0, loader(10), 0, PipelineState::default());
        assert!(a.can_issue(1));
        assert_eq!(a.issue(), 1);
        assert!(!a.can_issue(1), "batch 2 waits for version 2");
        assert!(a.can_issue(2));
        let mut b = Admission::new(2, loader(10), 0, PipelineState::default());
        for n in 1..=3 {
            assert!(b.can_issue(1));
            assert_eq!(b.issue(), n);
        }
        assert!(!b.can_issue(1));
    }

    #[test]
    fn stale_groups_are_requeued_dropped_or_kept() {
        for (on, keep, requeued, dropped) in [
            (OnStale::Requeue, vec![true, false], 1, 0),
            (OnStale::Drop, vec![true, false], 0, 1),
            (OnStale::Keep, vec![true, true], 0, 0),
        ] {
            let mut a = Admission::new(1, loader(10), 0, PipelineState::default());
            let s = a.issue();
            let p = a.draw(s, 2);
            let c = a.consume(s, 5, &[4, 3], &p, on);
            assert_eq!(c.keep, keep, "{on:?}");
            assert_eq!((c.requeued, c.dropped), (requeued, dropped), "{on:?}");
            assert_eq!(a.state().requeued, requeued as u64);
            assert_eq!(a.state().dropped, dropped as u64);
            if on == OnStale::Requeue {
                let n = a.issue();
                assert_eq!(a.draw(n, 1), vec![p[1]], "the requeued prompt comes first");
            }
        }
    }

    /// One simulated run: `workers` rollout workers and the learner, with durations drawn from
    /// `times`, driving [`Admission`] through its whole life; at `resume_at` (a learner step)
    /// the controller is rebuilt from its checkpoint state and in-flight work is discarded, as
    /// a resumed run does.
    struct Sim {
        eta: usize,
        workers: usize,
        steps: u64,
        batch: usize,
        on_stale: OnStale,
        /// Per event, a duration in 1..=9 (worker generation, learner update).
        times: Vec<u8>,
        /// Per group, whether the worker's version stamps it older (a worker that keeps old
        /// weights, as a straggler or an interrupted generation would).
        lag: Vec<u8>,
        resume_at: Option<u64>,
    }

    /// (finish time, serial, version, prompts) of a batch being generated.
    type InFlight = (u64, u64, u64, Vec<usize>);

    #[derive(Default)]
    struct Outcome {
        /// Prompts of trained groups.
        trained: Vec<usize>,
        /// Prompts of dropped groups.
        dropped_prompts: Vec<usize>,
        /// Stalenesses of trained groups.
        staleness: Vec<u64>,
        requeued: u64,
        dropped: u64,
        issued: Vec<usize>,
        pending_at_end: Vec<usize>,
        first_after_resume: Vec<u64>,
    }

    impl Sim {
        fn run(&self) -> Outcome {
            let data = 1000;
            let mut a = Admission::new(self.eta, loader(data), 0, PipelineState::default());
            let mut out = Outcome::default();
            let mut tick = 0usize;
            let mut next_time = || {
                tick += 1;
                u64::from(self.times[tick % self.times.len()])
            };
            // Worker i: its batch in flight.
            let mut busy: Vec<Option<InFlight>> = vec![None; self.workers];
            let mut queue: BTreeMap<u64, (u64, Vec<usize>)> = BTreeMap::new();
            let mut version = 1u64;
            let mut learner_free_at = 0u64;
            let mut now = 0u64;
            let mut g = 0usize;
            let mut resumed_step = None;
            while version <= self.steps {
                // Workers take the newest weights when they start a batch.
                for w in busy.iter_mut() {
                    if w.is_none() && a.can_issue(version) {
                        let s = a.issue();
                        let p = a.draw(s, self.batch);
                        out.issued.extend(&p);
                        *w = Some((now + next_time(), s, version, p));
                    }
                }
                for w in busy.iter_mut() {
                    if let Some((t, s, v, p)) = w.take_if(|b| b.0 <= now) {
                        let _ = t;
                        queue.insert(s, (v, p));
                    }
                }
                if now >= learner_free_at
                    && let Some((v, p)) = queue.remove(&a.next_to_consume())
                {
                    let serial = a.next_to_consume();
                    let oldest: Vec<u64> = p
                        .iter()
                        .map(|_| {
                            g += 1;
                            v.saturating_sub(u64::from(self.lag[g % self.lag.len()]))
                                .max(1)
                        })
                        .collect();
                    let c = a.consume(serial, version, &oldest, &p, self.on_stale);
                    for ((keep, o), prompt) in c.keep.iter().zip(&oldest).zip(&p) {
                        if !*keep && self.on_stale == OnStale::Drop {
                            out.dropped_prompts.push(*prompt);
                        }
                        if *keep {
                            out.trained.push(*prompt);
                            out.staleness.push(version - o);
                            if resumed_step == Some(version) {
                                out.first_after_resume.push(version - o);
                            }
                        }
                    }
                    version += 1;
                    learner_free_at = now + next_time();
                    if self.resume_at == Some(version - 1) {
                        // Kill: in-flight and queued work is lost; the checkpoint brings it back.
                        let state = a.state();
                        let cursor = a.cursor();
                        a = Admission::new(
                            self.eta,
                            DataLoader::new(data, 7, cursor).unwrap(),
                            version - 1,
                            state,
                        );
                        busy.iter_mut().for_each(|w| *w = None);
                        queue.clear();
                        resumed_step = Some(version);
                    }
                }
                now += 1;
            }
            let s = a.state();
            out.requeued = s.requeued;
            out.dropped = s.dropped;
            out.pending_at_end = s.pending;
            out
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        #[test]
        fn staleness_bound_and_prompt_accounting(
            eta in 0usize..4,
            workers in 1usize..4,
            steps in 1u64..25,
            batch in 1usize..5,
            on in prop_oneof![Just(OnStale::Requeue), Just(OnStale::Drop), Just(OnStale::Keep)],
            times in proptest::collection::vec(1u8..10, 1..16),
            lag in proptest::collection::vec(prop_oneof![4 => Just(0u8), 1 => 1u8..6], 1..16),
            resume in proptest::option::of(1u64..25),
        ) {
            let sim = Sim { eta, workers, steps, batch, on_stale: on, times, lag, resume_at: resume };
            let out = sim.run();
            // No trained group is older than η unless stale groups are kept.
            if on != OnStale::Keep {
                prop_assert!(out.staleness.iter().all(|&s| s <= eta as u64), "{:?}", out.staleness);
                prop_assert!(out.first_after_resume.iter().all(|&s| s <= eta as u64));
            } else {
                prop_assert_eq!(out.requeued + out.dropped, 0);
            }
            // Every prompt issued ends exactly once: trained, dropped, or still to be issued.
            prop_assert_eq!(out.dropped as usize, out.dropped_prompts.len());
            let count = |v: &[usize], p: usize| v.iter().filter(|&&x| x == p).count();
            let issued: BTreeSet<usize> = out.issued.iter().copied().collect();
            for &p in &issued {
                let fates = count(&out.trained, p) + count(&out.dropped_prompts, p)
                    + count(&out.pending_at_end, p);
                prop_assert_eq!(fates, 1, "prompt {} ended {} times", p, fates);
            }
            prop_assert!(out.trained.iter().all(|p| issued.contains(p)));
        }
    }

    #[test]
    fn histogram_fractions() {
        let m = staleness_metrics(5, &[5, 4, 3, 1], 2);
        assert_eq!(m["staleness/mean"], 7.0 / 4.0, "staleness 0, 1, 2 and 4");
        assert_eq!(m["staleness/max"], 4.0);
        assert_eq!(m["staleness/hist/0"], 0.25);
        assert_eq!(m["staleness/hist/2"], 0.25);
        assert_eq!(m["staleness/hist/over"], 0.25);
    }
}
