//! Reward shaping and batch filtering from DAPO: soft overlong punishment, overlong filtering and
//! dynamic sampling.

use crate::masked::zero_padding;
use crate::{AlgoError, Result};
use burn::tensor::Tensor;
use serde::{Deserialize, Serialize};

/// DAPO's soft overlong punishment: 0 up to `max_len − cache_len` tokens, then a linear ramp
/// down to `−factor` at `max_len`, and `−factor` beyond.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OverlongPenalty {
    /// Maximum response length `L_max`.
    pub max_len: usize,
    /// Length of the punishment ramp `L_cache` before `L_max`.
    pub cache_len: usize,
    /// Penalty at and beyond `L_max`.
    pub factor: f64,
}

impl OverlongPenalty {
    /// Checks `0 < cache_len ≤ max_len` and `factor ≥ 0`.
    pub fn new(max_len: usize, cache_len: usize, factor: f64) -> Result<Self> {
        if cache_len == 0 || cache_len > max_len {
            return Err(AlgoError::InvalidSetting {
                name: "overlong.cache_len",
                value: cache_len as f64,
                allowed: "must be in 1..=max_len (the ramp starts at max_len - cache_len)",
            });
        }
        if !(factor.is_finite() && factor >= 0.0) {
            return Err(AlgoError::InvalidSetting {
                name: "overlong.factor",
                value: factor,
                allowed: "must be finite and >= 0",
            });
        }
        Ok(Self {
            max_len,
            cache_len,
            factor,
        })
    }

    /// The reward added to a response of `len` tokens (≤ 0).
    pub fn penalty(&self, len: usize) -> f64 {
        let start = self.max_len - self.cache_len;
        if len <= start {
            0.0
        } else if len >= self.max_len {
            -self.factor
        } else {
            -((len - start) as f64) / self.cache_len as f64 * self.factor
        }
    }
}

/// Overlong filtering: zeroes the loss mask of truncated responses so they teach nothing.
///
/// # Shapes
/// - `mask`: `[batch, T]`, `truncated`: one flag per row → `[batch, T]`
pub fn overlong_filter(mask: Tensor<2>, truncated: &[bool]) -> Result<Tensor<2>> {
    let [b, _] = mask.dims();
    if truncated.len() != b {
        return Err(AlgoError::GroupIndex {
            got: truncated.len(),
            batch: b,
        });
    }
    let keep: Vec<f64> = truncated
        .iter()
        .map(|t| if *t { 0.0 } else { 1.0 })
        .collect();
    let keep = crate::masked::from_host::<2, 2>(keep, [b, 1], &mask);
    Ok(zero_padding(mask.clone() * keep, &mask))
}

/// Which groups dynamic sampling keeps.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum GroupFilter {
    /// Drop groups whose rewards are all equal (zero spread: zero advantage, no signal).
    ZeroSpread,
    /// Keep groups whose accuracy (fraction of rewards > 0.5... see `threshold`) is in [lo, hi].
    AccuracyRange {
        /// Lowest kept accuracy.
        lo: f64,
        /// Highest kept accuracy.
        hi: f64,
        /// A reward above this counts as correct.
        threshold: f64,
    },
}

impl GroupFilter {
    /// Whether a group with these rewards is kept. NaN rewards are ignored; a group with no
    /// finite reward is dropped.
    pub fn keep(&self, rewards: &[f64]) -> bool {
        let r: Vec<f64> = rewards.iter().copied().filter(|x| x.is_finite()).collect();
        if r.is_empty() {
            return false;
        }
        match *self {
            GroupFilter::ZeroSpread => {
                let (min, max) = r
                    .iter()
                    .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
                        (a.min(*x), b.max(*x))
                    });
                max - min > 1e-12
            }
            GroupFilter::AccuracyRange { lo, hi, threshold } => {
                let acc = r.iter().filter(|x| **x > threshold).count() as f64 / r.len() as f64;
                (lo..=hi).contains(&acc)
            }
        }
    }

    /// Flags for each group in `groups` (rewards per group).
    pub fn keep_groups(&self, groups: &[Vec<f64>]) -> Vec<bool> {
        groups.iter().map(|g| self.keep(g)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::masked::to_host;
    use burn::tensor::Device;

    #[test]
    fn overlong_ramp() {
        let p = OverlongPenalty::new(100, 20, 1.0).unwrap();
        assert_eq!(p.penalty(80), 0.0);
        assert!((p.penalty(90) + 0.5).abs() < 1e-12);
        assert_eq!(p.penalty(100), -1.0);
        assert_eq!(p.penalty(150), -1.0);
        assert!(OverlongPenalty::new(10, 20, 1.0).is_err());
    }

    #[test]
    fn filters() {
        assert!(!GroupFilter::ZeroSpread.keep(&[1.0, 1.0, 1.0]));
        assert!(GroupFilter::ZeroSpread.keep(&[1.0, 0.0]));
        let acc = GroupFilter::AccuracyRange {
            lo: 0.1,
            hi: 0.9,
            threshold: 0.5,
        };
        assert_eq!(
            acc.keep_groups(&[vec![1.0, 1.0], vec![1.0, 0.0], vec![f64::NAN]]),
            vec![false, true, false]
        );
        let m = Tensor::<2>::ones([2, 3], &Device::flex());
        let f = to_host(&overlong_filter(m, &[false, true]).unwrap()).unwrap();
        assert_eq!(f, vec![1.0, 1.0, 1.0, 0.0, 0.0, 0.0]);
    }
}
