//! Turning a `[batch, T]` matrix of per-token losses into one scalar, with global normalisation
//! so that gradient accumulation and data parallelism give the gradient of the whole batch.

use crate::masked::{COUNT_EPS, check_shape, div_scalar, masked_row_sum, masked_sum, to_host};
use crate::{AlgoError, Result};
use burn::tensor::Tensor;
use serde::{Deserialize, Serialize};

/// How per-token losses `L[i, t]` are reduced to a scalar (`n_i` = tokens in row `i`, `S` =
/// rows with `n_i > 0`, `T` = padded width).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LossAggregation {
    /// `Σ L·m / Σ m`: every token weighs the same (DAPO's token-level loss).
    TokenMean,
    /// `Σ L·m`.
    TokenSum,
    /// `Σ_i Σ_t L·m / S`: sequence sums averaged over sequences.
    SeqMeanTokenSum,
    /// `Σ_i (Σ_t L·m / n_i) / S`: the original GRPO mean of per-sequence means (length-biased).
    SeqMeanTokenMean,
    /// `Σ_i Σ_t L·m / S / T`: Dr.GRPO's constant normaliser (no length bias).
    SeqMeanTokenSumNorm,
    /// `Σ_i (Σ_t L·m / max(n_i, 1)) / S`: per-sample means with an exact `max(n_i, 1)`
    /// denominator (TRL's `grpo` loss type, slime's sum of sample means). TRL and slime divide
    /// by every row of the batch, empty ones included: set `global_batch_size` to it.
    SampleMean,
}

impl LossAggregation {
    /// All modes with their names, as used in recipes and verl.
    pub const ALL: [(LossAggregation, &'static str); 6] = [
        (LossAggregation::TokenMean, "token-mean"),
        (LossAggregation::TokenSum, "token-sum"),
        (LossAggregation::SeqMeanTokenSum, "seq-mean-token-sum"),
        (LossAggregation::SeqMeanTokenMean, "seq-mean-token-mean"),
        (
            LossAggregation::SeqMeanTokenSumNorm,
            "seq-mean-token-sum-norm",
        ),
        (LossAggregation::SampleMean, "sample-mean"),
    ];
}

crate::error::impl_names!(
    LossAggregation,
    LossAggregation::ALL,
    "loss aggregation",
    |s| s.trim().replace('_', "-")
);

/// What the whole (global) batch looks like when a loss is computed on one part of it: one
/// micro-batch of gradient accumulation, or one data-parallel rank's share.
///
/// With these set from the whole batch, summing micro-batch losses (and averaging over ranks,
/// as an all-reduce does) gives exactly the gradient of the whole batch for every
/// [`LossAggregation`]. Unset fields fall back to the local batch, which is right only when the
/// local batch is the whole batch.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GlobalBatchInfo {
    /// Number of data-parallel ranks whose gradients are averaged (the loss is scaled by it).
    pub dp_size: usize,
    /// Response tokens in the whole batch (normaliser of `token-mean`).
    pub batch_num_tokens: Option<f64>,
    /// Non-empty sequences in the whole batch (normaliser of the `seq-mean-*` modes).
    pub global_batch_size: Option<f64>,
    /// Constant normaliser of `seq-mean-token-sum-norm` (default: the padded width `T`).
    pub loss_scale_factor: Option<f64>,
}

impl Default for GlobalBatchInfo {
    fn default() -> Self {
        Self::local()
    }
}

impl GlobalBatchInfo {
    /// The local batch is the whole batch (one rank, no accumulation).
    pub fn local() -> Self {
        Self {
            dp_size: 1,
            batch_num_tokens: None,
            global_batch_size: None,
            loss_scale_factor: None,
        }
    }

    /// Normalisers taken from the mask of the whole batch, before it is split into micro-batches
    /// or spread over `dp_size` ranks. The padded width `T` of this mask becomes the
    /// `seq-mean-token-sum-norm` normaliser.
    ///
    /// # Shapes
    /// - `mask`: `[batch, T]`
    pub fn from_mask(mask: &Tensor<2>, dp_size: usize) -> Result<Self> {
        if dp_size == 0 {
            return Err(AlgoError::InvalidSetting {
                name: "dp_size",
                value: 0.0,
                allowed: "must be at least 1",
            });
        }
        let [b, t] = mask.dims();
        let m = to_host(mask)?;
        let tokens: f64 = m.iter().filter(|v| **v > 0.5).count() as f64;
        let seqs = (0..b)
            .filter(|i| m[i * t..(i + 1) * t].iter().any(|v| *v > 0.5))
            .count();
        Ok(Self {
            dp_size,
            batch_num_tokens: Some(tokens),
            global_batch_size: Some(seqs as f64),
            loss_scale_factor: Some(t as f64),
        })
    }
}

/// Reduces per-token losses to a scalar with the given mode and normalisers (verl's `agg_loss`).
///
/// Positions where `mask` is 0 never contribute, to the value or to the gradient. An empty
/// batch (no masked tokens) gives 0, not NaN.
///
/// # Shapes
/// - `loss_mat`, `mask`: `[batch, T]` → `[1]`
pub fn aggregate_loss(
    loss_mat: Tensor<2>,
    mask: &Tensor<2>,
    mode: LossAggregation,
    global: &GlobalBatchInfo,
) -> Result<Tensor<1>> {
    let [_, t] = mask.dims();
    check_shape(
        "loss_mat",
        &loss_mat,
        mask.dims(),
        "the [batch, T] shape of the mask",
    )?;
    let dp = global.dp_size.max(1) as f64;
    let loss = match mode {
        LossAggregation::TokenMean => {
            let sum = masked_sum(loss_mat, mask);
            match global.batch_num_tokens {
                Some(n) => div_scalar(sum, n.max(1.0)),
                None => sum / mask.clone().sum().clamp_min(1.0),
            }
        }
        LossAggregation::TokenSum => masked_sum(loss_mat, mask),
        LossAggregation::SeqMeanTokenSum => seq_mean(masked_row_sum(loss_mat, mask), mask, global),
        LossAggregation::SeqMeanTokenMean => {
            let n = mask.clone().sum_dim(1).squeeze_dim::<1>(1);
            seq_mean(
                masked_row_sum(loss_mat, mask) / (n + COUNT_EPS),
                mask,
                global,
            )
        }
        LossAggregation::SampleMean => {
            let n = mask.clone().sum_dim(1).squeeze_dim::<1>(1).clamp_min(1.0);
            seq_mean(masked_row_sum(loss_mat, mask) / n, mask, global)
        }
        LossAggregation::SeqMeanTokenSumNorm => {
            let norm = global.loss_scale_factor.unwrap_or(t as f64);
            div_scalar(seq_mean(masked_row_sum(loss_mat, mask), mask, global), norm)
        }
    };
    Ok(loss * dp)
}

/// `Σ_i [n_i > 0]·x_i / (global_batch_size or S)`.
fn seq_mean(per_seq: Tensor<1>, mask: &Tensor<2>, global: &GlobalBatchInfo) -> Tensor<1> {
    let nonempty = mask
        .clone()
        .sum_dim(1)
        .squeeze_dim::<1>(1)
        .greater_elem(0.5)
        .float()
        .cast(mask.dtype());
    let total = (per_seq * nonempty.clone()).sum();
    match global.global_batch_size {
        Some(s) => div_scalar(total, s.max(1.0)),
        None => total / nonempty.sum().clamp_min(1.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Device;
    use proptest::prelude::*;

    use crate::testing::t2_on as t2;

    #[test]
    fn names_round_trip() {
        for (m, n) in LossAggregation::ALL {
            assert_eq!(n.parse::<LossAggregation>().unwrap(), m);
            assert_eq!(m.to_string(), n);
        }
        let err = "seq-mean"
            .parse::<LossAggregation>()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("token-mean") && err.contains("seq-mean"),
            "{err}"
        );
    }

    #[test]
    fn empty_batch_gives_zero() {
        let dev = Device::flex();
        let l = t2(vec![1.0; 4], 2, 2, &dev);
        let m = t2(vec![0.0; 4], 2, 2, &dev);
        for (mode, _) in LossAggregation::ALL {
            let v =
                to_host(&aggregate_loss(l.clone(), &m, mode, &GlobalBatchInfo::local()).unwrap())
                    .unwrap()[0];
            assert_eq!(v, 0.0, "{mode}");
        }
    }

    /// Gradient of the aggregated loss of `x` (leaf) for the given mask rows.
    fn grad_of(
        x: &[f64],
        mask: &[f64],
        rows: &[usize],
        t: usize,
        mode: LossAggregation,
        g: &GlobalBatchInfo,
    ) -> Vec<f64> {
        let dev = Device::flex().autodiff();
        let pick = |v: &[f64]| {
            rows.iter()
                .flat_map(|&r| v[r * t..(r + 1) * t].to_vec())
                .collect::<Vec<_>>()
        };
        let leaf = t2(pick(x), rows.len(), t, &dev).require_grad();
        let m = t2(pick(mask), rows.len(), t, &dev);
        // A non-linear per-token loss, so the test is not only about sums of constants.
        let l = leaf.clone().square() * 0.5 + leaf.clone() * 3.0;
        let grads = aggregate_loss(l, &m, mode, g).unwrap().backward();
        to_host(&leaf.grad(&grads).unwrap()).unwrap()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// Micro-batches (summed) and data-parallel ranks (averaged) give the gradient of the
        /// whole batch, for every aggregation mode and any split. (The batch-coupled losses
        /// `clip_cov` and `kl_cov` are exempt by design: they select tokens within the batch
        /// they are given; see `PolicyLoss::batch_coupled`.)
        #[test]
        fn any_split_gives_the_whole_batch_gradient(
            b in 2usize..9, t in 1usize..7, seed in any::<u64>(), parts in 1usize..5,
        ) {
            let mut s = seed;
            let mut rnd = || { s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407); ((s >> 11) as f64) / ((1u64 << 53) as f64) };
            let x: Vec<f64> = (0..b * t).map(|_| rnd() * 4.0 - 2.0).collect();
            let lens: Vec<usize> = (0..b).map(|_| (rnd() * (t as f64 + 1.0)) as usize).collect();
            let mask: Vec<f64> = (0..b * t).map(|k| if k % t < lens[k / t] { 1.0 } else { 0.0 }).collect();
            // Random assignment of rows to parts (some parts may be empty).
            let owner: Vec<usize> = (0..b).map(|_| (rnd() * parts as f64) as usize % parts).collect();
            let dev = Device::flex();
            let whole_mask = t2(mask.clone(), b, t, &dev);
            for (mode, _) in LossAggregation::ALL {
                let all: Vec<usize> = (0..b).collect();
                let want = grad_of(&x, &mask, &all, t, mode, &GlobalBatchInfo::local());
                for dp in [1usize, parts] {
                    let g = GlobalBatchInfo::from_mask(&whole_mask, dp).unwrap();
                    let mut got = vec![0.0; b * t];
                    for p in 0..parts {
                        let rows: Vec<usize> = (0..b).filter(|r| owner[*r] == p).collect();
                        if rows.is_empty() { continue; }
                        let gp = grad_of(&x, &mask, &rows, t, mode, &g);
                        for (k, &r) in rows.iter().enumerate() {
                            for j in 0..t {
                                // dp ranks are averaged by the all-reduce; micro-batches summed.
                                got[r * t + j] += gp[k * t + j] / dp as f64;
                            }
                        }
                    }
                    for k in 0..b * t {
                        prop_assert!((got[k] - want[k]).abs() <= 1e-9 + 1e-9 * want[k].abs(),
                            "{mode} dp={dp} k={k}: {} vs {}", got[k], want[k]);
                    }
                }
            }
        }
    }
}
