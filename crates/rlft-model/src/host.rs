//! Decoding on the CPU without the backend: a whole decode step (embedding, norms, RoPE,
//! attention over a host KV cache, SwiGLU, output head) on host copies of the weights.
//!
//! A decode step of a group of 8 sequences is a few rows against every weight of the model. Its
//! products are memory-bound and run on the kernels of [`crate::decode`]; everything between them
//! (norms, RoPE, a cache that grows by one position, attention over ~100 keys) is tiny, and as
//! backend tensor operations each allocates, dispatches and copies, and a cache grown by
//! concatenation is copied whole every step. Here it is a few loops over `f32` slices instead,
//! the cache grows in place, and the query heads that share a key/value head read its cached
//! keys and values once.
//!
//! The sampler prefills prompts on the backend ([`Transformer::forward_cached`]), moves the cache
//! to the host once ([`KvCache::to_host`]) and then calls [`HostWeights::decode_step`] for each
//! new token. The result equals the backend's forward pass to f32 rounding (tests in
//! `tests/fixtures.rs` against transformers' logits).

use crate::config::NormPlacement;
use crate::decode::{HostMatrix, kernels_available};
use crate::hostmem::{host_resident, host_vec};
use crate::layers::Norm;
use crate::model::{KvCache, Transformer};
use crate::{ModelError, Result};
use burn::nn::Linear;
use burn::tensor::{Device, Tensor};
use rayon::prelude::*;

mod attention;
use attention::RowStep;

/// Most rows a decode step runs on the host: the kernels read every weight once per
/// [`crate::decode::MAX_ROWS`] rows, so for larger batches the backend's tiled product is faster.
pub const DECODE_ROWS: usize = 2 * crate::decode::MAX_ROWS;

/// An RMSNorm's scale and ε.
#[derive(Debug, Clone)]
struct HostNorm {
    gamma: Vec<f32>,
    eps: f32,
}

impl HostNorm {
    fn new(norm: &Norm) -> Result<Self> {
        let gamma = host_vec(norm.gamma.val())?;
        Ok(Self {
            gamma: if norm.unit_offset {
                gamma.into_iter().map(|w| 1.0 + w).collect()
            } else {
                gamma
            },
            eps: norm.epsilon as f32,
        })
    }

    /// Normalises each `gamma.len()`-wide row of `x` in place (burn's `x / √(mean(x²) + ε) · γ`).
    #[inline(always)]
    fn apply(&self, x: &mut [f32]) {
        let d = self.gamma.len();
        for row in x.chunks_mut(d) {
            let ms = row.iter().map(|v| v * v).sum::<f32>() / d as f32;
            let rms = (ms + self.eps).sqrt();
            for (v, g) in row.iter_mut().zip(&self.gamma) {
                *v = *v / rms * g;
            }
        }
    }

    /// [`HostNorm::apply`] into a new buffer.
    fn applied(&self, x: &[f32]) -> Vec<f32> {
        let mut out = x.to_vec();
        self.apply(&mut out);
        out
    }
}

/// A linear layer's bias, if it has one.
fn bias(linear: &Linear) -> Result<Option<Vec<f32>>> {
    linear.bias.as_ref().map(|b| host_vec(b.val())).transpose()
}

/// Several layers' biases side by side (zeros for a layer without one), or `None` if none has.
fn fused_bias(linears: &[&Linear]) -> Result<Option<Vec<f32>>> {
    if linears.iter().all(|l| l.bias.is_none()) {
        return Ok(None);
    }
    let mut out = Vec::new();
    for l in linears {
        match bias(l)? {
            Some(b) => out.extend(b),
            None => out.extend(std::iter::repeat_n(0.0, l.weight.dims()[1])),
        }
    }
    Ok(Some(out))
}

/// Adds `bias` (if any) to every row of `y`.
fn add_bias(y: &mut [f32], bias: Option<&Vec<f32>>) {
    if let Some(b) = bias {
        for row in y.chunks_mut(b.len()) {
            row.iter_mut().zip(b).for_each(|(v, b)| *v += b);
        }
    }
}

/// Host copies of a model's weights for decoding on the CPU (see the module docs).
#[derive(Debug, Clone)]
pub struct HostWeights {
    layers: Vec<HostLayer>,
    /// `[vocab, d]` embedding table, when the output head is not tied to it.
    embed: Option<Vec<f32>>,
    norm: HostNorm,
    head: HostMatrix,
    head_bias: Option<Vec<f32>>,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    /// RoPE inverse frequencies in f32, as the backend's pass uses them.
    inv_freq: Vec<f32>,
}

/// One decoder layer.
#[derive(Debug, Clone)]
struct HostLayer {
    input_norm: HostNorm,
    /// q, k and v side by side.
    qkv: HostMatrix,
    qkv_bias: Option<Vec<f32>>,
    /// Per-head query and key norms (Qwen3).
    qk_norm: Option<(HostNorm, HostNorm)>,
    o: HostMatrix,
    o_bias: Option<Vec<f32>>,
    post_norm: HostNorm,
    /// gate and up side by side.
    gate_up: HostMatrix,
    gate_up_bias: Option<Vec<f32>>,
    down: HostMatrix,
    down_bias: Option<Vec<f32>>,
}

impl HostWeights {
    /// Why the host kernels cannot decode `model`, or `None` when they can. They cover the
    /// Llama family (Llama, Mistral without a window, Qwen2, Qwen3, SmolLM); a family with
    /// sliding windows, soft-caps, other norm placements, partial rotary, scaled embeddings or
    /// logits, GeGLU or experts decodes on the backend.
    pub fn unsupported(model: &Transformer) -> Option<&'static str> {
        let hd = model.head_dim;
        let plain_scale = (1.0 / (hd as f64).sqrt()) as f32;
        let layer = |l: &crate::layers::DecoderLayer| -> Option<&'static str> {
            let a = &l.self_attn;
            let m = match &l.mlp {
                crate::layers::FeedForward::Dense(m) => m,
                crate::layers::FeedForward::Experts(_) => return Some("mixture of experts"),
            };
            if l.norm_placement() != NormPlacement::Pre {
                return Some("norms around or after the sub-layers");
            }
            if a.window.is_some() {
                return Some("sliding-window attention");
            }
            if a.softcap.is_some() {
                return Some("attention soft-cap");
            }
            if a.scale as f32 != plain_scale {
                return Some("attention scale other than 1/sqrt(head_dim)");
            }
            if a.q_norm.as_ref().is_some_and(|n| n.gamma.dims()[0] != hd) {
                return Some("q/k norm over the whole projection");
            }
            if m.activation != crate::config::Activation::Silu {
                return Some("GeGLU");
            }
            if l.residual_multiplier != 1.0 {
                return Some("residual multiplier");
            }
            None
        };
        if let Some(why) = model.layers.iter().find_map(layer) {
            return Some(why);
        }
        if model.rope_inv_freq.len() * 2 != hd || model.local_rope_inv_freq.is_some() {
            return Some("partial or per-layer RoPE");
        }
        if model.embedding_multiplier != 1.0
            || model.logits_scaling != 1.0
            || model.final_logit_softcapping.is_some()
        {
            return Some("scaled embeddings or logits");
        }
        None
    }

    /// Copies `model`'s weights (LoRA adapters applied) to host memory.
    ///
    /// # Errors
    /// [`ModelError::Input`] for a model the kernels do not cover
    /// ([`HostWeights::unsupported`]).
    pub fn new(model: &Transformer) -> Result<Self> {
        if let Some(why) = Self::unsupported(model) {
            return Err(ModelError::Input(format!(
                "the host decode kernels do not cover this model ({why}); decode it on the backend"
            )));
        }
        let layers = model
            .layers
            .par_iter()
            .map(|l| {
                let a = &l.self_attn;
                let m = l
                    .mlp
                    .dense()
                    .ok_or_else(|| ModelError::Input("experts".into()))?;
                let input = l
                    .input_layernorm
                    .as_ref()
                    .ok_or_else(|| ModelError::Input("no input norm".into()))?;
                Ok(HostLayer {
                    input_norm: HostNorm::new(input)?,
                    qkv: HostMatrix::from_in_out(&[
                        a.q_proj.weight.val(),
                        a.k_proj.weight.val(),
                        a.v_proj.weight.val(),
                    ])?,
                    qkv_bias: fused_bias(&[&a.q_proj, &a.k_proj, &a.v_proj])?,
                    qk_norm: match (&a.q_norm, &a.k_norm) {
                        (Some(q), Some(k)) => Some((HostNorm::new(q)?, HostNorm::new(k)?)),
                        _ => None,
                    },
                    o: HostMatrix::from_in_out(&[a.o_proj.weight.val()])?,
                    o_bias: bias(&a.o_proj)?,
                    post_norm: HostNorm::new(&l.post_attention_layernorm)?,
                    gate_up: HostMatrix::from_in_out(&[
                        m.gate_proj.weight.val(),
                        m.up_proj.weight.val(),
                    ])?,
                    gate_up_bias: fused_bias(&[&m.gate_proj, &m.up_proj])?,
                    down: HostMatrix::from_in_out(&[m.down_proj.weight.val()])?,
                    down_bias: bias(&m.down_proj)?,
                })
            })
            .collect::<Result<_>>()?;
        let table = model.embed_tokens.weight.val();
        let (head, head_bias, embed) = match &model.lm_head {
            Some(h) => (
                HostMatrix::from_in_out(&[h.weight.val()])?,
                bias(h)?,
                Some(host_vec(table)?),
            ),
            None => (HostMatrix::from_out_in(table)?, None, None),
        };
        Ok(Self {
            layers,
            embed,
            norm: HostNorm::new(&model.norm)?,
            head,
            head_bias,
            heads: model.num_heads,
            kv_heads: model.num_kv_heads,
            head_dim: model.head_dim,
            inv_freq: model.rope_inv_freq.iter().map(|&f| f as f32).collect(),
        })
    }

    /// Whether decoding on `device` reads tensors from host memory, where these kernels apply
    /// (the flex and ndarray backends on a CPU with AVX-512).
    pub fn suits(device: &Device) -> bool {
        kernels_available() && host_resident(device)
    }

    /// [`HostWeights::suits`] the model's device and [`HostWeights::unsupported`] finds nothing.
    pub fn suits_model(model: &Transformer) -> bool {
        Self::suits(&model.embed_tokens.weight.device()) && Self::unsupported(model).is_none()
    }

    /// Appends the embedding of `token` (`d` values) to `x`.
    fn embed_into(&self, token: u32, x: &mut Vec<f32>) {
        let d = self.norm.gamma.len();
        match &self.embed {
            Some(table) => x.extend_from_slice(&table[token as usize * d..][..d]),
            // Tied: the head's row.
            None => x.extend(self.head.column(token as usize)),
        }
    }

    /// Logits `[n, vocab]` (row-major) for one new token per cached row: `tokens[r]` at position
    /// `positions[r]` of row `r`. Appends the tokens' keys and values to `cache`.
    ///
    /// # Shapes
    /// - `tokens`, `positions`: `[n]` with `n = cache.rows()` → `[n · vocab]`.
    pub fn decode_step(
        &self,
        cache: &mut HostKvCache,
        tokens: &[u32],
        positions: &[usize],
    ) -> Result<Vec<f32>> {
        // A step runs ~150 parallel sections (the products, the attention). Called from outside
        // the thread pool, each would wake the pool and put this thread to sleep; run from a
        // worker, they split among busy workers instead.
        if rayon::current_thread_index().is_none() {
            return rayon::scope(|_| self.decode_step_here(cache, tokens, positions));
        }
        self.decode_step_here(cache, tokens, positions)
    }

    fn decode_step_here(
        &self,
        cache: &mut HostKvCache,
        tokens: &[u32],
        positions: &[usize],
    ) -> Result<Vec<f32>> {
        let n = tokens.len();
        if n != cache.rows.len() || positions.len() != n {
            return Err(ModelError::Input(format!(
                "decode step: {n} tokens and {} positions for a cache of {} rows",
                positions.len(),
                cache.rows.len()
            )));
        }
        let vocab = self.head.out_features();
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(ModelError::Input(format!(
                "token id {t} is outside the vocabulary of {vocab}"
            )));
        }
        let (h, kvh, hd) = (self.heads, self.kv_heads, self.head_dim);
        let (nq, nkv) = (h * hd, kvh * hd);
        let mut x = Vec::with_capacity(n * self.norm.gamma.len());
        for &t in tokens {
            self.embed_into(t, &mut x);
        }
        let tables: Vec<(Vec<f32>, Vec<f32>)> =
            positions.iter().map(|&p| self.rope_table(p)).collect();
        for (i, layer) in self.layers.iter().enumerate() {
            let mut qkv = layer.qkv.matmul(&layer.input_norm.applied(&x));
            add_bias(&mut qkv, layer.qkv_bias.as_ref());
            let mut attn = vec![0f32; n * nq];
            cache
                .rows
                .par_iter_mut()
                .zip(qkv.par_chunks_mut(nq + 2 * nkv))
                .zip(attn.par_chunks_mut(nq))
                .zip(&tables)
                .for_each(|(((row, qkv), out), table)| {
                    let step = RowStep {
                        qk_norm: layer.qk_norm.as_ref(),
                        table,
                        layer: i,
                        dims: (h, kvh, hd),
                    };
                    #[cfg(target_arch = "x86_64")]
                    if kernels_available() {
                        // SAFETY: the kernels are available only where the CPU has AVX-512F.
                        unsafe { step.run_avx512(row, qkv, out) };
                        return;
                    }
                    step.run(row, qkv, out);
                });
            let mut o = layer.o.matmul(&attn);
            add_bias(&mut o, layer.o_bias.as_ref());
            x.iter_mut().zip(&o).for_each(|(x, o)| *x += o);
            let mut gu = layer.gate_up.matmul(&layer.post_norm.applied(&x));
            add_bias(&mut gu, layer.gate_up_bias.as_ref());
            let inter = layer.down.in_features();
            // SiLU(gate) · up, a row per task: its `exp`s are a step's largest serial part.
            let mut act = vec![0f32; n * inter];
            act.par_chunks_mut(inter)
                .zip(gu.par_chunks(2 * inter))
                .for_each(|(a, row)| {
                    let (g, u) = row.split_at(inter);
                    for ((a, &g), &u) in a.iter_mut().zip(g).zip(u) {
                        *a = g / (1.0 + (-g).exp()) * u;
                    }
                });
            let mut down = layer.down.matmul(&act);
            add_bias(&mut down, layer.down_bias.as_ref());
            x.iter_mut().zip(&down).for_each(|(x, d)| *x += d);
        }
        self.norm.apply(&mut x);
        let mut logits = self.head.matmul(&x);
        add_bias(&mut logits, self.head_bias.as_ref());
        Ok(logits)
    }

    /// RoPE's `cos` and `sin` at position `pos` (`head_dim / 2` each).
    fn rope_table(&self, pos: usize) -> (Vec<f32>, Vec<f32>) {
        let p = pos as f32;
        self.inv_freq
            .iter()
            .map(|&f| ((p * f).cos(), (p * f).sin()))
            .unzip()
    }
}

/// Keys and values of a decode batch in host memory, for [`HostWeights::decode_step`]; made from
/// a prefilled [`KvCache`] with [`KvCache::to_host`].
#[derive(Debug, Clone, Default)]
pub struct HostKvCache {
    rows: Vec<HostKvRow>,
}

/// One sequence's cache.
#[derive(Debug, Clone)]
struct HostKvRow {
    /// First real position (earlier ones are left padding).
    start: usize,
    /// Per layer, keys and values `[len, kvh · hd]` (keys after RoPE).
    layers: Vec<(Vec<f32>, Vec<f32>)>,
}

impl HostKvCache {
    /// Number of rows (sequences).
    pub fn rows(&self) -> usize {
        self.rows.len()
    }

    /// Keeps only the rows `rows`, in that order (a row listed twice is copied).
    pub fn select_rows(&mut self, rows: &[usize]) {
        self.rows = rows.iter().map(|&r| self.rows[r].clone()).collect();
    }
}

impl KvCache {
    /// This cache in host memory, for [`HostWeights::decode_step`]. Fails when a row's padding
    /// is not all on its left (the only layout the sampler makes).
    pub fn to_host(&self) -> Result<HostKvCache> {
        let Some(mask) = self.mask.clone() else {
            return Err(ModelError::Input(
                "an empty cache: prefill the prompts before moving the cache to the host".into(),
            ));
        };
        let [b, total] = mask.dims();
        let mask: Vec<i64> = mask
            .into_data()
            .convert::<i64>()
            .try_into_vec::<i64>()
            .map_err(|e| ModelError::Input(format!("cache mask to host: {e:?}")))?;
        let mut rows: Vec<HostKvRow> = (0..b)
            .map(|r| {
                let m = &mask[r * total..(r + 1) * total];
                let start = m.iter().take_while(|&&v| v == 0).count();
                if m[start..].contains(&0) {
                    return Err(ModelError::Input(format!(
                        "cache row {r} has padding after its first token"
                    )));
                }
                Ok(HostKvRow {
                    start,
                    layers: Vec::with_capacity(self.layers.len()),
                })
            })
            .collect::<Result<_>>()?;
        for layer in &self.layers {
            let Some((k, v)) = layer.clone() else {
                return Err(ModelError::Input("a cache layer was never filled".into()));
            };
            // `[b, kvh, len, hd]` → per row `[len, kvh · hd]`.
            let to_rows = |t: Tensor<4>| -> Result<Vec<Vec<f32>>> {
                let [_, kvh, len, hd] = t.dims();
                let flat = host_vec(t.swap_dims(1, 2))?;
                Ok(flat.chunks(len * kvh * hd).map(<[f32]>::to_vec).collect())
            };
            for ((row, k), v) in rows.iter_mut().zip(to_rows(k)?).zip(to_rows(v)?) {
                row.layers.push((k, v));
            }
        }
        Ok(HostKvCache { rows })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ForwardInput, TransformerConfig};
    use burn::tensor::{Int, TensorData};

    fn ids(v: Vec<i64>, b: usize, l: usize, device: &Device) -> Tensor<2, Int> {
        Tensor::from_data(TensorData::new(v, [b, l]), device)
    }

    /// A tiny model with every optional part the host step handles: biases, per-head q/k norms,
    /// grouped-query attention, tied or untied head.
    fn tiny(tied: bool, device: &Device) -> Transformer {
        TransformerConfig::new(40, 32, 48, 2, 4, 2, 8)
            .with_attention_bias(true)
            .with_qk_norm(true)
            .with_tie_word_embeddings(tied)
            .init_seeded(device, 11)
    }

    /// One decode step of `tokens` at `positions` on the backend (`cache`) and on the host
    /// (`host_cache`): the largest logit difference.
    fn step_both(
        model: &Transformer,
        host: &HostWeights,
        (cache, host_cache): (&mut KvCache, &mut HostKvCache),
        tokens: &[u32],
        positions: &[usize],
    ) -> f32 {
        let (n, device) = (tokens.len(), model.embed_tokens.weight.device());
        let input = ForwardInput {
            input_ids: ids(tokens.iter().map(|&t| t as i64).collect(), n, 1, &device),
            position_ids: ids(positions.iter().map(|&p| p as i64).collect(), n, 1, &device),
            attention_mask: None,
            segment_ids: None,
            prefix_ids: None,
        };
        let want = host_vec(model.forward_cached(&input, cache)).expect("logits");
        let got = host
            .decode_step(host_cache, tokens, positions)
            .expect("step");
        got.iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max)
    }

    #[test]
    fn host_steps_match_the_backend_with_padding_and_repeated_rows() {
        let device = Device::flex();
        for tied in [true, false] {
            let model = tiny(tied, &device);
            let host = HostWeights::new(&model).expect("host copies");
            // Two prompts, the second left-padded by two positions.
            let prompt = ForwardInput {
                input_ids: ids(vec![3, 9, 4, 1, 0, 0, 7, 2], 2, 4, &device),
                position_ids: ids(vec![0, 1, 2, 3, 0, 0, 0, 1], 2, 4, &device),
                attention_mask: Some(ids(vec![1, 1, 1, 1, 0, 0, 1, 1], 2, 4, &device)),
                segment_ids: None,
                prefix_ids: None,
            };
            let mut cache = KvCache::new();
            let _ = model.forward_cached(&prompt, &mut cache);
            // Row 1 twice, then row 0 (a prompt sampled several times).
            let order = [1, 1, 0];
            cache.select_rows(&order);
            let mut host_cache = cache.to_host().expect("left padding only");
            assert_eq!(host_cache.rows(), 3);
            let mut positions = vec![2usize, 2, 4];
            for step in 0..3u32 {
                let tokens = [5 + step, 11 + step, 20 + step];
                let caches = (&mut cache, &mut host_cache);
                let diff = step_both(&model, &host, caches, &tokens, &positions);
                assert!(diff < 1e-5, "tied {tied}, step {step}: max |Δlogit| {diff}");
                positions.iter_mut().for_each(|p| *p += 1);
            }
            // Dropping a row keeps the others' caches.
            host_cache.select_rows(&[2, 0]);
            cache.select_rows(&[2, 0]);
            let caches = (&mut cache, &mut host_cache);
            let diff = step_both(&model, &host, caches, &[1, 2], &[7, 5]);
            assert!(diff < 1e-5, "tied {tied}, after dropping a row: {diff}");
        }
    }

    #[test]
    fn bad_steps_and_caches_are_rejected() {
        let device = Device::flex();
        let model = tiny(true, &device);
        let host = HostWeights::new(&model).expect("host copies");
        let empty = KvCache::new().to_host().expect_err("nothing prefilled");
        assert!(empty.to_string().contains("prefill"), "{empty}");
        // Padding after a real token cannot be kept as a start offset.
        let mut cache = KvCache::new();
        let holes = ForwardInput {
            input_ids: ids(vec![3, 9, 4], 1, 3, &device),
            position_ids: ids(vec![0, 1, 2], 1, 3, &device),
            attention_mask: Some(ids(vec![1, 0, 1], 1, 3, &device)),
            segment_ids: None,
            prefix_ids: None,
        };
        let _ = model.forward_cached(&holes, &mut cache);
        let err = cache.to_host().expect_err("hole in the mask");
        assert!(err.to_string().contains("padding after"), "{err}");
        let mut cache = KvCache::new();
        let _ = model.forward_cached(
            &ForwardInput::new(ids(vec![3, 9], 1, 2, &device)),
            &mut cache,
        );
        let mut hc = cache.to_host().expect("prefilled");
        let err = host
            .decode_step(&mut hc, &[1, 2], &[2, 2])
            .expect_err("two tokens, one row");
        assert!(err.to_string().contains("2 tokens"), "{err}");
        let err = host
            .decode_step(&mut hc, &[400], &[2])
            .expect_err("outside the vocabulary");
        assert!(err.to_string().contains("vocabulary"), "{err}");
    }
}
