//! The learner's batch layout, shared by rescoring and the trainer.
//!
//! Rows of prompt + response tokens are packed without padding between them ("padding-free",
//! like verl's `use_remove_padding`): whole rows are laid end to end in `bins` rows of width
//! `W`, each token carrying its row's id so attention never crosses into a neighbour, positions
//! counted per row from its first token. Only the ends of the bins are padding. The output head
//! then runs at the positions that predict response tokens, flattened to `[1, T, vocab]` for the
//! `T` response tokens of the batch, and [`LearnerBatch::rows`] lays per-token results out as
//! `[n, R]` (zeros past each response) for the losses. In a GRPO batch whose longest response
//! is twice the mean, this halves the learner's work compared with padding every row to the
//! longest. Rows with the same prompt (the G responses of a GRPO group) share one copy of it:
//! the prompt is laid out once, followed by each response, which attends to the prompt and to
//! its own earlier tokens (`ForwardInput::prefix_ids`) — with one prompt of 45 tokens and 8
//! responses of 55 this is 485 tokens where whole rows were 800, and the prompt's gradient is
//! the sum over the responses that read it, exactly as if each row were alone. Rescoring the sampler's μ and the learner's π must build the same layout, or the two
//! differ by the rounding of different shapes.

use burn::tensor::{Device, Int, Tensor, TensorData};
use rlft_model::{ForwardInput, Transformer};
use std::collections::HashMap;

mod kept;
mod routing;

pub use routing::RoutingStats;

/// Widths tried for the bins, as multiples of the longest row: the narrowest of the least
/// total area wins (attention grows with the square of the width).
const WIDTHS: [usize; 4] = [1, 2, 3, 4];

/// Rows in the learner's layout (see the module docs).
#[derive(Debug, Clone)]
pub struct LearnerBatch {
    /// `[bins, W]` token ids, positions, sequence ids (a row's id, or a shared prompt's id
    /// `n + u`; `-1` on padding) and the sequence each token may also see (a shared prompt).
    ids: Vec<i64>,
    positions: Vec<i64>,
    segments: Vec<i64>,
    prefixes: Vec<i64>,
    bins: usize,
    width: usize,
    /// Index into the flattened `[bins·W]` positions of the position that predicts each
    /// response token, rows in order (`T` entries).
    predict: Vec<i64>,
    /// The response tokens themselves (`T`).
    targets: Vec<i64>,
    /// For row `k`, slot `j < R`: its index in `0..T`, or `T` past the row's response.
    slots: Vec<i64>,
    n: usize,
    r: usize,
    /// Each response token's sampling mask, when the batch carries one.
    kept: Option<kept::KeptSets>,
    /// Each packed token's row and index in that row's tokens (`(-1, -1)` on padding); a shared
    /// prompt's tokens name the first row that shares it.
    origin: Vec<(i64, i64)>,
    /// The sampler's routing of the tokens (mixtures of experts).
    routing: Option<std::sync::Arc<routing::PackedRouting>>,
    device: Device,
}

/// First-fit decreasing: the bin of each row (rows given by length) for bins of `width`.
fn first_fit(lens: &[usize], width: usize) -> (Vec<usize>, Vec<usize>) {
    let mut order: Vec<usize> = (0..lens.len()).collect();
    order.sort_by_key(|&k| std::cmp::Reverse(lens[k]));
    let (mut fill, mut bin_of) = (Vec::<usize>::new(), vec![0; lens.len()]);
    for k in order {
        let b = match fill.iter().position(|&f| f + lens[k] <= width) {
            Some(b) => b,
            None => {
                fill.push(0);
                fill.len() - 1
            }
        };
        bin_of[k] = b;
        fill[b] += lens[k];
    }
    (bin_of, fill)
}

/// The units of a layout: each distinct prompt (with its lead pad if empty) and the rows that
/// share it, in order of first appearance.
fn prompt_units<T: Copy + Into<i64>>(
    rows: &[(&[T], usize)],
    pad_id: i64,
) -> Vec<(Vec<i64>, Vec<usize>)> {
    let mut units: Vec<(Vec<i64>, Vec<usize>)> = Vec::new();
    let mut unit_of: HashMap<Vec<i64>, usize> = HashMap::new();
    for (k, (row, pl)) in rows.iter().enumerate() {
        let prompt = match *pl {
            0 => vec![pad_id],
            pl => row[..pl].iter().map(|&t| t.into()).collect(),
        };
        let u = *unit_of.entry(prompt.clone()).or_insert_with(|| {
            units.push((prompt, Vec::new()));
            units.len() - 1
        });
        units[u].1.push(k);
    }
    units
}

impl LearnerBatch {
    /// Packs rows given as `(prompt + response tokens, prompt length)`; padding uses `pad_id`.
    /// Rows whose prompts are equal (a GRPO group) share one copy of it: the prompt is laid out
    /// once, each response after it sees the prompt and its own earlier tokens, and the prompt's
    /// last position predicts every response's first token. A row with an empty prompt gets one
    /// `pad_id` token in front, whose logits predict its first response token.
    pub fn new<T: Copy + Into<i64>>(rows: &[(&[T], usize)], pad_id: i64, device: &Device) -> Self {
        let n = rows.len();
        let units = prompt_units(rows, pad_id);
        let response = |k: usize| &rows[k].0[rows[k].1..];
        let lens: Vec<usize> = units
            .iter()
            .map(|(p, ks)| p.len() + ks.iter().map(|&k| response(k).len()).sum::<usize>())
            .collect();
        let r = (0..n).map(|k| response(k).len()).max().unwrap_or(0).max(1);
        let longest = lens.iter().copied().max().unwrap_or(1).max(1);
        let (width, (bin_of, fill)) = WIDTHS
            .iter()
            .map(|m| (longest * m, first_fit(&lens, longest * m)))
            .min_by_key(|(w, (_, fill))| (fill.len() * w, *w))
            .expect("WIDTHS is not empty");
        let bins = fill.len().max(1);
        let mut ids = vec![pad_id; bins * width];
        let mut positions = vec![0i64; bins * width];
        let mut segments = vec![-1i64; bins * width];
        let mut prefixes = vec![-1i64; bins * width];
        let mut used = vec![0usize; bins];
        let mut origin = vec![(-1i64, -1i64); bins * width];
        // Per row: the index of its prompt's last token and of its first response token.
        let mut at = vec![(0usize, 0usize); n];
        for (u, (prompt, members)) in units.iter().enumerate() {
            let b = bin_of[u];
            let mut next = b * width + used[b];
            used[b] += lens[u];
            // A prompt of one row is part of that row's sequence; a shared one is its own.
            let prompt_seg = match members[..] {
                [k] => k as i64,
                _ => (n + u) as i64,
            };
            let lead_pad = rows[members[0]].1 == 0;
            for (j, &t) in prompt.iter().enumerate() {
                (ids[next], positions[next]) = (t, j as i64);
                (segments[next], prefixes[next]) = (prompt_seg, prompt_seg);
                if !lead_pad {
                    origin[next] = (members[0] as i64, j as i64);
                }
                next += 1;
            }
            let prompt_last = next - 1;
            for &k in members {
                at[k] = (prompt_last, next);
                for (j, &t) in response(k).iter().enumerate() {
                    (ids[next], positions[next]) = (t.into(), (prompt.len() + j) as i64);
                    origin[next] = (k as i64, (rows[k].1 + j) as i64);
                    (segments[next], prefixes[next]) = (k as i64, prompt_seg);
                    next += 1;
                }
            }
        }
        let (mut predict, mut targets, mut slots) = (Vec::new(), Vec::new(), vec![0i64; n * r]);
        for (k, &(last_prompt, first)) in at.iter().enumerate() {
            let len = response(k).len();
            for j in 0..r {
                slots[k * r + j] = if j < len {
                    predict.push(if j == 0 { last_prompt } else { first + j - 1 } as i64);
                    targets.push(ids[first + j]);
                    (predict.len() - 1) as i64
                } else {
                    -1
                };
            }
        }
        let t = predict.len() as i64;
        for s in &mut slots {
            if *s < 0 {
                *s = t;
            }
        }
        Self {
            ids,
            positions,
            segments,
            prefixes,
            bins,
            width,
            predict,
            targets,
            slots,
            n,
            r,
            kept: None,
            origin,
            routing: None,
            device: device.clone(),
        }
    }

    /// Rows `n`.
    pub fn rows_len(&self) -> usize {
        self.n
    }

    /// Response width `R` (the longest response).
    pub fn response_len(&self) -> usize {
        self.r
    }

    /// Response tokens `T` in the batch.
    pub fn tokens(&self) -> usize {
        self.targets.len()
    }

    /// The device its tensors are built on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The same rows, building their tensors on `device`.
    pub fn to_device(&self, device: &Device) -> Self {
        Self {
            device: device.clone(),
            ..self.clone()
        }
    }

    fn int(&self, v: &[i64], shape: [usize; 2]) -> Tensor<2, Int> {
        Tensor::from_data(TensorData::new(v.to_vec(), shape), &self.device)
    }

    fn int1(&self, v: &[i64]) -> Tensor<1, Int> {
        Tensor::from_data(TensorData::new(v.to_vec(), [v.len()]), &self.device)
    }

    /// The forward-pass input `[bins, W]`.
    pub fn input(&self) -> ForwardInput {
        let shape = [self.bins, self.width];
        let real: Vec<i64> = self.segments.iter().map(|&s| i64::from(s >= 0)).collect();
        ForwardInput {
            input_ids: self.int(&self.ids, shape),
            position_ids: self.int(&self.positions, shape),
            attention_mask: Some(self.int(&real, shape)),
            segment_ids: Some(self.int(&self.segments, shape)),
            prefix_ids: Some(self.int(&self.prefixes, shape)),
        }
    }

    /// The response tokens `[1, T]`, rows in order: the labels of
    /// [`LearnerBatch::response_logits`].
    pub fn targets(&self) -> Tensor<2, Int> {
        self.int(&self.targets, [1, self.targets.len()])
    }

    /// The `T` positions of the forward pass (flattened `[bins·W]` indices) that predict the
    /// response tokens, rows in order.
    pub fn predict_positions(&self) -> Tensor<1, Int> {
        self.int1(&self.predict)
    }

    /// Logits `[1, T, vocab]` at the `T` positions that predict the response tokens (the output
    /// head runs at those positions only).
    pub fn response_logits(&self, model: &Transformer) -> Tensor<3> {
        model.output_head(
            self.hidden_at(model, self.int1(&self.predict))
                .unsqueeze::<3>(),
        )
    }

    /// Log-probabilities `[n, R]` of the response tokens under `model` at `temperature` (see
    /// [`rlft_algo::logprobs_from_logits`]; over each token's kept set with a sampling mask,
    /// [`LearnerBatch::with_kept_sets`]), zeros past each response.
    pub fn logprobs(
        &self,
        model: &Transformer,
        temperature: Option<f64>,
    ) -> rlft_algo::Result<Tensor<2>> {
        let logits = self.response_logits(model);
        Ok(self.rows(self.head_logprobs(logits, (0, self.tokens()), temperature)?))
    }

    /// Per-response-token values `[1, T]` laid out as `[n, R]`, zeros past each response.
    pub fn rows(&self, flat: Tensor<2>) -> Tensor<2> {
        let [_, t] = flat.dims();
        let zero = Tensor::<1>::zeros([1], (&flat.device(), flat.dtype()));
        Tensor::cat(vec![flat.reshape([t]), zero], 0)
            .select(0, self.int1(&self.slots))
            .reshape([self.n, self.r])
    }

    /// Per-position values of the forward pass `[bins, W, x]` at the `R` positions that predict
    /// each row's response tokens: `[n, R, x]`, zeros past each response.
    pub fn response(&self, per_position: Tensor<3>) -> Tensor<3> {
        let [b, w, x] = per_position.dims();
        let at = per_position
            .reshape([b * w, x])
            .select(0, self.int1(&self.predict));
        let zero = Tensor::<2>::zeros([1, x], (&at.device(), at.dtype()));
        Tensor::cat(vec![at, zero], 0)
            .select(0, self.int1(&self.slots))
            .reshape([self.n, self.r, x])
    }

    /// Row `k`'s first `len` values out of a host `[n, R]` block.
    pub fn unpack(&self, flat: &[f32], k: usize, len: usize) -> Vec<f32> {
        flat[k * self.r..k * self.r + len].to_vec()
    }
}

impl LearnerBatch {
    /// `(start, len)` of the fewest chunks of at most `chunk` response positions, all of one
    /// size but the last.
    pub fn chunks(&self, chunk: usize) -> Vec<(usize, usize)> {
        let t = self.tokens();
        let c = t.div_ceil(t.div_ceil(chunk.max(1)).max(1)).max(1);
        (0..t.div_ceil(c))
            .map(|k| (k * c, c.min(t - k * c)))
            .collect()
    }

    /// The response targets as one flat `[tokens]` tensor (the order of the chunks).
    pub fn targets_flat(&self) -> Tensor<1, Int> {
        self.targets().reshape([self.tokens()])
    }

    /// As [`LearnerBatch::logprobs`], with the output head run `chunk` response positions at a
    /// time (no gradient is kept: for frozen models and π_old).
    ///
    /// # Errors
    /// A non-positive temperature.
    pub fn logprobs_chunked(
        &self,
        model: &Transformer,
        temperature: Option<f64>,
        chunk: usize,
    ) -> rlft_algo::Result<Tensor<2>> {
        if chunk >= self.tokens() {
            return self.logprobs(model, temperature);
        }
        let h = self.hidden_at(model, self.predict_positions());
        let mut parts = Vec::new();
        for (start, len) in self.chunks(chunk) {
            let logits = model.output_head(h.clone().narrow(0, start, len).unsqueeze::<3>());
            parts.push(
                self.head_logprobs(logits, (start, len), temperature)?
                    .detach(),
            );
        }
        Ok(self.rows(Tensor::cat(parts, 1)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlft_model::TransformerConfig;

    fn host(t: Tensor<2, Int>) -> Vec<i64> {
        t.into_data().convert::<i64>().try_to_vec::<i64>().unwrap()
    }

    fn floats<const D: usize>(t: Tensor<D>) -> Vec<f32> {
        t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap()
    }

    #[test]
    fn rows_packed_end_to_end_with_row_ids_and_positions_per_row() {
        let device = Device::flex();
        let a: Vec<u32> = vec![1, 2, 3, 10];
        let b: Vec<u32> = vec![4, 11];
        let c: Vec<u32> = vec![5, 12];
        let batch = LearnerBatch::new(&[(&a[..], 3), (&b[..], 1), (&c[..], 1)], 0, &device);
        assert_eq!(
            (batch.rows_len(), batch.response_len(), batch.tokens()),
            (3, 1, 3)
        );
        // Width 4 (the longest row): `a` fills one bin, `b` and `c` share the other.
        let input = batch.input();
        assert_eq!(host(input.input_ids), vec![1, 2, 3, 10, 4, 11, 5, 12]);
        assert_eq!(host(input.position_ids), vec![0, 1, 2, 3, 0, 1, 0, 1]);
        assert_eq!(
            host(input.segment_ids.unwrap()),
            vec![0, 0, 0, 0, 1, 1, 2, 2]
        );
        assert_eq!(host(input.attention_mask.unwrap()), vec![1; 8]);
        assert_eq!(host(batch.targets()), vec![10, 11, 12]);
        assert_eq!(batch.predict, vec![2, 4, 6]);
    }

    #[test]
    fn rows_with_one_prompt_share_a_single_copy_of_it() {
        let device = Device::flex();
        let a: Vec<u32> = vec![1, 2, 10, 11];
        let b: Vec<u32> = vec![1, 2, 20];
        let c: Vec<u32> = vec![3, 30];
        let batch = LearnerBatch::new(&[(&a[..], 2), (&b[..], 2), (&c[..], 1)], 0, &device);
        let input = batch.input();
        // Width 5 (the longest unit: prompt 1 2, then 10 11, then 20); `c` gets its own bin.
        assert_eq!(
            host(input.input_ids),
            vec![1, 2, 10, 11, 20, 3, 30, 0, 0, 0]
        );
        assert_eq!(host(input.position_ids), vec![0, 1, 2, 3, 2, 0, 1, 0, 0, 0]);
        // The shared prompt is sequence n + 0 = 3; `c`'s prompt is part of its own row (2).
        let segments = host(input.segment_ids.unwrap());
        assert_eq!(segments, vec![3, 3, 0, 0, 1, 2, 2, -1, -1, -1]);
        let prefixes = host(input.prefix_ids.unwrap());
        assert_eq!(prefixes, vec![3, 3, 3, 3, 3, 2, 2, -1, -1, -1]);
        // The prompt's last token predicts both first tokens.
        assert_eq!(host(batch.targets()), vec![10, 11, 20, 30]);
        assert_eq!(batch.predict, vec![1, 2, 1, 5]);
    }

    #[test]
    fn per_token_values_laid_out_per_row_with_zeros_past_each_response() {
        let device = Device::flex();
        let a: Vec<u32> = vec![1, 2, 3, 10, 20];
        let b: Vec<u32> = vec![4, 11];
        let e: Vec<u32> = vec![6];
        let rows = [(&a[..], 3), (&b[..], 1), (&e[..], 0)];
        let batch = LearnerBatch::new(&rows, 0, &device);
        assert_eq!((batch.response_len(), batch.tokens()), (2, 4));
        // The empty prompt gets a pad token in front, which predicts the row's first token.
        assert_eq!(host(batch.targets()), vec![10, 20, 11, 6]);
        let flat =
            Tensor::<2>::from_data(TensorData::new(vec![1.0f32, 2., 3., 4.], [1, 4]), &device);
        assert_eq!(floats(batch.rows(flat)), vec![1.0, 2.0, 3.0, 0.0, 4.0, 0.0]);
        let [bins, w] = batch.input().input_ids.dims();
        let per_position = Tensor::<1, Int>::arange(0..(bins * w) as i64, &device)
            .float()
            .reshape([bins, w, 1]);
        let at = floats(batch.response(per_position));
        let p = |i: usize| batch.predict[i] as f32;
        assert_eq!(at, vec![p(0), p(1), p(2), 0.0, p(3), 0.0]);
        assert_eq!(batch.unpack(&[1.0, 2.0, 3.0, 4.0], 1, 2), vec![3.0, 4.0]);
    }

    #[test]
    fn packed_rows_score_as_if_each_were_alone() {
        let device = Device::flex();
        let model = TransformerConfig::new(50, 32, 64, 2, 4, 2, 8).init_seeded(&device, 3);
        // Rows 0 and 4 share a prompt, as do rows 2 and 5 and rows 6 and 7 (empty).
        let rows: Vec<(Vec<u32>, usize)> = vec![
            ((1..12).collect(), 5),
            ((20..25).collect(), 2),
            ((30..33).collect(), 1),
            ((40..47).collect(), 6),
            ([&[1, 2, 3, 4, 5][..], &[9, 8, 7][..]].concat(), 5),
            (vec![30, 44, 45, 46, 47], 1),
            (vec![3, 4], 0),
            (vec![5, 6, 7], 0),
        ];
        let refs: Vec<(&[u32], usize)> = rows.iter().map(|(r, p)| (&r[..], *p)).collect();
        let batch = LearnerBatch::new(&refs, 0, &device);
        assert!(
            batch.input().input_ids.dims()[0] < rows.len(),
            "rows share bins"
        );
        let packed = floats(batch.logprobs(&model, None).unwrap());
        let r = batch.response_len();
        for (k, (row, pl)) in rows.iter().enumerate() {
            let ids: Vec<i64> = row.iter().map(|&t| t as i64).collect();
            let (ids, pl) = match pl {
                0 => ([&[0][..], &ids[..]].concat(), 1),
                &pl => (ids, pl),
            };
            let input = ForwardInput::new(Tensor::from_data(
                TensorData::new(ids.clone(), [1, ids.len()]),
                &device,
            ));
            let logits = model.forward_positions(&input, pl - 1, ids.len() - pl);
            let labels = Tensor::from_data(
                TensorData::new(ids[pl..].to_vec(), [1, ids.len() - pl]),
                &device,
            );
            let alone = floats(rlft_algo::logprobs_from_logits(logits, labels, None).unwrap());
            for (j, v) in alone.iter().enumerate() {
                let d = (v - packed[k * r + j]).abs();
                assert!(
                    d < 1e-5,
                    "row {k} token {j}: alone {v}, packed {}",
                    packed[k * r + j]
                );
            }
        }
    }
}
