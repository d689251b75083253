//! How the learner's batches arrive (`Feed`): one owner for the admission controller, the
//! lagged snapshots and the rollout workers, whichever the mode uses.

use crate::recipe::{AsyncMode, OnStale};
use crate::rollout_side::admission::{Admission, Consumed, PipelineState};
use crate::rollout_side::lagged::Snapshots;
use crate::rollout_side::workers::Workers;
use crate::{Result, TrainError};
use rlft_model::Transformer;
use rlft_rollout::DataCursor;

/// How the learner's batches arrive: one owner for the admission controller, the lagged
/// snapshots and the rollout workers, whichever the mode uses.
pub(crate) enum Feed {
    /// Sync mode: collected on the learner's thread with the current weights.
    Inline(Admission),
    /// Lagged mode: collected on the learner's thread with the weights of `async.lag` versions
    /// ago.
    Lagged {
        /// Admission and the data order.
        admission: Admission,
        /// The policies of the kept versions.
        snapshots: Snapshots,
    },
    /// Async mode before the first RL step starts the rollout workers (and after they
    /// stopped): the admission controller they take and give back.
    AsyncIdle(Admission),
    /// Async mode: the rollout workers, which own the admission controller.
    Async(Workers),
    /// While the workers start or stop; a failure there leaves the feed so, and nothing is fed
    /// afterwards.
    Switching,
}

impl Feed {
    /// The feed of `mode`, starting with `admission`.
    pub(crate) fn new(mode: AsyncMode, admission: Admission, lag: usize) -> Self {
        match mode {
            AsyncMode::Sync => Feed::Inline(admission),
            AsyncMode::Lagged => Feed::Lagged {
                admission,
                snapshots: Snapshots::new(lag),
            },
            AsyncMode::Async => Feed::AsyncIdle(admission),
        }
    }

    /// Replaces the admission controller (a run resuming from a checkpoint, before the
    /// workers start).
    pub(crate) fn set_admission(&mut self, new: Admission) -> Result<()> {
        match self {
            Feed::Inline(a) | Feed::Lagged { admission: a, .. } | Feed::AsyncIdle(a) => {
                *a = new;
                Ok(())
            }
            Feed::Async(_) | Feed::Switching => Err(TrainError::Pipeline(
                "the admission state cannot change while the rollout workers run".into(),
            )),
        }
    }

    /// The admission controller, where this thread holds it.
    pub(crate) fn admission_mut(&mut self) -> Result<&mut Admission> {
        match self {
            Feed::Inline(a) | Feed::Lagged { admission: a, .. } | Feed::AsyncIdle(a) => Ok(a),
            Feed::Async(_) | Feed::Switching => Err(TrainError::Pipeline(
                "the admission controller is with the rollout workers".into(),
            )),
        }
    }

    /// Lagged mode's snapshots.
    pub(crate) fn snapshots(&self) -> Option<&Snapshots> {
        match self {
            Feed::Lagged { snapshots, .. } => Some(snapshots),
            _ => None,
        }
    }

    /// Lagged mode's snapshots, to restore from a checkpoint.
    pub(crate) fn snapshots_mut(&mut self) -> Option<&mut Snapshots> {
        match self {
            Feed::Lagged { snapshots, .. } => Some(snapshots),
            _ => None,
        }
    }

    /// The admission state and data position to checkpoint.
    pub(crate) fn checkpoint_state(&self) -> (PipelineState, DataCursor) {
        match self {
            Feed::Inline(a) | Feed::Lagged { admission: a, .. } | Feed::AsyncIdle(a) => {
                (a.state(), a.cursor())
            }
            Feed::Async(w) => w.checkpoint_state(),
            Feed::Switching => (PipelineState::default(), DataCursor::default()),
        }
    }

    /// Consumes a batch (see [`Admission::consume`]).
    pub(crate) fn consume(
        &mut self,
        serial: u64,
        oldest: &[u64],
        prompts: &[usize],
        on_stale: OnStale,
    ) -> Result<Consumed> {
        match self {
            Feed::Async(w) => Ok(w.consume(serial, serial, oldest, prompts, on_stale)),
            other => Ok(other
                .admission_mut()?
                .consume(serial, serial, oldest, prompts, on_stale)),
        }
    }

    /// Hands the learner's weights, as `version`, to the rollout workers (if they run) and
    /// the servers they sample on.
    ///
    /// # Errors
    /// A server that cannot take the weights.
    pub(crate) fn publish(
        &self,
        version: u64,
        weights: impl FnOnce() -> Transformer,
    ) -> Result<()> {
        match self {
            Feed::Async(w) => w.publish(version, weights()),
            _ => Ok(()),
        }
    }
}

/// What the async side reports with a batch (zeros inline).
#[derive(Debug, Default, Clone)]
pub(crate) struct FeedStats {
    /// Seconds the learner waited for the batch.
    pub waited_secs: f64,
    /// Groups finished and waiting after it.
    pub queue_groups: usize,
    /// Groups of this batch requeued / dropped for staleness.
    pub requeued: usize,
    pub dropped: usize,
    /// Worker seconds spent waiting, and tokens generated, since the last batch.
    pub rollout_wait_secs: f64,
    pub rollout_tokens: usize,
}
