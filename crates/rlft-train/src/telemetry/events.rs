//! `events.jsonl`: the run's timeline, one line per interval an actor spent on one kind of work
//! — the raw data of the sync/async Gantt picture and of throughput simulations.
//!
//! Actors are `learner` and `rollout/<i>`; intervals are recorded from any thread into a shared
//! buffer that the learner appends to the file once per step.

use crate::{Result, TrainError, io_err};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

/// The file name in the run folder.
pub const EVENTS_FILE: &str = "events.jsonl";

/// What an actor did during an interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventKind {
    /// Generating tokens.
    Generate,
    /// Scoring rewards.
    Score,
    /// A learner update (with the π_old / reference passes and advantages).
    Learn,
    /// Handing new weights to the rollout side.
    Publish,
    /// Waiting (for a batch, for admission, for weights).
    Wait,
    /// One completions request to a rollout server (actor `server/<k>`): its batch, the groups
    /// its rows belong to, and whether it was answered (`ok`) or sent again elsewhere
    /// (`requeued: <why>`).
    Request,
    /// The learner consuming a batch: its serial and the dataset index of each group kept.
    Consume,
}

/// One interval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// `learner` or `rollout/<i>`.
    pub actor: String,
    /// What it did.
    pub kind: EventKind,
    /// Seconds since the run (or its resume) started.
    pub start_s: f64,
    /// Seconds since the run (or its resume) started.
    pub end_s: f64,
    /// The policy version involved (the weights sampling, or the learner's version).
    pub version: u64,
    /// Tokens generated or trained on (0 where none).
    pub tokens: usize,
    /// Requests and consumption: the batch's serial.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<u64>,
    /// Requests: `[round, group, group, …]`, the batch's sampling round and the groups of the
    /// request's rows (each once); consumption: the dataset index of each consumed group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub groups: Option<Vec<usize>>,
    /// Requests: the server's base URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    /// Requests: `ok`, or `requeued: <why>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
}

/// A timeline shared by the learner and the rollout workers.
#[derive(Debug)]
pub struct Timeline {
    start: Instant,
    buffer: Mutex<Vec<Event>>,
    path: Option<PathBuf>,
}

impl Timeline {
    /// A timeline appended to `path` (started afresh unless `resumed`); `None` records nothing
    /// to disk.
    ///
    /// # Errors
    /// The file cannot be created.
    pub fn open(path: Option<&Path>, resumed: bool) -> Result<Self> {
        if let Some(p) = path
            && (!resumed || !p.exists())
        {
            crate::write_atomic(p, b"")?;
        }
        Ok(Self {
            start: Instant::now(),
            buffer: Mutex::new(Vec::new()),
            path: path.map(Path::to_path_buf),
        })
    }

    /// Seconds since the timeline started.
    pub fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// Records the learner's publication of `version` (to the rollout workers or servers), from
    /// `start_s` to now.
    pub fn published(&self, start_s: f64, version: u64) {
        self.record(
            "learner",
            EventKind::Publish,
            start_s,
            self.now(),
            version,
            0,
        );
    }

    /// Records an interval.
    pub fn record(
        &self,
        actor: &str,
        kind: EventKind,
        start_s: f64,
        end_s: f64,
        version: u64,
        tokens: usize,
    ) {
        self.push(Event {
            actor: actor.into(),
            kind,
            start_s,
            end_s,
            version,
            tokens,
            batch: None,
            groups: None,
            server: None,
            outcome: None,
        });
    }

    /// Records an event with its request or consumption fields.
    pub fn push(&self, e: Event) {
        self.buffer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(e);
    }

    /// Appends the recorded intervals to the file, oldest first.
    ///
    /// # Errors
    /// The file cannot be written.
    pub fn flush(&self) -> Result<()> {
        let mut events = std::mem::take(
            &mut *self
                .buffer
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        let Some(path) = &self.path else {
            return Ok(());
        };
        if events.is_empty() {
            return Ok(());
        }
        events.sort_by(|a, b| a.start_s.total_cmp(&b.start_s));
        let mut text = String::new();
        for e in &events {
            text.push_str(&serde_json::to_string(e).unwrap_or_default());
            text.push('\n');
        }
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(path)
            .map_err(io_err(path))?;
        f.write_all(text.as_bytes()).map_err(io_err(path))?;
        f.sync_data().map_err(io_err(path))
    }
}

/// The intervals of `run/events.jsonl` (no file: none); a malformed line is an error naming
/// it.
pub fn read_events(run: &Path) -> Result<Vec<Event>> {
    let path = run.join(EVENTS_FILE);
    if !path.exists() {
        return Ok(Vec::new());
    }
    let text = std::fs::read_to_string(&path).map_err(io_err(&path))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str::<Event>(l).map_err(|e| TrainError::Checkpoint {
                path: path.clone(),
                msg: format!("line {} is not an event ({e})", i + 1),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_are_appended_in_start_order() {
        let dir = std::env::temp_dir().join(format!("rlft-events-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(EVENTS_FILE);
        let t = Timeline::open(Some(&path), false).unwrap();
        t.record("rollout/0", EventKind::Generate, 0.5, 1.0, 1, 40);
        t.record("learner", EventKind::Wait, 0.0, 1.0, 1, 0);
        t.flush().unwrap();
        t.record("learner", EventKind::Learn, 1.0, 2.0, 1, 40);
        t.flush().unwrap();
        let lines: Vec<Event> = std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let kinds: Vec<_> = lines.iter().map(|e| (e.actor.as_str(), e.kind)).collect();
        assert_eq!(
            kinds,
            [
                ("learner", EventKind::Wait),
                ("rollout/0", EventKind::Generate),
                ("learner", EventKind::Learn)
            ]
        );
        // A resumed run appends.
        Timeline::open(Some(&path), true).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 3);
        Timeline::open(Some(&path), false).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "");
        std::fs::remove_dir_all(&dir).ok();
    }
}
