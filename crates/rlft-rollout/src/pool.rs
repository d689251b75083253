//! A bounded worker pool for user code that may hang: reward functions and tools.
//!
//! A fixed number of long-lived threads take jobs from a queue. Each job has its own deadline,
//! measured from the moment a worker **starts** it, so a job never times out for having waited
//! in the queue behind others (a batch of 512 samples on 8 workers gets the same per-sample
//! budget as a batch of 8). The queue wait is still bounded: every running job either returns or
//! passes its deadline, and a job past its deadline whose function has not returned makes its
//! worker *stuck*.
//!
//! - A job past its deadline: the caller gets [`JobOutcome::TimedOut`] at once; the result, if it
//!   ever comes, is discarded. Threads cannot be killed, so the worker stays occupied until the
//!   function returns, and the pool never starts a replacement: it never grows past its size.
//! - A job that panics: [`JobOutcome::Panicked`]; the panic is caught and the worker survives.
//! - Every worker stuck: a caller whose job is still queued waits one more deadline (the job's
//!   own timeout) for a worker to come back, then gets [`RolloutError::WorkersStuck`] naming the
//!   hung functions, instead of waiting forever.
//!
//! Workers start on demand, one per queued job that finds no idle worker, up to the size, and
//! exit when the pool is dropped (a stuck one when its function finally returns).

use crate::{Result, RolloutError};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

/// What a finished, failed or late job gives its caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobOutcome<T> {
    /// The function returned in time.
    Finished(T),
    /// The function panicked (the message); the worker survived.
    Panicked(String),
    /// The function ran past its deadline; a later result is discarded.
    TimedOut {
        /// What was running at the deadline (see [`WorkerPool::submit`]).
        label: String,
        /// The deadline, from the job's start.
        after: Duration,
    },
}

/// A snapshot of a pool's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Most worker threads the pool may have.
    pub size: usize,
    /// Worker threads alive now.
    pub alive: usize,
    /// The most worker threads ever alive at once (never above `size`).
    pub max_alive: usize,
    /// Workers running a job now (a worker frees its slot just after its caller gets the result).
    pub busy: usize,
    /// Workers running a job past its deadline (a function that has not returned).
    pub stuck: usize,
    /// Jobs waiting for a worker.
    pub queued: usize,
}

type Task = Box<dyn FnOnce(Instant) + Send + 'static>;

struct Queued {
    id: u64,
    label: String,
    timeout: Duration,
    task: Task,
}

#[derive(Clone)]
struct Running {
    id: u64,
    label: String,
    start: Instant,
    timeout: Duration,
}

impl Running {
    fn is_stuck(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.start) > self.timeout
    }
}

#[derive(Default)]
struct State {
    queue: VecDeque<Queued>,
    /// One slot per worker index: the job it runs.
    slots: Vec<Option<Running>>,
    alive: usize,
    max_alive: usize,
    idle: usize,
    next_id: u64,
    shutdown: bool,
}

struct Shared {
    name: String,
    size: usize,
    state: Mutex<State>,
    work: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // User code never runs under the lock, so a poisoned lock still holds consistent state.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

thread_local! {
    /// The pool and slot of the worker running on this thread.
    static CURRENT: RefCell<Option<(Weak<Shared>, usize)>> = const { RefCell::new(None) };
}

/// Renames the job running on the current worker thread, so that a timeout or a
/// [`RolloutError::WorkersStuck`] names the function that is actually running (a reward set sets
/// it to each term in turn). Does nothing outside a pool worker.
pub(crate) fn set_job_label(label: impl FnOnce() -> String) {
    CURRENT.with(|c| {
        if let Some((shared, idx)) = &*c.borrow()
            && let Some(shared) = shared.upgrade()
            && let Some(Some(run)) = shared.lock().slots.get_mut(*idx)
        {
            run.label = label();
        }
    });
}

enum Msg<T> {
    Started(Instant),
    Finished(std::result::Result<T, String>, Duration),
}

/// A fixed-size pool of worker threads with per-job deadlines. Share it (it is cheap to keep,
/// not to rebuild): [`crate::RewardSet`] and [`crate::ToolEnv`] keep theirs behind an `Arc` that
/// their clones share.
pub struct WorkerPool {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for WorkerPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerPool")
            .field("name", &self.shared.name)
            .field("stats", &self.stats())
            .finish()
    }
}

impl WorkerPool {
    /// The default size: the available parallelism, clamped to 4..=32 (at least 4 so that a
    /// couple of hung functions do not stop a small machine at once).
    pub fn default_size() -> usize {
        std::thread::available_parallelism()
            .map_or(4, |n| n.get())
            .clamp(4, 32)
    }

    /// A pool of at most `size` threads (at least 1) for `name`d work (`"reward"`, `"tool"`: used
    /// in thread names and errors). No thread starts before the first job.
    pub fn new(name: impl Into<String>, size: usize) -> Self {
        let size = size.max(1);
        Self {
            shared: Arc::new(Shared {
                name: name.into(),
                size,
                state: Mutex::new(State {
                    slots: vec![None; size],
                    ..State::default()
                }),
                work: Condvar::new(),
            }),
        }
    }

    /// Most worker threads.
    pub fn size(&self) -> usize {
        self.shared.size
    }

    /// The pool's counters now.
    pub fn stats(&self) -> PoolStats {
        let st = self.shared.lock();
        let now = Instant::now();
        let running = st.slots.iter().flatten();
        PoolStats {
            size: self.shared.size,
            alive: st.alive,
            max_alive: st.max_alive,
            busy: running.clone().count(),
            stuck: running.filter(|r| r.is_stuck(now)).count(),
            queued: st.queue.len(),
        }
    }

    /// Queues `f` under `label` (what errors call it, e.g. `reward 'correct'`) with `timeout`
    /// counted from its start on a worker. Dropping the ticket before the job starts cancels it.
    ///
    /// # Errors
    ///
    /// [`RolloutError::Config`] when the pool has no worker thread and the system refuses to
    /// start one.
    pub fn submit<T, F>(
        &self,
        label: impl Into<String>,
        timeout: Duration,
        f: F,
    ) -> Result<Ticket<T>>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let (tx, rx) = mpsc::channel();
        let task: Task = Box::new(move |start| {
            // A dropped ticket means nobody waits: skip the work.
            if tx.send(Msg::Started(start)).is_err() {
                return;
            }
            let out = catch_unwind(AssertUnwindSafe(f)).map_err(|p| panic_message(&*p));
            let _ = tx.send(Msg::Finished(out, start.elapsed()));
        });
        let label = label.into();
        let mut st = self.shared.lock();
        let id = st.next_id;
        st.next_id += 1;
        st.queue.push_back(Queued {
            id,
            label: label.clone(),
            timeout,
            task,
        });
        if st.alive < self.shared.size
            && st.queue.len() > st.idle
            && let Err(e) = self.spawn_worker(&mut st)
        {
            st.queue.pop_back();
            return Err(e);
        }
        drop(st);
        self.shared.work.notify_one();
        Ok(Ticket {
            shared: Arc::clone(&self.shared),
            rx,
            id,
            label,
            timeout,
            started: false,
        })
    }

    /// [`submit`](Self::submit) then [`Ticket::wait`].
    ///
    /// # Errors
    ///
    /// As [`submit`](Self::submit) and [`Ticket::wait`].
    pub fn run<T, F>(
        &self,
        label: impl Into<String>,
        timeout: Duration,
        f: F,
    ) -> Result<JobOutcome<T>>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        self.submit(label, timeout, f)?.wait()
    }

    fn spawn_worker(&self, st: &mut State) -> Result<()> {
        // Workers only exit when the pool is dropped, so the alive ones hold slots 0..alive.
        let idx = st.alive;
        let shared = Arc::clone(&self.shared);
        let spawned = std::thread::Builder::new()
            .name(format!("rlft-{}-{idx}", self.shared.name))
            .spawn(move || worker_loop(&shared, idx));
        match spawned {
            Ok(_) => {
                st.alive += 1;
                st.max_alive = st.max_alive.max(st.alive);
                Ok(())
            }
            // Fewer workers than asked still work; none does not.
            Err(_) if st.alive > 0 => Ok(()),
            Err(e) => Err(RolloutError::Config(format!(
                "cannot start a {} worker thread ({e}); lower the worker count or free system \
                 resources",
                self.shared.name
            ))),
        }
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        st.shutdown = true;
        // Queued jobs are dropped; their tickets (if any) see the pool gone.
        st.queue.clear();
        drop(st);
        self.shared.work.notify_all();
    }
}

fn worker_loop(shared: &Arc<Shared>, idx: usize) {
    CURRENT.with(|c| *c.borrow_mut() = Some((Arc::downgrade(shared), idx)));
    let mut st = shared.lock();
    while !st.shutdown {
        let Some(job) = st.queue.pop_front() else {
            st.idle += 1;
            st = shared.work.wait(st).unwrap_or_else(PoisonError::into_inner);
            st.idle -= 1;
            continue;
        };
        let start = Instant::now();
        st.slots[idx] = Some(Running {
            id: job.id,
            label: job.label,
            start,
            timeout: job.timeout,
        });
        drop(st);
        (job.task)(start);
        st = shared.lock();
        st.slots[idx] = None;
    }
    st.alive -= 1;
}

/// The message of a caught panic (`catch_unwind`'s payload): its text, or a placeholder for a
/// payload that is not a string.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".into())
}

/// A queued job; [`wait`](Self::wait) for its outcome. Dropping it before the job starts
/// cancels the job.
pub struct Ticket<T> {
    shared: Arc<Shared>,
    rx: mpsc::Receiver<Msg<T>>,
    id: u64,
    label: String,
    timeout: Duration,
    started: bool,
}

impl<T> Drop for Ticket<T> {
    fn drop(&mut self) {
        if !self.started {
            // Cancelled: free the queue (and the job's input) now, not when a worker frees up.
            self.shared.lock().queue.retain(|q| q.id != self.id);
        }
    }
}

impl<T> std::fmt::Debug for Ticket<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket")
            .field("id", &self.id)
            .field("label", &self.label)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl<T> Ticket<T> {
    /// Waits until the job returns or passes its deadline (from its start on a worker).
    ///
    /// # Errors
    ///
    /// [`RolloutError::WorkersStuck`] when the job is still queued and every worker has been
    /// stuck on a hung function for the job's own timeout: no worker will come back.
    pub fn wait(mut self) -> Result<JobOutcome<T>> {
        let poll = (self.timeout / 4).clamp(Duration::from_millis(1), Duration::from_millis(50));
        let mut all_stuck_since: Option<Instant> = None;
        let start = loop {
            match self.rx.recv_timeout(poll) {
                Ok(Msg::Started(start)) => break start,
                Ok(Msg::Finished(out, took)) => {
                    self.started = true;
                    return Ok(self.finished(out, took));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Ok(JobOutcome::Panicked(format!(
                        "the {} worker pool shut down before the job ran",
                        self.shared.name
                    )));
                }
                Err(RecvTimeoutError::Timeout) => {
                    let now = Instant::now();
                    if let Some(err) = self.all_stuck(now) {
                        let since = *all_stuck_since.get_or_insert(now);
                        if now.duration_since(since) >= self.timeout {
                            return Err(err);
                        }
                    } else {
                        all_stuck_since = None;
                    }
                }
            }
        };
        self.started = true;
        let msg = match start.checked_add(self.timeout) {
            Some(deadline) => self
                .rx
                .recv_timeout(deadline.saturating_duration_since(Instant::now())),
            None => self.rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        Ok(match msg {
            Ok(Msg::Finished(out, took)) => self.finished(out, took),
            Ok(Msg::Started(_)) | Err(RecvTimeoutError::Disconnected) => {
                JobOutcome::Panicked("the worker vanished without a result".into())
            }
            Err(RecvTimeoutError::Timeout) => self.timed_out(),
        })
    }

    fn finished(&self, out: std::result::Result<T, String>, took: Duration) -> JobOutcome<T> {
        match out {
            // Late: discarded, even when the caller only looks now.
            _ if took > self.timeout => self.timed_out(),
            Ok(v) => JobOutcome::Finished(v),
            Err(msg) => JobOutcome::Panicked(msg),
        }
    }

    fn timed_out(&self) -> JobOutcome<T> {
        let st = self.shared.lock();
        let label = st
            .slots
            .iter()
            .flatten()
            .find(|r| r.id == self.id)
            .map_or_else(|| self.label.clone(), |r| r.label.clone());
        JobOutcome::TimedOut {
            label,
            after: self.timeout,
        }
    }

    /// The error to give when every alive worker is stuck now.
    fn all_stuck(&self, now: Instant) -> Option<RolloutError> {
        let st = self.shared.lock();
        let running: Vec<&Running> = st.slots.iter().flatten().collect();
        if st.alive == 0 || running.len() < st.alive || !running.iter().all(|r| r.is_stuck(now)) {
            return None;
        }
        let mut hung: Vec<(String, usize, Duration, Duration)> = Vec::new();
        for r in running {
            let ran = now.saturating_duration_since(r.start);
            match hung.iter_mut().find(|h| h.0 == r.label) {
                Some(h) => {
                    h.1 += 1;
                    h.2 = h.2.max(ran);
                }
                None => hung.push((r.label.clone(), 1, ran, r.timeout)),
            }
        }
        let hung = hung
            .iter()
            .map(|(label, n, ran, limit)| {
                format!(
                    "{label} on {n} worker(s), running for up to {ran:.1?} (deadline {limit:?})"
                )
            })
            .collect::<Vec<_>>()
            .join("; ");
        Some(RolloutError::WorkersStuck {
            pool: self.shared.name.clone(),
            workers: st.alive,
            hung,
        })
    }
}

/// Test helpers: a function that "never returns" until the test lets it go.
#[cfg(test)]
pub(crate) mod testing {
    use super::WorkerPool;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    /// `hang` blocks until `open`: a hung function whose thread the test can still release.
    #[derive(Clone, Default)]
    pub(crate) struct Gate(Arc<AtomicBool>);

    impl Gate {
        pub(crate) fn hang(&self) {
            while !self.0.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        pub(crate) fn open(&self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    /// Waits (up to 5 s) for every worker to be free again.
    pub(crate) fn wait_idle(pool: &WorkerPool) {
        let t = Instant::now();
        while pool.stats().busy > 0 {
            assert!(t.elapsed() < Duration::from_secs(5), "{pool:?} never idle");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{Gate, wait_idle};
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn deadline_counts_from_the_start_not_the_queue() {
        // 8 jobs of 50 ms on one worker: 400 ms in all, each well inside its 250 ms deadline.
        let pool = WorkerPool::new("test", 1);
        let tickets: Vec<_> = (0..8)
            .map(|i| {
                pool.submit("sleep", 250 * MS, move || {
                    std::thread::sleep(50 * MS);
                    i
                })
                .unwrap()
            })
            .collect();
        let t = Instant::now();
        let out: Vec<_> = tickets.into_iter().map(|t| t.wait().unwrap()).collect();
        assert!(t.elapsed() >= 350 * MS, "{:?}", t.elapsed());
        assert_eq!(out, (0..8).map(JobOutcome::Finished).collect::<Vec<_>>());
        let s = pool.stats();
        assert_eq!((s.size, s.alive, s.max_alive, s.queued), (1, 1, 1, 0));
    }

    #[test]
    fn a_hung_job_times_out_at_its_deadline_and_keeps_its_worker() {
        let pool = WorkerPool::new("test", 2);
        let gate = Gate::default();
        let g = gate.clone();
        let t = Instant::now();
        let out = pool.run("job 'hang'", 100 * MS, move || g.hang()).unwrap();
        let took = t.elapsed();
        assert!(
            matches!(&out, JobOutcome::TimedOut { label, after } if label == "job 'hang'" && *after == 100 * MS),
            "{out:?}"
        );
        assert!((100 * MS..1000 * MS).contains(&took), "{took:?}");
        let s = pool.stats();
        assert_eq!((s.busy, s.stuck), (1, 1), "{s:?}");
        // The other worker goes on.
        for i in 0..10 {
            assert_eq!(
                pool.run("ok", 100 * MS, move || i).unwrap(),
                JobOutcome::Finished(i)
            );
        }
        assert_eq!(pool.stats().max_alive, 2);
        gate.open();
        wait_idle(&pool);
        assert_eq!(pool.stats().stuck, 0);
    }

    #[test]
    fn a_late_result_is_discarded_even_when_the_caller_looks_late() {
        let pool = WorkerPool::new("test", 1);
        let ticket = pool
            .submit("slow", 50 * MS, || {
                std::thread::sleep(150 * MS);
                1
            })
            .unwrap();
        std::thread::sleep(400 * MS);
        assert!(matches!(
            ticket.wait().unwrap(),
            JobOutcome::TimedOut { .. }
        ));
    }

    #[test]
    fn a_panic_fails_its_job_and_the_worker_survives() {
        let pool = WorkerPool::new("test", 1);
        let out = pool.run("boom", Duration::from_secs(5), || -> u8 { panic!("boom") });
        assert_eq!(out.unwrap(), JobOutcome::Panicked("boom".into()));
        let out = pool.run("ok", Duration::from_secs(5), || 7);
        assert_eq!(out.unwrap(), JobOutcome::Finished(7));
        // `busy` is a snapshot: the worker frees its slot just after sending the result.
        wait_idle(&pool);
        let s = pool.stats();
        assert_eq!((s.alive, s.max_alive, s.busy), (1, 1, 0));
    }

    #[test]
    fn every_worker_stuck_is_an_error_not_a_hang() {
        let pool = WorkerPool::new("test", 2);
        let gate = Gate::default();
        let t = Instant::now();
        let tickets: Vec<_> = (0..4)
            .map(|_| {
                let g = gate.clone();
                pool.submit("job 'hang'", 50 * MS, move || g.hang())
                    .unwrap()
            })
            .collect();
        let mut out = tickets.into_iter().map(Ticket::wait);
        for _ in 0..2 {
            assert!(matches!(out.next(), Some(Ok(JobOutcome::TimedOut { .. }))));
        }
        let err = out.next().unwrap().unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        assert!(
            matches!(&err, RolloutError::WorkersStuck { pool, workers: 2, hung }
                if pool == "test" && hung.contains("job 'hang' on 2 worker(s)")),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(msg.contains("all 2 test worker threads are stuck"), "{msg}");
        assert!(msg.contains("with_workers"), "{msg}");
        drop(out);
        // The dropped tickets cancelled their jobs: nothing left queued.
        assert_eq!(pool.stats().queued, 0);
        gate.open();
        wait_idle(&pool);
        assert_eq!(
            pool.run("ok", 50 * MS, || 1).unwrap(),
            JobOutcome::Finished(1)
        );
        assert_eq!(pool.stats().max_alive, 2);
    }
}
