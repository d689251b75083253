//! Staleness: how old the policy that sampled a group is when the learner consumes it, and the
//! deterministic testbed that makes it exactly `k` versions (`[async] mode = "lagged"`).
//!
//! The learner's policy after `n` updates samples step `n + 1`'s groups in sync mode (version
//! `n + 1`, staleness 0). In lagged mode step `s` samples with the policy that sampled step
//! `max(1, s − k)` — the weights as they were `k` updates ago, or the first weights while fewer
//! exist — on the same device, with the same seeds, so a run is reproducible and its corrections
//! are compared on equal terms. A group's staleness is the learner's version minus the oldest
//! version among its tokens.

use rlft_model::Transformer;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};

/// How rollouts relate to the learner's updates.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AsyncMode {
    /// Each step samples with the current policy (staleness 0).
    #[default]
    Sync,
    /// Each step samples with the policy of `lag` updates ago (the testbed).
    Lagged,
}

/// `[async]`: how stale the samples are.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AsyncSection {
    /// `sync` (default) or `lagged`.
    pub mode: AsyncMode,
    /// Lagged mode: the age `k` in policy versions of the weights that sample each step (0 is
    /// sync). Only valid with `mode = "lagged"`, where it is required.
    pub lag: Option<usize>,
}

impl AsyncSection {
    /// The lag this section asks for (0 in sync mode).
    ///
    /// # Errors
    /// `lag` outside lagged mode, lagged mode without `lag`, or a lag over 64.
    pub fn lag(&self) -> Result<usize, String> {
        match (self.mode, self.lag) {
            (AsyncMode::Sync, None) => Ok(0),
            (AsyncMode::Sync, Some(_)) => Err(
                "async.lag applies to mode = \"lagged\" only; set async.mode = \"lagged\" or \
                 remove async.lag"
                    .into(),
            ),
            (AsyncMode::Lagged, None) => Err(
                "mode = \"lagged\" needs async.lag = k (the age in policy versions of the \
                 weights that sample each step; 0 is sync)"
                    .into(),
            ),
            (AsyncMode::Lagged, Some(k)) if k > MAX_LAG => Err(format!(
                "async.lag must be at most {MAX_LAG} (each version is a copy of the policy), \
                 got {k}"
            )),
            (AsyncMode::Lagged, Some(k)) => Ok(k),
        }
    }
}

/// The largest lag: the testbed keeps `lag + 1` policy copies.
pub const MAX_LAG: usize = 64;

/// The policies of the last `lag + 1` versions (frozen copies; the optimiser copies a parameter
/// before updating it in place while a snapshot still holds it).
#[derive(Default)]
pub struct Snapshots {
    lag: usize,
    /// (version, frozen policy), oldest first.
    ring: VecDeque<(u64, Transformer)>,
}

impl Snapshots {
    /// Keeps the weights `lag` versions back.
    pub fn new(lag: usize) -> Self {
        Self {
            lag,
            ring: VecDeque::new(),
        }
    }

    /// Records `policy` (frozen) as version `version` and returns the version and weights that
    /// sample it: `max(1, version − lag)`, or the oldest kept.
    pub fn sample_with(&mut self, version: u64, policy: Transformer) -> (u64, &Transformer) {
        if self.ring.back().is_none_or(|(v, _)| *v < version) {
            self.ring.push_back((version, policy));
        }
        let want = version.saturating_sub(self.lag as u64).max(1);
        while self.ring.len() > 1 && self.ring.front().is_some_and(|(v, _)| *v < want) {
            self.ring.pop_front();
        }
        let (v, m) = self.ring.front().expect("a snapshot was just recorded");
        (*v, m)
    }

    /// The lag `k`.
    pub fn lag(&self) -> usize {
        self.lag
    }

    /// The kept versions and their weights, oldest first (for checkpoints).
    pub fn iter(&self) -> impl Iterator<Item = &(u64, Transformer)> {
        self.ring.iter()
    }

    /// Restores a kept version (from a checkpoint), in order.
    pub fn restore(&mut self, version: u64, policy: Transformer) {
        self.ring.push_back((version, policy));
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
        .map(|&v| learner_version.saturating_sub(v))
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

    #[test]
    fn lag_settings_and_errors() {
        let s = |mode, lag| AsyncSection { mode, lag };
        assert_eq!(s(AsyncMode::Sync, None).lag(), Ok(0));
        assert_eq!(s(AsyncMode::Lagged, Some(3)).lag(), Ok(3));
        assert!(
            s(AsyncMode::Sync, Some(2))
                .lag()
                .unwrap_err()
                .contains("lagged")
        );
        assert!(
            s(AsyncMode::Lagged, None)
                .lag()
                .unwrap_err()
                .contains("async.lag")
        );
        assert!(s(AsyncMode::Lagged, Some(65)).lag().is_err());
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
