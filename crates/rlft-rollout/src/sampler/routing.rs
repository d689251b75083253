//! Recording a mixture of experts' routing as the sampler forwards tokens: the prompts of the
//! first prefill, whole contexts recomputed after a weight update, and each decode step's token.

use super::Row;
use rlft_model::{Routing, Transformer};

/// A mixture of experts' sparse layer count and experts per token; `None` for a dense model.
pub(super) fn sparse_shape(model: &Transformer) -> Option<(usize, usize)> {
    let sparse: Vec<_> = model.sparse_layers().collect();
    let first = sparse.first()?;
    Some((sparse.len(), first.top_k.min(first.experts.len())))
}

/// Which tokens a backend pass of the sampler forwarded, for [`record_routing`].
pub(super) enum Recorded<'a> {
    /// The first prefill: one left-padded row per distinct prompt (`source[i]` is prompt `i`'s
    /// row).
    Prompts(&'a [usize], &'a [Vec<u32>]),
    /// A prefill of each row's whole context (prompt + tokens so far), rows in order.
    Contexts(&'a [Vec<u32>]),
    /// One decode step: each row's last token.
    Step,
}

/// Adds the routing of a backend pass `width` tokens wide to each row's record.
pub(super) fn record_routing(
    rows: &mut [Row],
    routing: &[Routing],
    width: usize,
    what: Recorded<'_>,
) {
    for (i, row) in rows.iter_mut().enumerate() {
        let Some(rec) = row.routing.as_mut() else {
            continue;
        };
        match what {
            Recorded::Step => rec.push_from(routing, i),
            Recorded::Prompts(source, prompts) => {
                let (u, len) = (source[row.index], prompts[row.index].len());
                for t in width - len..width {
                    rec.push_from(routing, u * width + t);
                }
            }
            Recorded::Contexts(prompts) => {
                let len = prompts[row.index].len() + row.tokens.len();
                rec.truncate(0);
                for t in width - len..width {
                    rec.push_from(routing, i * width + t);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{LearnerBatch, Sampler, SamplingConfig};
    use burn::module::Param;
    use burn::tensor::Tensor;
    use burn::tensor::{Device, TensorData};
    use rlft_model::{FeedForward, ForwardInput, MoeConfig, TransformerConfig};
    use rlft_model::{Routing, TokenRouting, Transformer};

    fn floats<const D: usize>(t: Tensor<D>) -> Vec<f32> {
        t.into_data()
            .convert::<f32>()
            .try_into_vec::<f32>()
            .unwrap()
    }

    /// A copy of `model` whose routers are moved by `scale` times a fixed pattern.
    fn perturbed(model: &Transformer, scale: f32) -> Transformer {
        let mut m = model.clone();
        for (i, layer) in m.layers.iter_mut().enumerate() {
            if let FeedForward::Experts(moe) = &mut layer.mlp {
                let w = moe.gate.weight.val();
                let [a, b] = w.dims();
                let noise: Vec<f32> = (0..a * b)
                    .map(|j| ((j * 7919 + i * 104_729) % 1000) as f32 / 500.0 - 1.0)
                    .collect();
                let noise = Tensor::<2>::from_data(TensorData::new(noise, [a, b]), &w.device());
                moe.gate.weight = Param::from_tensor((w + noise * scale).detach());
            }
        }
        m
    }

    /// Router replay: after the router moves enough to flip ≥ 5 % of the top-k sets, the
    /// replayed learner batch routes every recorded token to the sampler's experts (mismatch 0),
    /// its log-probs equal each row's own forward pass with the recorded experts forced, and
    /// the router still gets a gradient; without replay the learner's routing differs from the
    /// record.
    #[test]
    fn replay_forces_the_recorded_experts_after_the_router_moved() {
        let device = Device::flex();
        let cfg = TransformerConfig::new(40, 16, 24, 2, 2, 1, 8)
            .with_family(&rlft_model::families::Qwen3Moe)
            .with_qk_norm(true)
            .with_moe(Some(MoeConfig::new(6, 2, 16)));
        let model = cfg.init_seeded(&device, 5);
        let prompts: Vec<Vec<u32>> = vec![vec![1, 2, 3, 4], vec![5, 6, 7], vec![1, 2, 3, 4]];
        let sampling = SamplingConfig::new()
            .with_max_new_tokens(6)
            .with_ignore_eos(true)
            .with_seed(3);
        let done = Sampler::new(&model, None)
            .generate(&prompts, &sampling)
            .unwrap();
        let seqs: Vec<Vec<u32>> = prompts
            .iter()
            .zip(&done)
            .map(|(p, c)| [&p[..], &c.tokens[..]].concat())
            .collect();
        for (s, c) in seqs.iter().zip(&done) {
            let r = c.routing.as_ref().expect("a MoE sampler records routing");
            assert_eq!((r.layers, r.k), (2, 2));
            assert_eq!(r.tokens(), s.len() - 1, "every forwarded token");
        }
        let rows: Vec<(&[u32], usize)> = seqs
            .iter()
            .zip(&prompts)
            .map(|(s, p)| (&s[..], p.len()))
            .collect();
        let records: Vec<Option<&TokenRouting>> = done.iter().map(|c| c.routing.as_ref()).collect();
        let batch =
            |replay| LearnerBatch::new(&rows, 0, &device).with_routing(&records, replay, 0.0);

        // Unmoved, the learner routes as the sampler did.
        let b = batch(false);
        b.logprobs(&model, None).unwrap();
        let s = b.take_routing_stats().unwrap();
        assert!(s.pairs > 0 && s.drifted == 0 && s.mismatched == 0, "{s:?}");

        // Move the router until at least 5 % of the recorded top-k sets flip.
        let mut scale = 0.05;
        let (moved, scale) = loop {
            let m = perturbed(&model, scale);
            let b = batch(false);
            b.logprobs(&m, None).unwrap();
            let (_, drift) = b.take_routing_stats().unwrap().fractions().unwrap();
            if drift >= 0.05 {
                break (m, scale);
            }
            scale *= 2.0;
            assert!(scale < 100.0, "the router never moved");
        };
        let free = batch(false);
        free.logprobs(&moved, None).unwrap();
        let (mismatch, _) = free.take_routing_stats().unwrap().fractions().unwrap();
        assert!(
            mismatch > 0.0,
            "without replay the experts differ: {mismatch}"
        );

        let replayed = batch(true);
        let lp = floats(replayed.logprobs(&moved, None).unwrap());
        let (mismatch, drift) = replayed.take_routing_stats().unwrap().fractions().unwrap();
        assert_eq!(mismatch, 0.0);
        assert!(drift >= 0.05, "{drift}");
        let r = replayed.response_len();
        for (k, (seq, c)) in seqs.iter().zip(&done).enumerate() {
            let rec = c.routing.as_ref().unwrap();
            let n = seq.len();
            let forced: Vec<Routing> = (0..rec.layers)
                .map(|l| Routing {
                    k: rec.k,
                    ids: (0..n)
                        .flat_map(|t| match t < rec.tokens() {
                            true => rec.get(t, l).iter().map(|&e| u32::from(e)).collect(),
                            false => vec![Routing::OWN; rec.k],
                        })
                        .collect(),
                })
                .collect();
            let ids: Vec<i64> = seq.iter().map(|&t| t as i64).collect();
            let input = ForwardInput::new(Tensor::from_data(
                TensorData::new(ids.clone(), [1, n]),
                &device,
            ));
            let (logits, _) = moved.forward_routed(&input, Some(&forced));
            let pl = prompts[k].len();
            let logits = logits.narrow(1, pl - 1, n - pl);
            let labels =
                Tensor::from_data(TensorData::new(ids[pl..].to_vec(), [1, n - pl]), &device);
            let alone = floats(rlft_algo::logprobs_from_logits(logits, labels, None).unwrap());
            for (j, v) in alone.iter().enumerate() {
                let d = (v - lp[k * r + j]).abs();
                assert!(d <= 1e-5, "row {k} token {j}: {d}");
            }
        }

        // The router keeps a gradient under replay.
        let ad = Device::flex().autodiff();
        let moved = perturbed(&cfg.init_seeded(&ad, 5), scale);
        let replayed = LearnerBatch::new(&rows, 0, &ad).with_routing(&records, true, 0.0);
        let grads = replayed.logprobs(&moved, None).unwrap().sum().backward();
        let gates = moved
            .sparse_layers()
            .filter_map(|m| m.gate.weight.grad(&grads));
        let total: f32 = gates.map(|g| g.abs().sum().into_scalar::<f32>()).sum();
        assert!(total > 0.0, "router gradient");
    }
}
