//! The learner's batch layout, shared by rescoring and the trainer.
//!
//! Rows of prompt + response tokens are packed as `[n, P + R]`: prompts left-padded to the
//! longest prompt `P`, responses right-padded to the longest response `R`, positions counted per
//! row from its first real token, and an attention mask over the real tokens. The `R` logits
//! that predict the response tokens are then at positions `P - 1 .. P - 1 + R` for every row, so
//! one slice serves the whole batch. Rescoring the sampler's μ and the learner's π must build the
//! same layout, or the two differ by the rounding of different shapes.

use burn::tensor::{Device, Int, Tensor, TensorData};
use rlft_model::{ForwardInput, Transformer};

/// Rows in the learner's layout (see the module docs).
#[derive(Debug, Clone)]
pub struct LearnerBatch {
    ids: Vec<i64>,
    attention: Vec<i64>,
    positions: Vec<i64>,
    n: usize,
    p: usize,
    r: usize,
    device: Device,
}

impl LearnerBatch {
    /// Packs rows given as `(prompt + response tokens, prompt length)`; padding uses `pad_id`.
    pub fn new<T: Copy + Into<i64>>(rows: &[(&[T], usize)], pad_id: i64, device: &Device) -> Self {
        let p = rows.iter().map(|(_, pl)| *pl).max().unwrap_or(1).max(1);
        let r = rows
            .iter()
            .map(|(ids, pl)| ids.len().saturating_sub(*pl))
            .max()
            .unwrap_or(1)
            .max(1);
        let (n, w) = (rows.len(), p + r);
        let mut ids = vec![pad_id; n * w];
        let mut attention = vec![0i64; n * w];
        let mut positions = vec![0i64; n * w];
        for (k, (row, pl)) in rows.iter().enumerate() {
            let start = k * w + p - pl;
            for (j, &t) in row.iter().enumerate() {
                ids[start + j] = t.into();
                attention[start + j] = 1;
                positions[start + j] = j as i64;
            }
        }
        Self {
            ids,
            attention,
            positions,
            n,
            p,
            r,
            device: device.clone(),
        }
    }

    /// Rows `n`.
    pub fn rows(&self) -> usize {
        self.n
    }

    /// Response width `R` (the longest response).
    pub fn response_len(&self) -> usize {
        self.r
    }

    /// The same rows, building their tensors on `device`.
    pub fn to_device(&self, device: &Device) -> Self {
        Self {
            device: device.clone(),
            ..self.clone()
        }
    }

    fn int2(&self, v: Vec<i64>, cols: usize) -> Tensor<2, Int> {
        Tensor::from_data(TensorData::new(v, [self.n, cols]), &self.device)
    }

    /// The forward-pass input `[n, P + R]`.
    pub fn input(&self) -> ForwardInput {
        let w = self.p + self.r;
        ForwardInput {
            input_ids: self.int2(self.ids.clone(), w),
            position_ids: self.int2(self.positions.clone(), w),
            attention_mask: Some(self.int2(self.attention.clone(), w)),
        }
    }

    /// Response token ids `[n, R]` (padding past a row's response), the labels of
    /// [`LearnerBatch::response_logits`].
    pub fn targets(&self) -> Tensor<2, Int> {
        let w = self.p + self.r;
        let t: Vec<i64> = (0..self.n)
            .flat_map(|k| self.ids[k * w + self.p..(k + 1) * w].to_vec())
            .collect();
        self.int2(t, self.r)
    }

    /// Logits `[n, R, vocab]` at the `R` positions that predict the response tokens (the output
    /// head runs at those positions only).
    pub fn response_logits(&self, model: &Transformer) -> Tensor<3> {
        model.forward_positions(&self.input(), self.p - 1, self.r)
    }

    /// The `R` positions that predict the response tokens: `[n, P + R, x] → [n, R, x]`.
    pub fn response(&self, per_position: Tensor<3>) -> Tensor<3> {
        per_position.narrow(1, self.p - 1, self.r)
    }

    /// Row `k`'s first `len` values out of a host `[n, R]` block.
    pub fn unpack(&self, flat: &[f32], k: usize, len: usize) -> Vec<f32> {
        flat[k * self.r..k * self.r + len].to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_left_padded_responses_right_padded_positions_per_row() {
        let device = Device::default();
        let a: Vec<u32> = vec![1, 2, 3, 10];
        let b: Vec<u32> = vec![4, 11, 12];
        let batch = LearnerBatch::new(&[(&a[..], 3), (&b[..], 1)], 0, &device);
        assert_eq!((batch.rows(), batch.response_len()), (2, 2));
        let input = batch.input();
        let host = |t: Tensor<2, Int>| t.into_data().convert::<i64>().try_to_vec::<i64>().unwrap();
        assert_eq!(host(input.input_ids), vec![1, 2, 3, 10, 0, 0, 0, 4, 11, 12]);
        assert_eq!(host(input.position_ids), vec![0, 1, 2, 3, 0, 0, 0, 0, 1, 2]);
        assert_eq!(
            host(input.attention_mask.unwrap()),
            vec![1, 1, 1, 1, 0, 0, 0, 1, 1, 1]
        );
        assert_eq!(host(batch.targets()), vec![10, 0, 11, 12]);
        assert_eq!(batch.unpack(&[1.0, 2.0, 3.0, 4.0], 1, 2), vec![3.0, 4.0]);
    }
}
