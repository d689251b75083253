//! The learner's process ranks on MPI ([`MpiGroup`], the `mpi` cargo feature): one process per
//! rank, started by `mpirun -np N`, `srun --mpi=pmix` or a Kubernetes MPIJob; world, rank and
//! local rank come from MPI (rsmpi over the system's MPI library, OpenMPI on Debian).
//!
//! A rank blocked in a collective cannot time out by itself, so every rank runs a watchdog
//! thread on a communicator of its own: it sends each other rank a heartbeat every
//! `distributed.timeout_s / 10` seconds (at most 5 s) and, when a rank has sent none for
//! `distributed.timeout_s`, prints an error naming it and aborts the job (`MPI_Abort`, exit
//! status 5) — a dead, stopped or hung rank stops every rank, and what rank 0 wrote last
//! (checkpoints are written temp → fsync → rename) is intact.

use super::DistributedSection;
use super::group::ProcessGroup;
use crate::{Result, TrainError};
use mpi::environment::Universe;
use mpi::request::{Request, StaticScope};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Largest piece one MPI call moves (MPI counts are `int`).
const PIECE: usize = 1 << 30;

/// Exit status of a job the watchdog aborts ([`TrainError::exit_code`] of
/// [`TrainError::Ranks`]).
const ABORT_STATUS: i32 = 5;

/// The environment variables MPI launchers set (OpenMPI's mpirun, PMI and PMIx: MPICH, Slurm's
/// srun, Kubernetes' MPIJob).
const LAUNCHER_VARS: [&str; 4] = ["OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"];

/// How to launch a recipe on MPI ranks.
pub const LAUNCH_HINT: &str = "launch every rank with an MPI launcher: mpirun -np N rlft train \
                               RECIPE (or srun --mpi=pmix, or a Kubernetes MPIJob)";

/// The learner's ranks as the processes of MPI's world.
pub struct MpiGroup {
    world: SimpleCommunicator,
    rank: usize,
    size: usize,
    local: (usize, usize),
    watchdog: Mutex<Option<Watchdog>>,
    /// [`ProcessGroup::bytes_sent`].
    sent: AtomicU64,
    // Last: MPI is finalised when the universe drops, after the communicators.
    _universe: Universe,
}

// SAFETY: MPI is initialised with `MPI_THREAD_MULTIPLE` (`MpiGroup::init` refuses less), under
// which MPI's handles may be used from any thread; every collective of `world` is made by one
// thread at a time (the learner's), as the `ProcessGroup` contract says.
unsafe impl Send for MpiGroup {}
// SAFETY: as for `Send`.
unsafe impl Sync for MpiGroup {}

impl MpiGroup {
    /// Joins MPI's world as one of its ranks and starts the watchdog.
    ///
    /// # Errors
    /// [`TrainError::Usage`] when the process was not started by an MPI launcher, MPI is
    /// already initialised, or the MPI library lacks `MPI_THREAD_MULTIPLE`.
    pub fn init(section: &DistributedSection) -> Result<Self> {
        if !LAUNCHER_VARS.iter().any(|v| std::env::var_os(v).is_some()) {
            return Err(TrainError::Usage(format!(
                "distributed.backend = \"mpi\" but this process was not started by an MPI \
                 launcher; {LAUNCH_HINT}"
            )));
        }
        let (universe, threading) = mpi::initialize_with_threading(mpi::Threading::Multiple)
            .ok_or_else(|| {
                TrainError::Usage("MPI is already initialised in this process".into())
            })?;
        if threading != mpi::Threading::Multiple {
            return Err(TrainError::Usage(format!(
                "the MPI library offers {threading:?} threading, and the ranks' watchdog needs \
                 Multiple: use an MPI built with thread support (Debian's OpenMPI has it)"
            )));
        }
        let world = universe.world();
        let (rank, size) = (world.rank() as usize, world.size() as usize);
        let node = world.split_shared(world.rank());
        let local = (node.rank() as usize, node.size() as usize);
        let timeout = Duration::from_secs_f64(section.timeout_s);
        let watchdog = Watchdog::start(world.duplicate(), timeout);
        Ok(Self {
            world,
            rank,
            size,
            local,
            watchdog: Mutex::new(Some(watchdog)),
            sent: AtomicU64::new(0),
            _universe: universe,
        })
    }

    /// Waits for every rank to end its run, then stops the watchdog.
    pub fn finish(&self) {
        self.world.barrier();
        self.stop_watchdog();
    }

    fn stop_watchdog(&self) {
        let w = match self.watchdog.lock() {
            Ok(mut w) => w.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        if let Some(w) = w {
            w.stop();
        }
    }

    /// Prints `err` and aborts every rank of the job with its exit status.
    pub fn abort(&self, err: &TrainError) -> ! {
        eprintln!("error (learner rank {}): {err}", self.rank);
        self.world.abort(i32::from(err.exit_code()))
    }

    /// Rank `root`'s `bytes` on every rank, in pieces of at most [`PIECE`] bytes.
    fn broadcast_from(&self, root: usize, mut bytes: Vec<u8>) -> Vec<u8> {
        if root == self.rank {
            let to = self.size.saturating_sub(1) as u64;
            self.sent
                .fetch_add(bytes.len() as u64 * to, Ordering::Relaxed);
        }
        let root = self.world.process_at_rank(root as i32);
        let mut len = bytes.len() as u64;
        // Every rank starts the length's broadcast without blocking (MPI matches a nonblocking
        // collective only with nonblocking ones): a rank waiting for the next message (rank 0
        // may be generating rollouts for minutes) sleeps between checks instead of spinning in
        // MPI's progress loop, which would hold a core the other ranks on the machine need.
        mpi::request::scope(|scope| {
            let mut pending = root.immediate_broadcast_into(scope, &mut len);
            let mut nap = Duration::from_micros(50);
            loop {
                match pending.test() {
                    Ok(_) => break,
                    Err(still) => pending = still,
                }
                std::thread::sleep(nap);
                nap = (nap * 2).min(Duration::from_millis(2));
            }
        });
        bytes.resize(len as usize, 0);
        for piece in bytes.chunks_mut(PIECE) {
            root.broadcast_into(piece);
        }
        bytes
    }
}

impl ProcessGroup for MpiGroup {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn local(&self) -> (usize, usize) {
        self.local
    }

    fn broadcast(&self, bytes: Vec<u8>) -> Result<Vec<u8>> {
        Ok(self.broadcast_from(0, bytes))
    }

    /// Each rank's bytes broadcast in turn: any size, in rank order.
    fn all_gather(&self, bytes: Vec<u8>) -> Result<Vec<Vec<u8>>> {
        let mut mine = Some(bytes);
        Ok((0..self.size)
            .map(|r| {
                let send = match r == self.rank {
                    true => mine.take().unwrap_or_default(),
                    false => Vec::new(),
                };
                self.broadcast_from(r, send)
            })
            .collect())
    }

    fn bytes_sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }
}

impl Drop for MpiGroup {
    fn drop(&mut self) {
        self.stop_watchdog();
    }
}

/// The heartbeat thread (see the module docs).
struct Watchdog {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

/// A heartbeat: its content is not read.
static BEAT: [u8; 1] = [1];

/// The heartbeats' tag on the watchdog's own communicator.
const BEAT_TAG: i32 = 7;

/// A communicator handed to the watchdog thread.
struct Owned(SimpleCommunicator);

// SAFETY: under `MPI_THREAD_MULTIPLE` a communicator may be used from another thread; this one
// is used by the watchdog thread alone.
unsafe impl Send for Owned {}

impl Watchdog {
    fn start(comm: SimpleCommunicator, timeout: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let comm = Owned(comm);
        let thread = std::thread::Builder::new()
            .name("rlft-rank-watchdog".into())
            .spawn(move || {
                let comm = comm;
                watch(&comm.0, timeout, &flag);
            })
            .unwrap_or_else(|e| panic!("cannot start the ranks' watchdog thread: {e}"));
        Self { stop, thread }
    }

    fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.thread.join();
    }
}

/// The watchdog's loop: beats to every other rank, beats from them, and the abort when one has
/// been silent for `timeout`.
fn watch(comm: &SimpleCommunicator, timeout: Duration, stop: &AtomicBool) {
    let (me, size) = (comm.rank() as usize, comm.size() as usize);
    let every = (timeout / 10).clamp(Duration::from_millis(50), Duration::from_secs(5));
    let start = Instant::now();
    let mut heard = vec![start; size];
    let mut sending: Vec<Option<Request<'static, [u8], StaticScope>>> =
        (0..size).map(|_| None).collect();
    let mut buf = [0u8; 1];
    while !stop.load(Ordering::SeqCst) {
        for (peer, slot) in sending.iter_mut().enumerate() {
            if peer == me {
                continue;
            }
            // A new beat once the last one has left: a silent peer does not pile them up.
            let pending = slot.take().and_then(|r| r.test().err());
            *slot = pending.or_else(|| {
                let p = comm.process_at_rank(peer as i32);
                Some(p.immediate_send_with_tag(StaticScope, &BEAT[..], BEAT_TAG))
            });
        }
        while let Some((msg, status)) = comm
            .any_process()
            .immediate_matched_probe_with_tag(BEAT_TAG)
        {
            msg.matched_receive_into(&mut buf);
            if let Some(h) = heard.get_mut(status.source_rank() as usize) {
                *h = Instant::now();
            }
        }
        let now = Instant::now();
        let silent: Vec<usize> = (0..size)
            .filter(|&r| r != me && now.duration_since(heard[r]) > timeout)
            .collect();
        if !silent.is_empty() {
            eprintln!(
                "error (learner rank {me}): learner rank(s) {silent:?} sent no heartbeat for \
                 {:.1} s (distributed.timeout_s): dead, stopped or unreachable; stopping every \
                 rank. The run's last checkpoint is intact: --resume continues from it, with \
                 these ranks or another number",
                timeout.as_secs_f64()
            );
            comm.abort(ABORT_STATUS);
        }
        std::thread::sleep(every);
    }
    // Beats still in flight to ranks that have finished are let go: MPI drops them at the end.
    for r in sending.into_iter().flatten() {
        std::mem::forget(r);
    }
}
