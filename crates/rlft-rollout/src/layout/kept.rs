//! Sampling masks in the learner's layout: each response token's kept set (the ids top-k /
//! min-p / top-p left the sampler to draw from), so the learner's log-probs and entropies are
//! taken over the distribution the token was actually drawn from — renormalised over the kept
//! set of the learner's own logits — rather than the whole vocabulary.

use super::LearnerBatch;
use burn::tensor::{Bool, Int, Tensor, TensorData};

/// The kept sets of a batch's `T` response tokens, `[T, K]` row-major: slot 0 of each token is
/// the token itself, then the rest of its set, then padding.
#[derive(Debug, Clone)]
pub(super) struct KeptSets {
    ids: Vec<i64>,
    padding: Vec<bool>,
    width: usize,
}

impl LearnerBatch {
    /// The same rows with a sampling mask: `per_row[k][j]` is the kept set of row `k`'s response
    /// token `j`. A token without one (`None`, or past the end of its row's list) is scored over
    /// the set of itself alone — log-prob 0, entropy 0 — which is right only for tokens the loss
    /// masks (observations, overflowed sets).
    pub fn with_kept_sets(mut self, per_row: &[&[Option<Vec<u32>>]]) -> Self {
        let t = self.tokens();
        let mut sets: Vec<Vec<i64>> = self.targets.iter().map(|&y| vec![y]).collect();
        for (k, row) in per_row.iter().enumerate().take(self.n) {
            for (j, kept) in row.iter().enumerate().take(self.r) {
                let slot = self.slots[k * self.r + j] as usize;
                if let (true, Some(kept)) = (slot < t, kept) {
                    let y = self.targets[slot];
                    sets[slot].extend(kept.iter().map(|&id| i64::from(id)).filter(|&id| id != y));
                }
            }
        }
        let width = sets.iter().map(Vec::len).max().unwrap_or(1).max(1);
        let (mut ids, mut padding) = (Vec::with_capacity(t * width), Vec::with_capacity(t * width));
        for set in &sets {
            ids.extend(
                set.iter()
                    .copied()
                    .chain(std::iter::repeat_n(set[0], width - set.len())),
            );
            padding.extend((0..width).map(|i| i >= set.len()));
        }
        self.kept = Some(KeptSets {
            ids,
            padding,
            width,
        });
        self
    }

    /// Whether the batch carries a sampling mask ([`LearnerBatch::with_kept_sets`]).
    pub fn has_kept_sets(&self) -> bool {
        self.kept.is_some()
    }

    /// The widest kept set `K` (0 without a sampling mask).
    pub fn kept_width(&self) -> usize {
        self.kept.as_ref().map_or(0, |k| k.width)
    }

    /// The kept sets of response tokens `start..start + len` as `[1, len, K]` ids and padding.
    fn kept_range(&self, start: usize, len: usize) -> Option<(Tensor<3, Int>, Tensor<3, Bool>)> {
        let k = self.kept.as_ref()?;
        let (a, b) = (start * k.width, (start + len) * k.width);
        let shape = [1, len, k.width];
        Some((
            Tensor::from_data(TensorData::new(k.ids[a..b].to_vec(), shape), &self.device),
            Tensor::from_data(
                TensorData::new(k.padding[a..b].to_vec(), shape),
                &self.device,
            ),
        ))
    }

    /// The log-probs `[1, len]` of response tokens `start..start + len` from their logits
    /// `[1, len, vocab]` at `temperature`: over the whole vocabulary, or over each token's kept
    /// set when the batch carries a sampling mask.
    ///
    /// # Errors
    /// A non-positive temperature, or logits of another shape.
    pub fn head_logprobs(
        &self,
        logits: Tensor<3>,
        (start, len): (usize, usize),
        temperature: Option<f64>,
    ) -> rlft_algo::Result<Tensor<2>> {
        match self.kept_range(start, len) {
            Some((kept, padding)) => {
                rlft_algo::logprobs_over_kept(logits, kept, padding, temperature)
            }
            None => {
                let targets = self.targets_flat().narrow(0, start, len).unsqueeze::<2>();
                rlft_algo::logprobs_from_logits(logits, targets, temperature)
            }
        }
    }

    /// The log of the mass the whole-vocabulary softmax of logits `[1, len, vocab]` at
    /// `temperature` puts inside the kept sets of response tokens `start..start + len`
    /// (`[1, len]`, [`rlft_algo::kept_log_mass`]); `None` without a sampling mask.
    ///
    /// # Errors
    /// As [`LearnerBatch::head_logprobs`].
    pub fn head_kept_log_mass(
        &self,
        logits: Tensor<3>,
        (start, len): (usize, usize),
        temperature: Option<f64>,
    ) -> rlft_algo::Result<Option<Tensor<2>>> {
        self.kept_range(start, len)
            .map(|(kept, padding)| rlft_algo::kept_log_mass(logits, kept, padding, temperature))
            .transpose()
    }

    /// [`LearnerBatch::head_logprobs`] and the entropies `[1, len]` of the same logits (under a
    /// sampling mask, of the renormalised distribution over each kept set; its softmax is
    /// taken once for both);
    /// `entropy_grad = false` keeps the entropy out of the autodiff graph.
    ///
    /// # Errors
    /// As [`LearnerBatch::head_logprobs`].
    pub fn head_scores(
        &self,
        logits: Tensor<3>,
        (start, len): (usize, usize),
        temperature: Option<f64>,
        entropy_grad: bool,
    ) -> rlft_algo::Result<(Tensor<2>, Tensor<2>)> {
        let Some((kept, padding)) = self.kept_range(start, len) else {
            let lp = self.head_logprobs(logits.clone(), (start, len), temperature)?;
            let logits = if entropy_grad {
                logits
            } else {
                logits.detach()
            };
            return Ok((lp, rlft_algo::entropy_from_logits(logits, temperature)?));
        };
        let logp = rlft_algo::kept_log_softmax(logits, kept, padding, temperature)?;
        let lp = logp.clone().narrow(2, 0, 1).squeeze_dim::<2>(2);
        let logp = if entropy_grad { logp } else { logp.detach() };
        let p = logp.clone().exp();
        Ok((lp, (p * logp).sum_dim(2).squeeze_dim::<2>(2).neg()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Device;
    use rlft_model::TransformerConfig;

    fn host<const D: usize>(t: Tensor<D>) -> Vec<f32> {
        t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap()
    }

    /// Replay at lag ≥ 1: the kept sets come from an older sampler, so they need not hold the
    /// learner's likeliest tokens. Log-probs and entropies over them, whole and chunked, and the
    /// mass inside them equal an f64 reference computed from the learner's full logits.
    #[test]
    fn replayed_kept_sets_at_lag_one_score_against_a_brute_force_reference() {
        let device = Device::flex();
        let model = TransformerConfig::new(40, 16, 32, 2, 2, 1, 8).init_seeded(&device, 11);
        let a: Vec<u32> = vec![3, 4, 5, 7, 9, 11];
        let b: Vec<u32> = vec![3, 4, 5, 20, 21];
        let rows = [(&a[..], 3), (&b[..], 3)];
        let kept_a = [Some(vec![7, 1, 2]), None, Some(vec![30, 11, 12, 13, 14])];
        let kept_b = [Some(vec![21, 20]), Some(vec![21])];
        let batch =
            LearnerBatch::new(&rows, 0, &device).with_kept_sets(&[&kept_a[..], &kept_b[..]]);
        assert_eq!(batch.kept_width(), 5);
        let tau = 0.8;
        let full = host(batch.response_logits(&model));
        let vocab = 40;
        let targets: Vec<usize> = vec![7, 9, 11, 20, 21];
        let sets: Vec<Vec<usize>> = vec![
            vec![7, 1, 2],
            vec![9],
            vec![30, 11, 12, 13, 14],
            vec![20, 21],
            vec![21],
        ];
        let (mut want_lp, mut want_h, mut want_mass) = (Vec::new(), Vec::new(), Vec::new());
        for (i, (set, &y)) in sets.iter().zip(&targets).enumerate() {
            let z = |v: usize| f64::from(full[i * vocab + v]) / tau;
            let lse = set.iter().map(|&v| z(v).exp()).sum::<f64>().ln();
            let lse_all = (0..vocab).map(|v| z(v).exp()).sum::<f64>().ln();
            want_mass.push(lse - lse_all);
            want_lp.push(z(y) - lse);
            want_h.push(
                -set.iter()
                    .map(|&v| (z(v) - lse).exp() * (z(v) - lse))
                    .sum::<f64>(),
            );
        }
        let close = |got: &[f32], want: &[f64], what: &str| {
            for (g, w) in got.iter().zip(want) {
                assert!(
                    (f64::from(*g) - w).abs() < 1e-5,
                    "{what}: {got:?} vs {want:?}"
                );
            }
        };
        let t = batch.tokens();
        let logits = batch.response_logits(&model);
        let lp = host(
            batch
                .head_logprobs(logits.clone(), (0, t), Some(tau))
                .unwrap(),
        );
        close(&lp, &want_lp, "log-probs");
        let mass = batch
            .head_kept_log_mass(logits.clone(), (0, t), Some(tau))
            .unwrap()
            .expect("a sampling mask");
        close(&host(mass), &want_mass, "mass inside the kept sets");
        let (lp, h) = batch.head_scores(logits, (0, t), Some(tau), true).unwrap();
        close(&host(lp), &want_lp, "log-probs with entropies");
        close(&host(h), &want_h, "entropies");
        // Laid out per row, and chunked.
        let r = batch.response_len();
        for chunk in [1, 2, t] {
            let rows = host(batch.logprobs_chunked(&model, Some(tau), chunk).unwrap());
            let flat: Vec<f32> = vec![rows[0], rows[1], rows[2], rows[r], rows[r + 1]];
            close(&flat, &want_lp, "chunked");
        }
    }
}
