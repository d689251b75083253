//! The lagged testbed (`[async] mode = "lagged"`): the policies of the last `lag + 1`
//! versions, so each step samples with the weights exactly `lag` updates old.

use rlft_model::Transformer;
use std::collections::VecDeque;

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
