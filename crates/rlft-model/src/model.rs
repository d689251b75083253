//! The decoder-only transformer (Llama family): RMSNorm, RoPE, grouped-query attention, SwiGLU.

use burn::module::Module;
use burn::nn::{Embedding, Linear, RmsNorm};
use burn::tensor::activation::{silu, softmax};
use burn::tensor::{Bool, Int, Tensor};

/// One attention block's projections.
#[derive(Module, Debug)]
pub struct Attention {
    /// Query projection `d → H·hd`.
    pub q_proj: Linear,
    /// Key projection `d → KVH·hd`.
    pub k_proj: Linear,
    /// Value projection `d → KVH·hd`.
    pub v_proj: Linear,
    /// Output projection `H·hd → d`.
    pub o_proj: Linear,
    /// Per-head query RMSNorm (Qwen3).
    pub q_norm: Option<RmsNorm>,
    /// Per-head key RMSNorm (Qwen3).
    pub k_norm: Option<RmsNorm>,
}

/// SwiGLU feed-forward: `down(silu(gate(x)) · up(x))`.
#[derive(Module, Debug)]
pub struct Mlp {
    /// Gate projection.
    pub gate_proj: Linear,
    /// Up projection.
    pub up_proj: Linear,
    /// Down projection.
    pub down_proj: Linear,
}

/// Pre-norm decoder layer.
#[derive(Module, Debug)]
pub struct DecoderLayer {
    /// Norm before attention.
    pub input_layernorm: RmsNorm,
    /// Attention.
    pub self_attn: Attention,
    /// Norm before the MLP.
    pub post_attention_layernorm: RmsNorm,
    /// MLP.
    pub mlp: Mlp,
}

/// Llama-family causal language model.
#[derive(Module, Debug)]
pub struct Transformer {
    /// Token embedding `[vocab, d]`.
    pub embed_tokens: Embedding,
    /// Decoder layers.
    pub layers: Vec<DecoderLayer>,
    /// Final norm.
    pub norm: RmsNorm,
    /// Output head (None: tied to the embedding).
    pub lm_head: Option<Linear>,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads.
    pub num_kv_heads: usize,
    /// Head width.
    pub head_dim: usize,
    /// RoPE inverse frequencies (`head_dim / 2` values, Llama 3 scaling applied).
    pub rope_inv_freq: Vec<f64>,
}

/// Inputs of one forward pass.
#[derive(Debug, Clone)]
pub struct ForwardInput {
    /// Token ids `[batch, L]`.
    pub input_ids: Tensor<2, Int>,
    /// Position of each token `[batch, L]` (per row, so left-padded rows start at 0 at their
    /// first real token).
    pub position_ids: Tensor<2, Int>,
    /// `1` for real tokens, `0` for padding, `[batch, L]`.
    pub attention_mask: Option<Tensor<2, Int>>,
    /// Several sequences packed into one row: each token's sequence id, `[batch, L]`; a token
    /// attends only to earlier tokens with the same id. `None`: one sequence per row. Only for
    /// passes without a KV cache.
    pub segment_ids: Option<Tensor<2, Int>>,
    /// With `segment_ids`: a second sequence id per token, whose earlier tokens it may also
    /// attend to — the prompt that several packed responses share, laid out once before them.
    /// `None`: each token sees its own sequence only.
    pub prefix_ids: Option<Tensor<2, Int>>,
}

impl ForwardInput {
    /// Unpadded rows: positions `0..L`, no mask.
    pub fn new(input_ids: Tensor<2, Int>) -> Self {
        let [b, l] = input_ids.dims();
        let pos = Tensor::<1, Int>::arange(0..l as i64, &input_ids.device())
            .unsqueeze::<2>()
            .expand([b, l]);
        Self {
            input_ids,
            position_ids: pos,
            attention_mask: None,
            segment_ids: None,
            prefix_ids: None,
        }
    }
}

impl Transformer {
    /// Final hidden states `[batch, L, d]` (after the last norm).
    pub fn hidden_states(&self, input: &ForwardInput) -> Tensor<3> {
        self.hidden_states_cached(input, None)
    }

    /// Logits `[batch, L, vocab]`.
    pub fn forward(&self, input: &ForwardInput) -> Tensor<3> {
        self.logits(self.hidden_states(input))
    }

    /// Logits `[batch, len, vocab]` at positions `start..start + len` only. The output head (a
    /// `d × vocab` product per position, a fifth of SmolLM2's forward FLOPs) is skipped at every
    /// other position (for scattered positions, e.g. packed rows, see
    /// [`Transformer::forward_at`]).
    ///
    /// # Shapes
    /// - input ids `[batch, L]` → `[batch, len, vocab]`, with `start + len ≤ L`.
    pub fn forward_positions(&self, input: &ForwardInput, start: usize, len: usize) -> Tensor<3> {
        self.logits(self.hidden_states(input).narrow(1, start, len))
    }

    /// Logits `[batch, L_new, vocab]` for new tokens, attending to everything in `cache` and
    /// appending the new keys and values to it. `input.attention_mask` (if any) covers the new
    /// tokens only; the cache remembers the mask of earlier ones. Decoding step by step gives the
    /// same logits as one full forward pass.
    pub fn forward_cached(&self, input: &ForwardInput, cache: &mut KvCache) -> Tensor<3> {
        self.logits(self.hidden_states_cached(input, Some(cache)))
    }

    /// Logits `[1, n, vocab]` at `n` positions of the pass, given as indices into its `batch·L`
    /// positions flattened row by row. The output head runs at those positions only (a learner
    /// needs logits where response tokens are predicted, wherever the layout put them).
    ///
    /// # Shapes
    /// - input ids `[batch, L]`, `positions` `[n]` with values `< batch·L` → `[1, n, vocab]`.
    pub fn forward_at(&self, input: &ForwardInput, positions: Tensor<1, Int>) -> Tensor<3> {
        let h = self.hidden_states(input);
        let [b, l, d] = h.dims();
        self.logits(h.reshape([b * l, d]).select(0, positions).unsqueeze::<3>())
    }

    /// Final hidden states `[n, d]` at `n` positions of the pass, given as in
    /// [`Transformer::forward_at`]; [`Transformer::output_head`] turns them into logits. A
    /// learner that runs the head in chunks (to bound the `[n, vocab]` memory) starts here.
    pub fn hidden_at(&self, input: &ForwardInput, positions: Tensor<1, Int>) -> Tensor<2> {
        let h = self.hidden_states(input);
        let [b, l, d] = h.dims();
        h.reshape([b * l, d]).select(0, positions)
    }

    /// The output head: logits `[batch, len, vocab]` from final hidden states `[batch, len, d]`.
    pub fn output_head(&self, h: Tensor<3>) -> Tensor<3> {
        self.logits(h)
    }

    fn logits(&self, h: Tensor<3>) -> Tensor<3> {
        match &self.lm_head {
            Some(head) => head.forward(h),
            None => {
                let [b, l, d] = h.dims();
                let w = self.embed_tokens.weight.val();
                let v = w.dims()[0];
                let rows = h.reshape([b * l, d]);
                // One `[b·l, d]` product, not a batched one against a broadcast weight: the
                // backward pass of a broadcast operand builds a `[b, d, vocab]` gradient and
                // sums it over `b`.
                let logits = if b * l <= 64 {
                    // Few rows (decoding): `W·hᵀ` reads the `[vocab, d]` embedding in place;
                    // `h·Wᵀ` would copy a transposed `[d, vocab]` matrix on every step.
                    w.matmul(rows.transpose()).transpose()
                } else {
                    rows.matmul(w.transpose())
                };
                logits.reshape([b, l, v])
            }
        }
    }

    fn hidden_states_cached(
        &self,
        input: &ForwardInput,
        mut cache: Option<&mut KvCache>,
    ) -> Tensor<3> {
        let [b, l] = input.input_ids.dims();
        let device = input.input_ids.device();
        let mut x = self.embed_tokens.forward(input.input_ids.clone());
        let (cos, sin) = rope_tables(&self.rope_inv_freq, &input.position_ids, x.dtype());
        let past = cache.as_ref().map_or(0, |c| c.len);
        let total = past + l;
        // Key padding over all keys so far (true = masked), `[b, 1, 1, total]`.
        let new_mask = input
            .attention_mask
            .clone()
            .unwrap_or_else(|| Tensor::<2, Int>::ones([b, l], &device));
        let key_mask = match cache.as_mut().and_then(|c| c.mask.take()) {
            Some(old) => Tensor::cat(vec![old, new_mask], 1),
            None => new_mask,
        };
        // Causal mask aligned bottom-right: query i sees keys j <= past + i.
        let causal = Tensor::<2, Bool>::tril_mask([l, total], past as i64, &device)
            .unsqueeze::<4>()
            .expand([b, 1, l, total]);
        let pad = key_mask
            .clone()
            .equal_elem(0)
            .unsqueeze_dim::<3>(1)
            .unsqueeze_dim::<4>(1);
        let mut mask = causal.bool_or(pad.expand([b, 1, l, total]));
        if let Some(seg) = input.segment_ids.as_ref().filter(|_| past == 0) {
            // Packed sequences: no attention across sequence boundaries.
            let keys = seg.clone().unsqueeze_dim::<3>(1).expand([b, l, l]);
            let query = |ids: &Tensor<2, Int>| ids.clone().unsqueeze_dim::<3>(2).expand([b, l, l]);
            let mut other = query(seg).not_equal(keys.clone());
            if let Some(prefix) = &input.prefix_ids {
                // ... except into the shared prefix a query names.
                other = other.bool_and(query(prefix).not_equal(keys));
            }
            mask = mask.bool_or(other.unsqueeze_dim::<4>(1));
        }
        if let Some(c) = cache.as_mut() {
            c.mask = Some(key_mask);
            c.len = total;
            c.layers.resize_with(self.layers.len(), || None);
        }
        for (i, layer) in self.layers.iter().enumerate() {
            let h = layer.input_layernorm.forward(x.clone());
            let slot = cache.as_mut().and_then(|c| c.layers.get_mut(i));
            let h = self.attention(&layer.self_attn, h, (&cos, &sin), &mask, slot);
            x = x + h;
            let h = layer.post_attention_layernorm.forward(x.clone());
            let m = &layer.mlp;
            let h = m
                .down_proj
                .forward(silu(m.gate_proj.forward(h.clone())) * m.up_proj.forward(h));
            x = x + h;
        }
        self.norm.forward(x)
    }

    fn attention(
        &self,
        attn: &Attention,
        x: Tensor<3>,
        (cos, sin): (&Tensor<4>, &Tensor<4>),
        mask: &Tensor<4, Bool>,
        cache: Option<&mut Option<(Tensor<4>, Tensor<4>)>>,
    ) -> Tensor<3> {
        let [b, l, _] = x.dims();
        let (h, kvh, hd) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let q = attn.q_proj.forward(x.clone());
        let k = attn.k_proj.forward(x.clone());
        let v = attn.v_proj.forward(x);
        let split = |t: Tensor<3>, n: usize| t.reshape([b, l, n, hd]).swap_dims(1, 2);
        let mut q = split(q, h);
        let mut k = split(k, kvh);
        let mut v = split(v, kvh);
        if let (Some(qn), Some(kn)) = (&attn.q_norm, &attn.k_norm) {
            q = qn.forward(q);
            k = kn.forward(k);
        }
        let q = apply_rope(q, cos, sin);
        k = apply_rope(k, cos, sin);
        if let Some(slot) = cache {
            if let Some((pk, pv)) = slot.take() {
                k = Tensor::cat(vec![pk, k], 2);
                v = Tensor::cat(vec![pv, v], 2);
            }
            *slot = Some((k.clone(), v.clone()));
        }
        // Grouped-query attention without repeating K/V: the `n = h / kvh` query heads that
        // share a key/value head are stacked along the query axis, `[b, kvh, n·l, hd]`.
        let n = h / kvh;
        let lk = k.dims()[2];
        let q = q.reshape([b, kvh, n * l, hd]);
        let scores = q.matmul(k.swap_dims(2, 3)) * (1.0 / (hd as f64).sqrt());
        let scores = scores
            .reshape([b, h, l, lk])
            .mask_fill(mask.clone().expand([b, h, l, lk]), -1e9);
        let probs = softmax(scores, 3).reshape([b, kvh, n * l, lk]);
        let out = probs
            .matmul(v)
            .reshape([b, h, l, hd])
            .swap_dims(1, 2)
            .reshape([b, l, h * hd]);
        attn.o_proj.forward(out)
    }
}

/// Keys and values of earlier tokens, per layer, for incremental decoding (rows may be
/// left-padded: the cache keeps their attention mask).
#[derive(Debug, Clone, Default)]
pub struct KvCache {
    len: usize,
    pub(crate) layers: Vec<Option<(Tensor<4>, Tensor<4>)>>,
    /// `1` for real keys, `0` for padding, `[batch, len]`.
    pub(crate) mask: Option<Tensor<2, Int>>,
}

impl KvCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of cached positions.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is cached yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keeps only the batch rows `rows` (in that order), e.g. to drop finished sequences from a
    /// batched decode so they stop costing compute. A row listed twice is copied (a prompt
    /// prefilled once, then decoded several times).
    pub fn select_rows(&mut self, rows: &[usize]) {
        let Some(mask) = self.mask.take() else {
            return;
        };
        let device = mask.device();
        let idx = Tensor::<1, Int>::from_data(
            burn::tensor::TensorData::new(
                rows.iter().map(|&r| r as i64).collect::<Vec<_>>(),
                [rows.len()],
            ),
            &device,
        );
        self.mask = Some(mask.select(0, idx.clone()));
        for (k, v) in self.layers.iter_mut().flatten() {
            *k = k.clone().select(0, idx.clone());
            *v = v.clone().select(0, idx.clone());
        }
    }
}

/// `cos` and `sin` tables `[batch, 1, L, hd]` for the given positions.
fn rope_tables(
    inv_freq: &[f64],
    positions: &Tensor<2, Int>,
    dtype: burn::tensor::DType,
) -> (Tensor<4>, Tensor<4>) {
    let device = positions.device();
    let inv: Vec<f32> = inv_freq.iter().map(|f| *f as f32).collect();
    let half = inv.len();
    let inv = Tensor::<1>::from_data(burn::tensor::TensorData::new(inv, [half]), &device)
        .reshape([1, 1, half]);
    let [b, l] = positions.dims();
    let freqs = positions.clone().float().reshape([b, l, 1]) * inv;
    let emb = Tensor::cat(vec![freqs.clone(), freqs], 2).unsqueeze_dim::<4>(1);
    (emb.clone().cos().cast(dtype), emb.sin().cast(dtype))
}

/// HF's `rotate_half` RoPE: `x·cos + rotate_half(x)·sin`.
fn apply_rope(x: Tensor<4>, cos: &Tensor<4>, sin: &Tensor<4>) -> Tensor<4> {
    let [_, _, _, hd] = x.dims();
    let x1 = x.clone().narrow(3, 0, hd / 2);
    let x2 = x.clone().narrow(3, hd / 2, hd / 2);
    let rotated = Tensor::cat(vec![x2.neg(), x1], 3);
    x * cos.clone() + rotated * sin.clone()
}

impl Transformer {
    /// A frozen copy for the reference policy `π_ref`: no autodiff, untouched by later optimiser
    /// steps on `self`, placed on `device` (which may differ from the policy's).
    pub fn reference_copy(&self, device: &burn::tensor::Device) -> Transformer {
        self.valid().to_device(device)
    }

    /// Model width `d`.
    pub fn hidden_size(&self) -> usize {
        self.embed_tokens.weight.dims()[1]
    }
}

/// A critic for PPO: the transformer trunk plus a scalar head on each position's final hidden
/// state.
#[derive(Module, Debug)]
pub struct ValueModel {
    /// The transformer trunk (its `lm_head` is unused).
    pub trunk: Transformer,
    /// `d → 1` value head.
    pub value_head: Linear,
}

impl ValueModel {
    /// Puts a freshly initialised value head (N(0, 1/(d+1)) weights, zero bias) on `trunk`.
    pub fn from_trunk(trunk: Transformer, device: &burn::tensor::Device) -> Self {
        let d = trunk.hidden_size();
        let value_head = burn::nn::LinearConfig::new(d, 1)
            .with_initializer(burn::nn::Initializer::Normal {
                mean: 0.0,
                std: 1.0 / ((d + 1) as f64).sqrt(),
            })
            .init(device);
        let value_head = Linear {
            bias: value_head.bias.map(|b| b.map(|t| t.zeros_like())),
            ..value_head
        };
        Self { trunk, value_head }
    }

    /// Values `[batch, L]`, one per position.
    pub fn forward(&self, input: &ForwardInput) -> Tensor<2> {
        self.value_head
            .forward(self.trunk.hidden_states(input))
            .squeeze_dim::<2>(2)
    }
}
