//! The collect stage: where the learner's batches come from — collected inline (sync and
//! lagged modes) or taken from the rollout workers (async mode), rewards scored on the rollout
//! side in both — then consumed under the staleness bound.

use crate::events::{Event, EventKind, Timeline};
use crate::recipe::Recipe;
use crate::rollout_side::admission::{Admission, PipelineState};
use crate::rollout_side::collect::{Collected, RolloutSide};
use crate::rollout_side::feed::{Feed, FeedStats};
use crate::rollout_side::workers::{WorkerSettings, Workers};
use crate::{Result, TrainError};
use burn::module::Module;
use rlft_model::Transformer;
use rlft_rollout::{DataCursor, DataLoader};
use std::sync::Arc;

/// What collecting a batch reads and moves.
pub(crate) struct Collect<'a> {
    pub(crate) recipe: &'a Recipe,
    /// The rollout stage's settings and data.
    pub(crate) side: &'a RolloutSide,
    /// How batches arrive.
    pub(crate) feed: &'a mut Feed,
    /// The run's timeline (`events.jsonl`).
    pub(crate) timeline: &'a Arc<Timeline>,
    /// The policy as it stands (the sampler takes its frozen copy).
    pub(crate) policy: &'a Transformer,
}

/// The admission controller of a run over `train_len` prompts at `consumed` steps, continuing
/// from `state`.
pub(crate) fn admission(
    recipe: &Recipe,
    train_len: usize,
    cursor: DataCursor,
    consumed: usize,
    state: PipelineState,
) -> Result<Admission> {
    let loader = DataLoader::new(train_len, recipe.seed, cursor)?;
    Ok(Admission::new(
        recipe.asynchrony.eta(),
        loader,
        consumed as u64,
        state,
    ))
}

impl Collect<'_> {
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
        let current = self.policy.valid();
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
            self.timeline.published(t0, version);
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
        let Feed::AsyncIdle(admission) = std::mem::replace(self.feed, Feed::Switching) else {
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
        *self.feed = Feed::Async(Workers::start(
            self.side.clone(),
            admission,
            step as u64,
            self.policy.valid(),
            &settings,
            self.timeline.clone(),
        )?);
        Ok(())
    }
}

/// Stops the rollout workers, putting their admission state back into `feed` (so a checkpoint
/// written afterwards still holds the prompts in flight) for a run over `train_len` prompts at
/// `consumed` steps.
pub(crate) fn stop_workers(
    feed: &mut Feed,
    recipe: &Recipe,
    train_len: usize,
    consumed: usize,
) -> Result<()> {
    match std::mem::replace(feed, Feed::Switching) {
        Feed::Async(w) => {
            let (state, cursor) = w.finish();
            *feed = Feed::AsyncIdle(admission(recipe, train_len, cursor, consumed, state)?);
        }
        other => *feed = other,
    }
    Ok(())
}
