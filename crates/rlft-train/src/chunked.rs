//! Log-probs and entropy of a [`LearnerBatch`] with memory bounded by a setting, not by the
//! batch: the output head and the softmax run over `chunk` response positions at a time, so at
//! most one chunk's `[chunk, vocab]` logits are alive — at a 151,936-token vocabulary, 64 rows ×
//! 256 response tokens of logits are 10 GB at once, a 512-token chunk 0.3 GB; the trainer's default budget is 1 GiB of logits.
//!
//! Without gradients ([`LearnerBatch::logprobs_chunked`]) a chunk's logits are dropped before
//! the next is made. With gradients ([`chunked_backward`]) a single autodiff graph would keep
//! every chunk's softmax for the backward pass, so the loss is differentiated in stages:
//! 1. the trunk's final hidden states `h` at the response positions (graph kept);
//! 2. log-probs and entropy chunk by chunk, as values (no graph);
//! 3. the loss on those values as leaves: its gradient with respect to each log-prob and
//!    entropy (`[T]` numbers);
//! 4. per chunk again: the head and softmax from a detached copy of `h`, backward of
//!    `Σ lp·∂L/∂lp + Σ ent·∂L/∂ent` — the head's gradient and `∂L/∂h` for the chunk — then the
//!    chunk's graph is dropped;
//! 5. backward of `Σ h·∂L/∂h` through the trunk.
//!
//! The gradient is the loss's (chain rule through the stages), at the cost of running the head
//! twice forward; when one chunk covers the batch the plain single pass is used.

use burn::module::Module;
use burn::optim::GradientsParams;
use burn::tensor::Tensor;
use rlft_model::Transformer;
use rlft_rollout::LearnerBatch;

/// The logits one chunk of the trainer's output head may hold when
/// `algorithm.logits_chunk_tokens` is 0 (auto).
pub const LOGITS_CHUNK_BYTES: usize = 1 << 30;

/// Response positions per chunk that keep one chunk's logits within `budget_bytes` at
/// `vocab` (f32), at least 1.
pub fn chunk_for_budget(vocab: usize, budget_bytes: usize) -> usize {
    (budget_bytes / (4 * vocab.max(1))).max(1)
}

/// What the loss closure of [`chunked_backward`] is given, per response token `[n, R]`.
pub struct Scores {
    /// Log-probabilities of the tokens (over their kept sets under a sampling mask).
    pub lp: Tensor<2>,
    /// Entropies (of the distribution `lp` is taken over).
    pub ent: Tensor<2>,
    /// Under a sampling mask ([`LearnerBatch::with_kept_sets`]): the log of the mass the
    /// whole-vocabulary softmax puts inside each token's kept set
    /// ([`rlft_algo::kept_log_mass`]); `None` without one.
    pub kept_log_mass: Option<Tensor<2>>,
}

/// What the loss closure of [`chunked_backward`] returns besides the loss.
pub struct LossOut<T> {
    /// The scalar to differentiate, `[1]`.
    pub loss: Tensor<1>,
    /// Anything else the caller wants back (metrics).
    pub extra: T,
}

impl<T> LossOut<T> {
    /// The loss to differentiate and what to hand back with the gradient.
    pub fn new(loss: Tensor<1>, extra: T) -> Self {
        Self { loss, extra }
    }
}

/// The gradient of `loss(scores)` with respect to `model`'s parameters, where the [`Scores`]
/// are the response tokens' log-probs and entropies `[n, R]` at `temperature` (and, under a
/// sampling mask, the mass inside their kept sets; see the module docs for the stages).
/// `entropy_grad = false` treats the entropy as a metric (no gradient through it). Returns the
/// gradients and what the closure returned.
///
/// # Errors
/// A non-positive temperature, or the closure's error.
pub fn chunked_backward<T, E: From<rlft_algo::AlgoError>>(
    batch: &LearnerBatch,
    model: &Transformer,
    temperature: Option<f64>,
    chunk: usize,
    entropy_grad: bool,
    loss: impl FnOnce(Scores) -> Result<LossOut<T>, E>,
) -> Result<(GradientsParams, T), E> {
    if chunk >= batch.tokens() {
        return one_pass(batch, model, temperature, entropy_grad, loss);
    }
    // 1. Hidden states at the response positions, with the trunk's graph.
    let h = batch.hidden_at(model, batch.predict_positions());
    let chunks = batch.chunks(chunk);
    let head = |h: Tensor<2>, (s, l): (usize, usize)| {
        model.output_head(h.narrow(0, s, l).unsqueeze::<3>())
    };
    // 2. Values chunk by chunk, no graph kept.
    let (mut lps, mut ents, mut masses) = (Vec::new(), Vec::new(), Vec::new());
    for &c in &chunks {
        let logits = head(h.clone().detach(), c).detach();
        masses.extend(batch.head_kept_log_mass(logits.clone(), c, temperature)?);
        let (lp, ent) = batch.head_scores(logits, c, temperature, false)?;
        lps.push(lp);
        ents.push(ent);
    }
    // 3. The loss on the values as leaves.
    let lp_leaf = Tensor::cat(lps, 1).detach().require_grad();
    let ent_leaf = Tensor::cat(ents, 1).detach();
    let ent_leaf = if entropy_grad {
        ent_leaf.require_grad()
    } else {
        ent_leaf
    };
    let mass_leaf = (!masses.is_empty()).then(|| Tensor::cat(masses, 1).detach().require_grad());
    let out = loss(Scores {
        lp: batch.rows(lp_leaf.clone()),
        ent: batch.rows(ent_leaf.clone()),
        kept_log_mass: mass_leaf.clone().map(|m| batch.rows(m)),
    })?;
    let g = out.loss.backward();
    let t = batch.tokens();
    let device = lp_leaf.device();
    let zeros = || Tensor::<1>::zeros([t], (&device, lp_leaf.dtype())).without_autodiff();
    let g_lp = lp_leaf.grad(&g).map(|x| x.reshape([t]));
    let g_ent = entropy_grad
        .then(|| ent_leaf.grad(&g))
        .flatten()
        .map(|x| x.reshape([t]));
    let g_mass = mass_leaf
        .and_then(|m| m.grad(&g))
        .map(|x| Tensor::<1>::from_inner(x.reshape([t])));
    drop(g);
    if g_lp.is_none() && g_ent.is_none() && g_mass.is_none() {
        // The loss does not depend on the policy: no gradient but a mixture of experts'
        // load-balancing term, as in the one-pass graph.
        let grads = match batch.take_aux_loss() {
            Some(aux) => GradientsParams::from_grads(aux.backward(), model),
            None => GradientsParams::new(),
        };
        return Ok((grads, out.extra));
    }
    // 4. Per chunk: the head's gradient and ∂L/∂h.
    let leaf_grads = LeafGrads {
        lp: Tensor::from_inner(g_lp.unwrap_or_else(zeros)),
        ent: g_ent.map(Tensor::from_inner),
        mass: g_mass,
    };
    let mut grads = GradientsParams::new();
    let g_h = head_chunks(
        batch,
        model,
        (&h, &chunks),
        temperature,
        &leaf_grads,
        &mut grads,
    )?;
    // 5. Through the trunk, with a mixture of experts' load-balancing loss.
    let aux = batch.take_aux_loss();
    let trunk = match (g_h, aux) {
        (Some(g_h), aux) => {
            let s = (h * Tensor::from_inner(g_h)).sum();
            Some(match aux {
                Some(a) => s + a,
                None => s,
            })
        }
        (None, aux) => aux,
    };
    if let Some(s) = trunk {
        add(
            &mut grads,
            GradientsParams::from_grads(s.backward(), model),
            model,
        );
    }
    Ok((grads, out.extra))
}

/// The loss's gradient with respect to its leaves, per response token `[T]`: to the log-probs,
/// the entropies and the log mass inside the kept sets (`None`: the loss does not depend on
/// them).
struct LeafGrads {
    lp: Tensor<1>,
    ent: Option<Tensor<1>>,
    mass: Option<Tensor<1>>,
}

/// Stage 4: per chunk of `chunks`, the head and softmax again from a detached copy of the
/// hidden states `h`, and the backward of `Σ lp·∂L/∂lp + Σ ent·∂L/∂ent + Σ mass·∂L/∂mass`:
/// the head's gradients are added to `grads`, and `∂L/∂h` summed over the chunks is returned.
fn head_chunks(
    batch: &LearnerBatch,
    model: &Transformer,
    (h, chunks): (&Tensor<2>, &[(usize, usize)]),
    temperature: Option<f64>,
    g: &LeafGrads,
    grads: &mut GradientsParams,
) -> rlft_algo::Result<Option<Tensor<2>>> {
    let slice = |x: &Tensor<1>, (s, l): (usize, usize)| x.clone().narrow(0, s, l).unsqueeze::<2>();
    let h_leaf = h.clone().detach().require_grad();
    let mut g_h: Option<Tensor<2>> = None;
    for &c in chunks {
        let logits = model.output_head(h_leaf.clone().narrow(0, c.0, c.1).unsqueeze::<3>());
        let mass = match &g.mass {
            Some(gm) => batch
                .head_kept_log_mass(logits.clone(), c, temperature)?
                .map(|m| (m * slice(gm, c)).sum()),
            None => None,
        };
        let s = match &g.ent {
            Some(ge) => {
                let (lp, ent) = batch.head_scores(logits, c, temperature, true)?;
                (lp * slice(&g.lp, c)).sum() + (ent * slice(ge, c)).sum()
            }
            None => (batch.head_logprobs(logits, c, temperature)? * slice(&g.lp, c)).sum(),
        };
        let s = match mass {
            Some(m) => s + m,
            None => s,
        };
        let mut gc = s.backward();
        if let Some(x) = h_leaf.grad_remove(&mut gc) {
            g_h = Some(match g_h {
                Some(acc) => acc + x,
                None => x,
            });
        }
        add(grads, GradientsParams::from_grads(gc, model), model);
    }
    Ok(g_h)
}

/// The loss's gradient through the plain graph, when one chunk covers the batch (the same
/// numbers as the trainer has always computed).
fn one_pass<T, E: From<rlft_algo::AlgoError>>(
    batch: &LearnerBatch,
    model: &Transformer,
    temperature: Option<f64>,
    entropy_grad: bool,
    loss: impl FnOnce(Scores) -> Result<LossOut<T>, E>,
) -> Result<(GradientsParams, T), E> {
    let logits = batch.response_logits(model);
    let all = (0, batch.tokens());
    let mass = batch.head_kept_log_mass(logits.clone(), all, temperature)?;
    let (lp, ent) = batch.head_scores(logits, all, temperature, entropy_grad)?;
    let out = loss(Scores {
        lp: batch.rows(lp),
        ent: batch.rows(ent),
        kept_log_mass: mass.map(|m| batch.rows(m)),
    })?;
    let total = match batch.take_aux_loss() {
        Some(aux) => out.loss + aux,
        None => out.loss,
    };
    let grads = GradientsParams::from_grads(total.backward(), model);
    Ok((grads, out.extra))
}

/// `into += from`, parameter by parameter.
fn add(into: &mut GradientsParams, mut from: GradientsParams, model: &Transformer) {
    struct Add<'a> {
        into: &'a mut GradientsParams,
        from: &'a mut GradientsParams,
    }
    impl burn::module::ModuleVisitor for Add<'_> {
        fn visit_float<const D: usize>(&mut self, p: &burn::module::Param<Tensor<D>>) {
            let Some(g) = self.from.remove::<D>(p.id) else {
                return;
            };
            let g = match self.into.remove::<D>(p.id) {
                Some(acc) => acc + g,
                None => g,
            };
            self.into.register::<D>(p.id, g);
        }
    }
    model.visit(&mut Add {
        into,
        from: &mut from,
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Device, TensorData};
    use rlft_model::TransformerConfig;

    fn batch(device: &Device) -> LearnerBatch {
        let a: Vec<u32> = vec![5, 9, 11, 3, 7, 20, 21];
        let b: Vec<u32> = vec![5, 9, 11, 30, 31];
        let c: Vec<u32> = vec![2, 4, 40, 41, 42, 43];
        LearnerBatch::new(&[(&a[..], 3), (&b[..], 3), (&c[..], 2)], 0, device)
    }

    fn flat<const D: usize>(t: Tensor<D>) -> Vec<f32> {
        t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap()
    }

    /// Chunked log-probs equal the one-pass ones; the chunked gradient of a loss that mixes
    /// log-probs, entropy and a per-row sum equals the one-pass gradient — over the whole
    /// vocabulary and over sampling masks, there with the mass inside the kept sets too.
    #[test]
    fn chunks_give_the_same_values_and_gradients() {
        let device = Device::flex().autodiff();
        let model = TransformerConfig::new(64, 16, 32, 1, 2, 1, 8)
            .with_tie_word_embeddings(true)
            .init_seeded(&device, 7);
        let kept_a = [
            Some(vec![3, 8, 9]),
            Some(vec![7, 1]),
            None,
            Some(vec![21, 5, 6, 60]),
        ];
        let kept_c = [Some(vec![40, 41]), Some(vec![41, 2, 3]), Some(vec![42])];
        let masked = batch(&device).with_kept_sets(&[&kept_a[..], &[], &kept_c[..]]);
        for b in [batch(&device), masked] {
            same_values_and_gradients(&model, &b);
        }
    }

    /// Replay against a stale sampler: the kept sets are another model's top 3 (a sampler many
    /// versions old), so most do not hold the learner's likeliest tokens. The gradient of
    /// `Σ w·log π̃` with respect to the output head, whole and chunked, equals the f64 reference
    /// `Σ_t w_t (1[j = y_t] − π̃_t(j)·1[j ∈ K_t]) h_t / τ` built from the learner's hidden
    /// states: the column of a token outside every kept set gets exactly none, whatever the
    /// weights, and only a pull on the mass inside the kept sets moves it.
    #[test]
    fn replay_gradient_matches_a_brute_force_reference() {
        let device = Device::flex().autodiff();
        let (vocab, d, tau) = (96, 16, 0.7);
        let config = TransformerConfig::new(vocab, d, 32, 1, 2, 1, 8);
        let (model, stale) = (
            config.init_seeded(&device, 7),
            config.init_seeded(&device, 8),
        );
        let plain = batch(&device);
        let t = plain.tokens();
        let old = flat(plain.response_logits(&stale.valid()));
        let top3 = |i: usize| -> Vec<u32> {
            let row = &old[i * vocab..(i + 1) * vocab];
            let mut ids: Vec<u32> = (0..vocab as u32).collect();
            ids.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]));
            ids.truncate(3);
            ids
        };
        // Response tokens in row order: 4, 2 and 4 of them.
        let (lens, r) = ([4usize, 2, 4], plain.response_len());
        let mut at = 0;
        let per_row: Vec<Vec<Option<Vec<u32>>>> = lens
            .iter()
            .map(|&n| {
                at += n;
                (at - n..at).map(|i| Some(top3(i))).collect()
            })
            .collect();
        let refs: Vec<&[Option<Vec<u32>>]> = per_row.iter().map(|v| &v[..]).collect();
        let b = batch(&device).with_kept_sets(&refs);
        let flat_at: Vec<usize> = (0..3)
            .flat_map(|k| (0..lens[k]).map(move |j| k * r + j))
            .collect();
        let weights: Vec<f32> = (0..3 * r).map(|i| 0.25 * i as f32 - 1.0).collect();
        // The reference, in f64 from the hidden states and the head's weights `[d, vocab]`.
        let head = model.lm_head.as_ref().expect("an untied head");
        let wh = flat(head.weight.val());
        let h = flat(b.hidden_at(&model.valid(), b.predict_positions()));
        let y = flat(b.targets_flat().float());
        let mut want = vec![0.0f64; d * vocab];
        let mut outside: Vec<bool> = vec![true; vocab];
        for i in 0..t {
            let set: Vec<usize> = std::iter::once(y[i] as usize)
                .chain(top3(i).into_iter().map(|v| v as usize))
                .fold(Vec::new(), |mut s, v| {
                    if !s.contains(&v) {
                        s.push(v);
                    }
                    s
                });
            let z = |j: usize| {
                (0..d)
                    .map(|k| f64::from(h[i * d + k] * wh[k * vocab + j]))
                    .sum::<f64>()
                    / tau
            };
            let lse = set.iter().map(|&j| z(j).exp()).sum::<f64>().ln();
            let w = f64::from(weights[flat_at[i]]);
            for &j in &set {
                outside[j] = false;
                let c = w * (f64::from(u8::from(j == y[i] as usize)) - (z(j) - lse).exp());
                for k in 0..d {
                    want[k * vocab + j] += c * f64::from(h[i * d + k]) / tau;
                }
            }
        }
        assert!(outside.iter().filter(|&&o| o).count() > vocab / 2);
        let head_grad = |chunk: usize, pull: f32| {
            let loss = |s: Scores| -> rlft_algo::Result<LossOut<()>> {
                let [n, width] = s.lp.dims();
                let w = TensorData::new(weights.clone(), [n, width]);
                let mut l = (s.lp * Tensor::<2>::from_data(w, &device)).sum();
                if pull != 0.0 {
                    let mass = s.kept_log_mass.expect("a sampling mask");
                    l = l - mass.sum() * pull;
                }
                Ok(LossOut { loss: l, extra: () })
            };
            let (g, ()) = chunked_backward(&b, &model, Some(tau), chunk, false, loss).unwrap();
            flat(g.get::<2>(head.weight.id).expect("a head gradient"))
        };
        for chunk in [1, 3, t] {
            let got = head_grad(chunk, 0.0);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (f64::from(*g) - w).abs() <= 1e-5 + 1e-4 * w.abs(),
                    "chunk {chunk}, [{}, {}]: {g} vs {w}",
                    i / vocab,
                    i % vocab
                );
                if outside[i % vocab] {
                    assert_eq!(*g, 0.0, "chunk {chunk}: outside column {}", i % vocab);
                }
            }
            let pulled = head_grad(chunk, 0.5);
            let moved = (0..d * vocab).filter(|&i| outside[i % vocab] && pulled[i] != 0.0);
            assert!(
                moved.count() > 0,
                "chunk {chunk}: the pull moves no outside column"
            );
        }
    }

    fn same_values_and_gradients(model: &Transformer, b: &LearnerBatch) {
        let t = b.tokens();
        let plain = flat(b.logprobs(&model.valid(), Some(0.7)).unwrap());
        for chunk in [1, 3, t] {
            let c = flat(
                b.logprobs_chunked(&model.valid(), Some(0.7), chunk)
                    .unwrap(),
            );
            for (x, y) in plain.iter().zip(&c) {
                assert!((x - y).abs() < 1e-5, "chunk {chunk}: {x} vs {y}");
            }
        }
        let loss = |s: Scores| -> rlft_algo::Result<LossOut<()>> {
            let Scores { lp, ent, .. } = s;
            let [n, r] = lp.dims();
            let w: Vec<f32> = (0..n * r).map(|i| 0.1 * i as f32 - 0.3).collect();
            let w = Tensor::<2>::from_data(TensorData::new(w, [n, r]), &lp.device());
            let seq = (lp.clone() * w).sum_dim(1).exp().sum();
            let mut l = seq * 0.5 - ent.sum() * 0.01 + lp.sum() * 0.2;
            // Under a sampling mask, a pull on the mass inside the kept sets.
            if let Some(m) = s.kept_log_mass {
                l = l - (m * 0.3).sum();
            }
            Ok(LossOut { loss: l, extra: () })
        };
        let grads_of = |chunk: usize| {
            let (g, ()) = chunked_backward(b, model, Some(0.7), chunk, true, loss).unwrap();
            let mut out = Vec::new();
            struct Collect<'a>(&'a GradientsParams, &'a mut Vec<f32>);
            impl burn::module::ModuleVisitor for Collect<'_> {
                fn visit_float<const D: usize>(&mut self, p: &burn::module::Param<Tensor<D>>) {
                    if let Some(g) = self.0.get::<D>(p.id) {
                        self.1.extend(flat(g));
                    }
                }
            }
            model.visit(&mut Collect(&g, &mut out));
            out
        };
        let one = grads_of(t);
        assert!(one.iter().any(|v| v.abs() > 1e-6));
        for chunk in [1, 4] {
            let c = grads_of(chunk);
            assert_eq!(c.len(), one.len());
            for (x, y) in one.iter().zip(&c) {
                assert!(
                    (x - y).abs() <= 1e-5 + 1e-4 * x.abs(),
                    "chunk {chunk}: {x} vs {y}"
                );
            }
        }
    }
}
