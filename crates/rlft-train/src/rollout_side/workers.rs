//! Rollout worker threads (`[async] mode = "async"`): each owns a policy snapshot, takes the
//! next batch the [`Admission`] controller allows, generates and scores it, and queues it for
//! the learner; the learner publishes its weights after every update.
//!
//! A worker picks up the newest published weights when it starts a batch, and admission counts
//! the version of those weights, so a version is admitted only once its weights reached a
//! worker. Publishing is a frozen view (`valid()`) of the learner's parameters, moved to
//! `rollout.device` when that differs; the learner never waits for more than that.

use crate::events::{EventKind, Timeline};
use crate::rollout_side::admission::{Admission, Consumed, OnStale, PipelineState};
use crate::rollout_side::collect::{Collected, RolloutSide};
use crate::rollout_side::servers::Fleet;
use crate::{Result, TrainError};
use burn::module::Module;
use burn::tensor::Device;
use rlft_model::Transformer;
use rlft_rollout::{DataCursor, RolloutError, WeightUpdate, panic_message};
use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

/// What the workers and the learner share.
struct State {
    admission: Admission,
    /// Finished batches by serial.
    queue: BTreeMap<u64, Result<Collected>>,
    /// The newest published weights and their version.
    weights: (u64, Transformer),
    stop: bool,
    /// Since the learner last read them: worker seconds spent waiting, generated tokens.
    rollout_wait_secs: f64,
    rollout_tokens: usize,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wait<'a>(&self, g: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.changed.wait(g).unwrap_or_else(PoisonError::into_inner)
    }
}

/// How the rollout side is laid out.
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    /// Worker threads, each with its own snapshot.
    pub workers: usize,
    /// Compute threads per worker (`None`: the global pool).
    pub threads: Option<usize>,
    /// Where the workers' snapshots live (`None`: the learner's device).
    pub device: Option<Device>,
}

/// What the learner gets with a batch.
pub struct Delivery {
    /// The batch.
    pub batch: Collected,
    /// Seconds the learner waited for it.
    pub waited_secs: f64,
    /// Groups finished and waiting in the queue after it was taken.
    pub queue_groups: usize,
    /// Worker seconds spent waiting since the last delivery.
    pub rollout_wait_secs: f64,
    /// Tokens the workers generated since the last delivery.
    pub rollout_tokens: usize,
}

/// The running rollout workers.
pub struct Workers {
    shared: Arc<Shared>,
    handles: Vec<JoinHandle<()>>,
    device: Option<Device>,
    timeline: Arc<Timeline>,
    /// The servers the workers sample on, if any.
    fleet: Option<Arc<Fleet>>,
}

impl Workers {
    /// Starts `settings.workers` threads sampling with `weights` (version `version`).
    ///
    /// # Errors
    /// A compute pool or thread that cannot be created.
    pub fn start(
        side: RolloutSide,
        admission: Admission,
        version: u64,
        weights: Transformer,
        settings: &WorkerSettings,
        timeline: Arc<Timeline>,
    ) -> Result<Self> {
        let weights = match &settings.device {
            Some(d) => weights.to_device(d),
            None => weights,
        };
        if let Some(fleet) = &side.fleet {
            fleet.serve_version(version, || weights.clone())?;
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                admission,
                queue: BTreeMap::new(),
                weights: (version, weights),
                stop: false,
                rollout_wait_secs: 0.0,
                rollout_tokens: 0,
            }),
            changed: Condvar::new(),
        });
        let fleet = side.fleet.clone();
        let mut handles = Vec::new();
        for i in 0..settings.workers.max(1) {
            let pool = settings
                .threads
                .map(|n| crate::compute_pool(n, move |k| format!("rlft-rollout-{i}-{k}")))
                .transpose()
                .map_err(|e| TrainError::Worker {
                    worker: i,
                    msg: format!("cannot build its compute threads: {e}"),
                })?;
            let (shared, side, timeline) = (shared.clone(), side.clone(), timeline.clone());
            let h = std::thread::Builder::new()
                .name(format!("rlft-rollout-{i}"))
                .spawn(move || {
                    let work = || worker(i, &shared, &side, &timeline);
                    match pool {
                        Some(p) => p.install(work),
                        None => work(),
                    }
                })
                .map_err(|e| TrainError::Worker {
                    worker: i,
                    msg: format!("cannot start its thread: {e}"),
                })?;
            handles.push(h);
        }
        Ok(Self {
            shared,
            handles,
            device: settings.device.clone(),
            timeline,
            fleet,
        })
    }

    /// Waits for batch `serial` and takes it.
    ///
    /// # Errors
    /// The batch's rollout failed, or every worker has stopped.
    pub fn take(&self, serial: u64) -> Result<Delivery> {
        let t0 = self.timeline.now();
        let mut st = self.shared.lock();
        loop {
            if let Some(batch) = st.queue.remove(&serial) {
                let waited = self.timeline.now() - t0;
                let queue_groups = st
                    .queue
                    .values()
                    .map(|b| b.as_ref().map_or(0, |c| c.groups.len()))
                    .sum();
                let d = Delivery {
                    batch: batch?,
                    waited_secs: waited,
                    queue_groups,
                    rollout_wait_secs: std::mem::take(&mut st.rollout_wait_secs),
                    rollout_tokens: std::mem::take(&mut st.rollout_tokens),
                };
                drop(st);
                self.timeline
                    .record("learner", EventKind::Wait, t0, t0 + waited, serial, 0);
                return Ok(d);
            }
            if self.handles.iter().all(JoinHandle::is_finished) {
                return Err(TrainError::Pipeline(
                    "every rollout worker has stopped; see the error above".into(),
                ));
            }
            st = self.shared.wait(st);
        }
    }

    /// Consumes a batch taken with [`Workers::take`] (see [`Admission::consume`]).
    pub fn consume(
        &self,
        serial: u64,
        version: u64,
        oldest: &[u64],
        prompts: &[usize],
        on_stale: OnStale,
    ) -> Consumed {
        let c = self
            .shared
            .lock()
            .admission
            .consume(serial, version, oldest, prompts, on_stale);
        // Requeued prompts and a consumed batch may let a waiting worker start.
        self.shared.changed.notify_all();
        c
    }

    /// Publishes the learner's weights as `version`; on servers, once every server serves
    /// them, so a version is admitted only when it can sample.
    ///
    /// # Errors
    /// A server that cannot take the weights.
    pub fn publish(&self, version: u64, weights: Transformer) -> Result<()> {
        let t0 = self.timeline.now();
        let weights = match &self.device {
            Some(d) => weights.to_device(d),
            None => weights,
        };
        if let Some(fleet) = &self.fleet {
            fleet.serve_version(version, || weights.clone())?;
        }
        self.shared.lock().weights = (version, weights);
        self.shared.changed.notify_all();
        self.timeline.published(t0, version);
        Ok(())
    }

    /// The admission state to checkpoint and the fresh-data position.
    pub fn checkpoint_state(&self) -> (PipelineState, DataCursor) {
        let st = self.shared.lock();
        (st.admission.state(), st.admission.cursor())
    }
}

impl Workers {
    /// Stops the workers (each finishes the batch it is generating first) and returns the
    /// admission state: batches issued and not consumed are issued again by whoever continues.
    pub fn finish(mut self) -> (PipelineState, DataCursor) {
        self.halt();
        self.checkpoint_state()
    }

    fn halt(&mut self) {
        self.shared.lock().stop = true;
        self.shared.changed.notify_all();
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

impl Drop for Workers {
    /// Stops the workers; each finishes the batch it is generating first.
    fn drop(&mut self) {
        self.halt();
    }
}

/// One worker's loop: wait for admission, take the newest weights, collect a batch, queue it.
fn worker(i: usize, shared: &Shared, side: &RolloutSide, timeline: &Timeline) {
    let actor = format!("rollout/{i}");
    loop {
        let t_wait = timeline.now();
        let (serial, version, model) = {
            let mut st = shared.lock();
            loop {
                if st.stop {
                    return;
                }
                if st.admission.can_issue(st.weights.0) {
                    break;
                }
                st = shared.wait(st);
            }
            let serial = st.admission.issue();
            (serial, st.weights.0, st.weights.1.clone())
        };
        let t_start = timeline.now();
        timeline.record(&actor, EventKind::Wait, t_wait, t_start, version, 0);
        // Interruptible generation: newer weights reach the batch between decode steps.
        let mut have = version;
        let mut poll = || {
            let st = shared.lock();
            (st.weights.0 > have).then(|| {
                have = st.weights.0;
                WeightUpdate {
                    version: st.weights.0,
                    model: st.weights.1.clone(),
                }
            })
        };
        let result = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            side.collect(
                &model,
                version,
                serial,
                &mut |n| shared.lock().admission.draw(serial, n),
                Some(&mut poll),
            )
        })) {
            Ok(Err(TrainError::Rollout(RolloutError::Server(msg)))) => Err(TrainError::Servers(
                format!("rollout worker {i}, batch {serial}: {msg}"),
            )),
            Ok(collected) => collected.map_err(|e| TrainError::Worker {
                worker: i,
                msg: format!("batch {serial}: {e}"),
            }),
            Err(p) => Err(TrainError::Worker {
                worker: i,
                msg: format!(
                    "panicked while generating batch {serial}: {}",
                    panic_message(&*p)
                ),
            }),
        };
        let t_end = timeline.now();
        let (tokens, score) = result
            .as_ref()
            .map_or((0, 0.0), |c| (c.tokens, c.score_secs));
        // Generation and scoring interleave inside a batch; the timeline shows scoring last.
        let t_score = (t_end - score).max(t_start);
        timeline.record(
            &actor,
            EventKind::Generate,
            t_start,
            t_score,
            version,
            tokens,
        );
        timeline.record(&actor, EventKind::Score, t_score, t_end, version, 0);
        let failed = result.is_err();
        let mut st = shared.lock();
        st.rollout_wait_secs += t_start - t_wait;
        st.rollout_tokens += tokens;
        st.queue.insert(serial, result);
        drop(st);
        shared.changed.notify_all();
        if failed {
            return;
        }
    }
}
