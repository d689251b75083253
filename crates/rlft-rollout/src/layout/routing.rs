//! Router replay in the learner's layout: the experts the sampler recorded for each token
//! ([`rlft_model::TokenRouting`]) laid out like the packed tokens, forced in the learner's
//! passes when replay is on, and compared with the routing those passes compute.

use super::LearnerBatch;
use burn::tensor::{Int, Tensor};
use rlft_model::{Routing, TokenRouting, Transformer};
use std::sync::{Arc, Mutex};

/// Counts of recorded (token, sparse layer) pairs over the passes of a batch, and their
/// load-balancing losses.
#[derive(Debug, Default, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RoutingStats {
    /// Recorded pairs seen.
    pub pairs: u64,
    /// Pairs whose experts in the pass (forced under replay) differ from the record.
    pub mismatched: u64,
    /// Pairs whose router's own top-k differs from the record.
    pub drifted: u64,
    /// Sum of the passes' load-balancing losses (with a coefficient set).
    pub aux_loss_sum: f64,
    /// Passes that computed one.
    pub aux_losses: u64,
}

impl RoutingStats {
    /// Adds another count.
    pub fn add(&mut self, other: RoutingStats) {
        self.pairs += other.pairs;
        self.mismatched += other.mismatched;
        self.drifted += other.drifted;
        self.aux_loss_sum += other.aux_loss_sum;
        self.aux_losses += other.aux_losses;
    }

    /// The mean load-balancing loss of the passes; `None` without one.
    pub fn aux_loss(&self) -> Option<f64> {
        (self.aux_losses > 0).then(|| self.aux_loss_sum / self.aux_losses as f64)
    }

    /// `(mismatch, drift)` fractions; `None` without pairs.
    pub fn fractions(&self) -> Option<(f64, f64)> {
        (self.pairs > 0).then(|| {
            let n = self.pairs as f64;
            (self.mismatched as f64 / n, self.drifted as f64 / n)
        })
    }
}

/// The recorded routing of a batch's packed tokens.
#[derive(Debug)]
pub(super) struct PackedRouting {
    /// One routing per sparse layer over the `[bins·W]` packed tokens ([`Routing::OWN`] where
    /// there is no record).
    record: Vec<Routing>,
    /// Whether each packed token has a record.
    recorded: Vec<bool>,
    replay: bool,
    /// Coefficient of the load-balancing loss (0: none).
    aux_coef: f64,
    stats: Mutex<RoutingStats>,
    /// The last pass's load-balancing loss, times its coefficient, in the pass's graph.
    aux: Mutex<Option<Tensor<1>>>,
}

impl LearnerBatch {
    /// Attaches the sampler's routing of each row (rows in the order [`LearnerBatch::new`] took
    /// them; `None` where a row has none). With `replay`, every pass forces the recorded experts
    /// (router replay) while the current router weighs them; either way the passes count how
    /// their routing differs from the record ([`LearnerBatch::take_routing_stats`]). Rows whose
    /// records do not fit the model (another number of sparse layers or experts per token) are
    /// ignored, as are tokens past a record's end.
    ///
    /// With `aux_coef` > 0 each pass also computes transformers' load-balancing loss
    /// (`load_balancing_loss_func`: E · Σₑ fₑ · Pₑ over the real tokens of all sparse layers, fₑ
    /// the share of routed slots that went to expert e — the experts used, the replayed ones
    /// under replay — and Pₑ its mean router probability), times `aux_coef`, for the caller to
    /// add to its loss ([`LearnerBatch::take_aux_loss`]).
    pub fn with_routing(
        mut self,
        rows: &[Option<&TokenRouting>],
        replay: bool,
        aux_coef: f64,
    ) -> Self {
        let Some(shape) = rows.iter().flatten().next().map(|r| (r.layers, r.k)) else {
            return self;
        };
        let (layers, k) = shape;
        let slots = self.ids.len();
        let mut record = vec![
            Routing {
                k,
                ids: vec![Routing::OWN; slots * k],
            };
            layers
        ];
        let mut recorded = vec![false; slots];
        for (slot, &(row, t)) in self.origin.iter().enumerate() {
            let Some(Some(rec)) = rows.get(row as usize).filter(|_| row >= 0) else {
                continue;
            };
            if (rec.layers, rec.k) != shape || t as usize >= rec.tokens() {
                continue;
            }
            for (l, r) in record.iter_mut().enumerate() {
                for (j, &e) in rec.get(t as usize, l).iter().enumerate() {
                    r.ids[slot * k + j] = u32::from(e);
                }
            }
            recorded[slot] = true;
        }
        self.routing = Some(Arc::new(PackedRouting {
            record,
            recorded,
            replay,
            aux_coef,
            stats: Mutex::new(RoutingStats::default()),
            aux: Mutex::new(None),
        }));
        self
    }

    /// The load-balancing loss term (coefficient applied) of the batch's last pass, in its
    /// autodiff graph; `None` without one.
    pub fn take_aux_loss(&self) -> Option<Tensor<1>> {
        let r = self.routing.as_ref()?;
        r.aux.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// The same batch without a routing record (passes route with their own router).
    pub fn without_routing(mut self) -> Self {
        self.routing = None;
        self
    }

    /// The routing counts of the passes since the last call (`None` without a record).
    pub fn take_routing_stats(&self) -> Option<RoutingStats> {
        let r = self.routing.as_ref()?;
        let mut stats = r.stats.lock().unwrap_or_else(|e| e.into_inner());
        Some(std::mem::take(&mut *stats))
    }

    /// Final hidden states `[n, d]` at `positions` of the batch's pass, replaying and
    /// measuring the routing when the batch carries a record.
    pub fn hidden_at(&self, model: &Transformer, positions: Tensor<1, Int>) -> Tensor<2> {
        let input = self.input();
        let Some(r) = self.routing.as_ref().filter(|_| model.is_moe()) else {
            return model.hidden_at(&input, positions);
        };
        let replay = r.replay.then_some(&r.record[..]);
        let (h, trace) = model.hidden_at_traced(&input, positions, replay);
        let mut stats = RoutingStats::default();
        for ((rec, own), used) in r.record.iter().zip(&trace.own).zip(&trace.used) {
            for (t, _) in r.recorded.iter().enumerate().filter(|(_, on)| **on) {
                stats.pairs += 1;
                stats.drifted += u64::from(!rec.same_set(own, t));
                stats.mismatched += u64::from(!rec.same_set(used, t));
            }
        }
        if r.aux_coef > 0.0 {
            let real: Vec<i64> = (0..self.segments.len())
                .filter(|&s| self.segments[s] >= 0)
                .map(|s| s as i64)
                .collect();
            if let Some(aux) = load_balancing_loss(&trace, &real, &self.device) {
                stats.aux_loss_sum += f64::from(aux.clone().into_scalar::<f32>());
                stats.aux_losses += 1;
                *r.aux.lock().unwrap_or_else(|e| e.into_inner()) = Some(aux * r.aux_coef);
            }
        }
        r.stats.lock().unwrap_or_else(|e| e.into_inner()).add(stats);
        h
    }
}

/// transformers' `load_balancing_loss_func` over the tokens `real` of every sparse layer of a
/// pass: `E · Σₑ fₑ · Pₑ`, `[1]`; `None` without sparse layers or tokens.
fn load_balancing_loss(
    trace: &rlft_model::RouterTrace,
    real: &[i64],
    device: &burn::tensor::Device,
) -> Option<Tensor<1>> {
    let e = trace.probs.first()?.dims()[1];
    let n = (real.len() * trace.probs.len()) as f64;
    if n == 0.0 {
        return None;
    }
    let idx = Tensor::<1, Int>::from_data(
        burn::tensor::TensorData::new(real.to_vec(), [real.len()]),
        device,
    );
    let mut counts = vec![0f32; e];
    let mut prob_sum: Option<Tensor<1>> = None;
    for (probs, used) in trace.probs.iter().zip(&trace.used) {
        for &t in real {
            for &x in used.token(t as usize) {
                counts[x as usize] += 1.0;
            }
        }
        let s = probs.clone().select(0, idx.clone()).sum_dim(0).reshape([e]);
        prob_sum = Some(match prob_sum {
            Some(acc) => acc + s,
            None => s,
        });
    }
    let f = Tensor::<1>::from_data(
        burn::tensor::TensorData::new(
            counts.iter().map(|c| c / n as f32).collect::<Vec<f32>>(),
            [e],
        ),
        device,
    );
    let p = prob_sum? / n;
    Some((p * f).sum() * e as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Device;
    use rlft_model::{MoeConfig, TransformerConfig};

    /// With every expert chosen (k = E) each fₑ is 1 and the Pₑ sum to 1, so transformers'
    /// load-balancing loss is exactly E; its term reaches the router's gradient.
    #[test]
    fn load_balancing_loss_is_e_when_every_expert_is_chosen() {
        let ad = Device::flex().autodiff();
        let cfg = TransformerConfig::new(40, 16, 24, 2, 2, 1, 8)
            .with_family(&rlft_model::families::Qwen3Moe)
            .with_qk_norm(true)
            .with_moe(Some(MoeConfig::new(3, 3, 8)));
        let model = cfg.init_seeded(&ad, 2);
        let seqs: Vec<Vec<u32>> = vec![vec![1, 2, 3, 4, 5], vec![6, 7, 8]];
        let rows: Vec<(&[u32], usize)> = seqs.iter().map(|s| (&s[..], 2)).collect();
        let record = TokenRouting {
            layers: 2,
            k: 3,
            ids: (0..5 * 2).flat_map(|_| [2u16, 0, 1]).collect(),
        };
        let records = [Some(&record), Some(&record)];
        let batch = LearnerBatch::new(&rows, 0, &ad).with_routing(&records, true, 0.5);
        batch.logprobs(&model, None).unwrap();
        let aux = batch.take_aux_loss().expect("an aux term");
        let v = aux.clone().into_scalar::<f32>();
        assert!((v - 0.5 * 3.0).abs() < 1e-5, "{v}");
        let stats = batch.take_routing_stats().unwrap();
        assert!((stats.aux_loss().unwrap() - 3.0).abs() < 1e-5);
        // A second aux term of a 2-of-3 router moves the router.
        let cfg2 = cfg.clone().with_moe(Some(MoeConfig::new(3, 2, 8)));
        let model = cfg2.init_seeded(&ad, 2);
        let batch = LearnerBatch::new(&rows, 0, &ad).with_routing(&records[..0], false, 1.0);
        assert!(batch.take_aux_loss().is_none(), "no record, no term");
        let record2 = TokenRouting {
            layers: 2,
            k: 2,
            ids: (0..5 * 2).flat_map(|_| [0u16, 1]).collect(),
        };
        let batch = LearnerBatch::new(&rows, 0, &ad).with_routing(&[Some(&record2); 2], false, 1.0);
        let _ = batch.logprobs(&model, None).unwrap();
        let grads = batch.take_aux_loss().unwrap().backward();
        let gates = model
            .sparse_layers()
            .filter_map(|m| m.gate.weight.grad(&grads));
        let total: f32 = gates.map(|g| g.abs().sum().into_scalar::<f32>()).sum();
        assert!(total > 0.0, "router gradient from the aux loss");
    }
}
