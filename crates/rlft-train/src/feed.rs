//! Where the learner's batches come from: collected inline (sync and lagged modes) or taken
//! from the rollout workers (async mode), then consumed under the staleness bound.

use crate::events::{Event, EventKind};
use crate::rollout_side::admission::{Admission, PipelineState};
use crate::rollout_side::collect::Collected;
use crate::rollout_side::feed::{Feed, FeedStats};
use crate::rollout_side::workers::{WorkerSettings, Workers};
use crate::trainer::Trainer;
use crate::{Result, TrainError};
use burn::module::Module;
use rlft_rollout::{DataCursor, DataLoader};

impl Trainer {
    /// The admission controller of a run at `consumed` steps, continuing from `state`.
    pub(crate) fn admission(
        &self,
        cursor: DataCursor,
        consumed: usize,
        state: PipelineState,
    ) -> Result<Admission> {
        let loader = DataLoader::new(self.train_set.len(), self.recipe.seed, cursor)?;
        Ok(Admission::new(
            self.recipe.asynchrony.eta(),
            loader,
            consumed as u64,
            state,
        ))
    }

    /// Step `step`'s batch, consumed: groups older than η are requeued, dropped or kept.
    pub(crate) fn next_batch(&mut self, step: usize) -> Result<(Collected, FeedStats)> {
        let serial = step as u64;
        let mut stats = FeedStats::default();
        if let Feed::AsyncIdle(_) = self.feed {
            self.start_workers(step)?;
        }
        let mut batch = if let Feed::Async(w) = &self.feed {
            let d = w.take(serial)?;
            stats.waited_secs = d.waited_secs;
            stats.queue_groups = d.queue_groups;
            stats.rollout_wait_secs = d.rollout_wait_secs;
            stats.rollout_tokens = d.rollout_tokens;
            d.batch
        } else {
            self.collect_inline(step)?
        };
        let oldest: Vec<u64> = batch
            .groups
            .iter()
            .map(|g| g.oldest_version().unwrap_or(serial))
            .collect();
        let on_stale = self.recipe.asynchrony.on_stale();
        let consumed = self
            .feed
            .consume(serial, &oldest, &batch.prompts, on_stale)?;
        stats.requeued = consumed.requeued;
        stats.dropped = consumed.dropped;
        let now = self.timeline.now();
        self.timeline.push(Event {
            actor: "learner".into(),
            kind: EventKind::Consume,
            start_s: now,
            end_s: now,
            version: serial,
            tokens: 0,
            batch: Some(serial),
            groups: Some(
                batch
                    .prompts
                    .iter()
                    .zip(&consumed.keep)
                    .filter(|(_, k)| **k)
                    .map(|(p, _)| *p)
                    .collect(),
            ),
            server: None,
            outcome: None,
        });
        if consumed.keep.iter().any(|k| !k) {
            let mut keep = consumed.keep.iter();
            batch
                .groups
                .retain(|_| keep.next().copied().unwrap_or(true));
            let mut keep = consumed.keep.iter();
            batch
                .prompts
                .retain(|_| keep.next().copied().unwrap_or(true));
        }
        Ok((batch, stats))
    }

    /// Collects batch `step` on this thread, with the current weights or, in lagged mode, those
    /// of `async.lag` versions ago; on servers, after bringing them to that version.
    fn collect_inline(&mut self, step: usize) -> Result<Collected> {
        let current = self.policy().valid();
        let (version, model) = match self.feed.snapshots_mut() {
            Some(s) => {
                let (v, m) = s.sample_with(step as u64, current);
                (v, m.clone())
            }
            None => (step as u64, current),
        };
        if let Some(fleet) = &self.side.fleet {
            let t0 = self.timeline.now();
            fleet.serve_version(version, || model.clone())?;
            self.timeline.record(
                "learner",
                EventKind::Publish,
                t0,
                self.timeline.now(),
                version,
                0,
            );
        }
        let admission = self.feed.admission_mut()?;
        let serial = admission.issue();
        let t0 = self.timeline.now();
        let c = self.side.collect(
            &model,
            version,
            serial,
            &mut |n| admission.draw(serial, n),
            None,
        )?;
        let t1 = self.timeline.now();
        let t_score = (t1 - c.score_secs).max(t0);
        let actor = "rollout/0";
        self.timeline
            .record(actor, EventKind::Generate, t0, t_score, version, c.tokens);
        self.timeline
            .record(actor, EventKind::Score, t_score, t1, version, 0);
        Ok(c)
    }

    /// Starts the rollout workers with the current weights (version `step`), handing them the
    /// admission controller.
    fn start_workers(&mut self, step: usize) -> Result<()> {
        let Feed::AsyncIdle(admission) = std::mem::replace(&mut self.feed, Feed::Switching) else {
            return Err(TrainError::Pipeline(
                "the rollout workers start from async mode's idle feed".into(),
            ));
        };
        let a = &self.recipe.asynchrony;
        let device = self.recipe.rollout.device.map(|d| d.device()).transpose()?;
        let settings = WorkerSettings {
            workers: a.rollout_workers.unwrap_or(1),
            threads: a.rollout_threads,
            device,
        };
        self.feed = Feed::Async(Workers::start(
            self.side.clone(),
            admission,
            step as u64,
            self.policy().valid(),
            &settings,
            self.timeline.clone(),
        )?);
        Ok(())
    }

    /// After the update of step `step`: hands the new weights (version `step + 1`) to the
    /// rollout workers, and to the servers they sample on.
    ///
    /// # Errors
    /// A server that cannot take the weights.
    pub(crate) fn publish(&self, step: usize) -> Result<()> {
        self.feed.publish(step as u64 + 1, || self.policy().valid())
    }

    /// Stops the rollout workers, putting their admission state back (so a checkpoint written
    /// afterwards still holds the prompts in flight).
    pub(crate) fn stop_workers(&mut self) -> Result<()> {
        match std::mem::replace(&mut self.feed, Feed::Switching) {
            Feed::Async(w) => {
                let (state, cursor) = w.finish();
                self.feed = Feed::AsyncIdle(self.admission(cursor, self.state.step, state)?);
            }
            other => self.feed = other,
        }
        Ok(())
    }
}
