//! The decoder-only transformer of every supported family: RMSNorm, RoPE (per layer type,
//! partial), grouped-query attention (sliding windows, soft-caps), gated MLPs or mixtures of
//! experts, and the families' embedding and logit scales.

use crate::layers::LinearRows;
pub use crate::layers::{Attention, DecoderLayer, FeedForward, Mlp, Norm, Routing, SparseMoe};
use burn::module::{Module, ModuleMapper, Param};
use burn::nn::{Embedding, Linear};
use burn::tensor::{Bool, DType, FloatDType, Int, Tensor};

/// The attention mask of each sliding window `w` of a pass.
type WindowMasks = Vec<(usize, Tensor<4, Bool>)>;

/// A decoder-only causal language model.
#[derive(Module, Debug)]
pub struct Transformer {
    /// Token embedding `[vocab, d]`.
    pub embed_tokens: Embedding,
    /// Decoder layers.
    pub layers: Vec<DecoderLayer>,
    /// Final norm.
    pub norm: Norm,
    /// Output head (None: tied to the embedding).
    pub lm_head: Option<Linear>,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads.
    pub num_kv_heads: usize,
    /// Head width.
    pub head_dim: usize,
    /// RoPE inverse frequencies (`r / 2` values for the `r` rotating dims of a head, scaling
    /// applied).
    pub rope_inv_freq: Vec<f64>,
    /// RoPE inverse frequencies of layers with [`Attention::local_rope`] (Gemma 3's sliding
    /// layers).
    pub local_rope_inv_freq: Option<Vec<f64>>,
    /// Input embeddings are multiplied by this (Gemma: √d; Granite).
    pub embedding_multiplier: f64,
    /// Logits `z ← c·tanh(z/c)` (Gemma 2/3).
    pub final_logit_softcapping: Option<f64>,
    /// Logits are divided by this (Granite).
    pub logits_scaling: f64,
    /// The float type the forward pass computes in (f32 unless set with
    /// [`Transformer::with_compute_dtype`]). Weights in another type (f32 master weights) are
    /// cast at the start of each pass, inside the autodiff graph, so gradients reach them in
    /// their own type; logits always come out in f32.
    #[module(skip)]
    pub compute_dtype: FloatDType,
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

/// Casts every float parameter to a type, inside the autodiff graph (the result is not a set of
/// new leaves: gradients flow back to the original parameters).
struct CastParams(FloatDType);

impl ModuleMapper for CastParams {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let dtype = self.0;
        param.map(|t| t.cast(dtype))
    }
}

impl Transformer {
    /// The model computing its forward passes in `dtype` (see [`Transformer::compute_dtype`]);
    /// the weights keep their type. The device must have that arithmetic
    /// (`Device::supports_dtype`; the trainer checks `model.dtype`).
    pub fn with_compute_dtype(mut self, dtype: FloatDType) -> Self {
        self.compute_dtype = dtype;
        self
    }

    /// A copy whose weights are stored in the compute type (a frozen policy for sampling keeps
    /// half the memory and skips the per-pass cast); the same model when they already are.
    pub fn cast_to_compute_dtype(self) -> Self {
        if self.weights_in_compute_dtype() {
            return self;
        }
        let dtype = self.compute_dtype;
        self.map(&mut CastParams(dtype))
    }

    /// Whether the weights are stored in the compute type (no cast per pass).
    pub fn weights_in_compute_dtype(&self) -> bool {
        self.embed_tokens.weight.val().dtype() == DType::from(self.compute_dtype)
    }

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

    /// Logits `[batch, 1, vocab]` at the last position of a cached pass, the cache filled as
    /// [`Transformer::forward_cached`] fills it: what a sampler needs after prefilling
    /// left-padded prompts (the output head runs at one position per row, not at every prompt
    /// token).
    pub fn forward_cached_last(&self, input: &ForwardInput, cache: &mut KvCache) -> Tensor<3> {
        self.last_logits(self.hidden_states_cached(input, Some(cache)))
    }

    /// Logits `[batch, 1, vocab]` at the last position of hidden states `[batch, L, d]`.
    fn last_logits(&self, h: Tensor<3>) -> Tensor<3> {
        let l = h.dims()[1];
        self.logits(h.narrow(1, l - 1, 1))
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

    /// Logits in f32 from hidden states in the compute type (the head's weights cast to it),
    /// with the family's scale and soft-cap.
    fn logits(&self, h: Tensor<3>) -> Tensor<3> {
        let mut logits = self.raw_logits(h);
        if self.logits_scaling != 1.0 {
            logits = logits.div_scalar(self.logits_scaling);
        }
        if let Some(c) = self.final_logit_softcapping {
            logits = logits.div_scalar(c).tanh().mul_scalar(c);
        }
        logits
    }

    /// The output head's product alone.
    fn raw_logits(&self, h: Tensor<3>) -> Tensor<3> {
        let dtype = self.compute_dtype;
        let h = h.cast(dtype);
        let logits = match &self.lm_head {
            Some(head) if self.weights_in_compute_dtype() => head.forward_rows(h),
            Some(head) => head.clone().map(&mut CastParams(dtype)).forward_rows(h),
            None => {
                let [b, l, d] = h.dims();
                let w = self.embed_tokens.weight.val().cast(dtype);
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
        };
        logits.cast(FloatDType::F32)
    }

    fn hidden_states_cached(&self, input: &ForwardInput, cache: Option<&mut KvCache>) -> Tensor<3> {
        self.hidden_states_full(input, cache, None)
    }

    /// Whether any layer is a mixture of experts.
    pub fn is_moe(&self) -> bool {
        self.sparse_layers().next().is_some()
    }

    /// The mixture-of-experts blocks, in layer order.
    pub fn sparse_layers(&self) -> impl Iterator<Item = &SparseMoe> {
        self.layers.iter().filter_map(|l| l.mlp.experts())
    }

    /// Final hidden states `[batch, L, d]` and the routing of each sparse layer (in layer
    /// order: one [`Routing`] over the pass's `batch·L` tokens). With `replay` (one routing per
    /// sparse layer), every token goes to the recorded experts, weighted by the current
    /// router's probabilities of them (router replay); the routing returned is then the
    /// router's own top-k, to compare with the record.
    ///
    /// # Panics
    /// When `replay` does not hold one routing of `batch·L` tokens per sparse layer.
    pub fn hidden_states_routed(
        &self,
        input: &ForwardInput,
        replay: Option<&[Routing]>,
    ) -> (Tensor<3>, Vec<Routing>) {
        let mut routes = Routes::new(replay);
        let h = self.hidden_states_full(input, None, Some(&mut routes));
        (h, routes.own)
    }

    /// Final hidden states `[n, d]` at `n` positions (as [`Transformer::hidden_at`]), routed
    /// as [`Transformer::hidden_states_routed`] routes, and what every sparse layer did.
    pub fn hidden_at_traced(
        &self,
        input: &ForwardInput,
        positions: Tensor<1, Int>,
        replay: Option<&[Routing]>,
    ) -> (Tensor<2>, RouterTrace) {
        let mut routes = Routes::new(replay);
        let h = self.hidden_states_full(input, None, Some(&mut routes));
        let [b, l, d] = h.dims();
        let trace = RouterTrace {
            own: routes.own,
            used: routes.used,
            probs: routes.probs,
        };
        (h.reshape([b * l, d]).select(0, positions), trace)
    }

    /// [`Transformer::forward_cached_last`] that also returns the routing of the new tokens
    /// (one [`Routing`] per sparse layer over `batch·L_new` tokens).
    pub fn forward_cached_last_routed(
        &self,
        input: &ForwardInput,
        cache: &mut KvCache,
    ) -> (Tensor<3>, Vec<Routing>) {
        let mut routes = Routes::new(None);
        let h = self.hidden_states_full(input, Some(cache), Some(&mut routes));
        (self.last_logits(h), routes.own)
    }

    /// Logits `[batch, L, vocab]` and the routing, as [`Transformer::hidden_states_routed`].
    pub fn forward_routed(
        &self,
        input: &ForwardInput,
        replay: Option<&[Routing]>,
    ) -> (Tensor<3>, Vec<Routing>) {
        let (h, routing) = self.hidden_states_routed(input, replay);
        (self.logits(h), routing)
    }

    fn hidden_states_full(
        &self,
        input: &ForwardInput,
        cache: Option<&mut KvCache>,
        routes: Option<&mut Routes<'_>>,
    ) -> Tensor<3> {
        if self.weights_in_compute_dtype() {
            self.hidden_states_in_place(input, cache, routes)
        } else {
            self.clone()
                .cast_to_compute_dtype()
                .hidden_states_in_place(input, cache, routes)
        }
    }

    /// The masks of the sliding layers, one per window `w`: `mask` plus the keys more than
    /// `w - 1` positions back in the query's own sequence; with them the positions of every
    /// key so far (taken from `cache`: only a model with windows keeps them there).
    fn window_masks(
        &self,
        input: &ForwardInput,
        mut cache: Option<&mut KvCache>,
        mask: &Tensor<4, Bool>,
    ) -> (WindowMasks, Option<Tensor<2, Int>>) {
        let [b, _, l, total] = mask.dims();
        let mut windows: WindowMasks = Vec::new();
        let mut key_positions = None;
        for w in self.layers.iter().filter_map(|l| l.self_attn.window) {
            let keys = key_positions.get_or_insert_with(|| {
                match cache.as_mut().and_then(|c| c.positions.take()) {
                    Some(old) => Tensor::cat(vec![old, input.position_ids.clone()], 1),
                    None => input.position_ids.clone(),
                }
            });
            if windows.iter().all(|(v, _)| *v != w) {
                let q = input.position_ids.clone().unsqueeze_dim::<3>(2);
                let k = keys.clone().unsqueeze_dim::<3>(1);
                let far = (q.expand([b, l, total]) - k.expand([b, l, total]))
                    .greater_equal_elem(w as i64);
                windows.push((w, mask.clone().bool_or(far.unsqueeze_dim::<4>(1))));
            }
        }
        (windows, key_positions)
    }

    /// [`Transformer::hidden_states_cached`] with the weights as they are.
    fn hidden_states_in_place(
        &self,
        input: &ForwardInput,
        mut cache: Option<&mut KvCache>,
        mut routes: Option<&mut Routes<'_>>,
    ) -> Tensor<3> {
        let [b, l] = input.input_ids.dims();
        let device = input.input_ids.device();
        let mut x = self.embed_tokens.forward(input.input_ids.clone());
        if self.embedding_multiplier != 1.0 {
            x = x.mul_scalar(self.embedding_multiplier);
        }
        let global = rope_tables(&self.rope_inv_freq, &input.position_ids, x.dtype());
        let local = self
            .local_rope_inv_freq
            .as_ref()
            .map(|f| rope_tables(f, &input.position_ids, x.dtype()));
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
        // Every query sees its own key, padding included: no row of scores is masked whole, so
        // masked scores can be -inf (a padding query's output is never read).
        let not_own = Tensor::<2, Bool>::diag_mask([l, total], past as i64, &device)
            .unsqueeze::<4>()
            .expand([b, 1, l, total]);
        mask = mask.bool_and(not_own);
        let (windows, key_positions) = self.window_masks(input, cache.as_deref_mut(), &mask);
        if let Some(c) = cache.as_mut() {
            c.mask = Some(key_mask);
            c.positions = key_positions;
            c.len = total;
            c.layers.resize_with(self.layers.len(), || None);
        }
        for (i, layer) in self.layers.iter().enumerate() {
            let slot = cache.as_mut().and_then(|c| c.layers.get_mut(i));
            let attn = &layer.self_attn;
            let (cos, sin) = match (&local, attn.local_rope) {
                (Some(t), true) => t,
                _ => &global,
            };
            let mask = match attn.window {
                Some(w) => windows
                    .iter()
                    .find(|(v, _)| *v == w)
                    .map_or(&mask, |(_, m)| m),
                None => &mask,
            };
            x = match routes.as_deref_mut() {
                Some(r) => layer.forward_ff(x, (cos, sin), mask, slot, |ff, h| r.run(ff, h)),
                None => layer.forward(x, (cos, sin), mask, slot),
            };
        }
        self.norm.forward(x)
    }
}

/// Routing records and replays of one pass ([`Transformer::hidden_states_routed`]).
struct Routes<'a> {
    replay: Option<&'a [Routing]>,
    own: Vec<Routing>,
    used: Vec<Routing>,
    probs: Vec<Tensor<2>>,
}

impl<'a> Routes<'a> {
    fn new(replay: Option<&'a [Routing]>) -> Self {
        Self {
            replay,
            own: Vec::new(),
            used: Vec::new(),
            probs: Vec::new(),
        }
    }

    /// Runs a layer's feed-forward block, replaying or recording a sparse one's routing.
    fn run(&mut self, ff: &FeedForward, h: Tensor<3>) -> Tensor<3> {
        let FeedForward::Experts(moe) = ff else {
            return ff.forward(h);
        };
        let layer = self.own.len();
        let replay = self.replay.map(|r| {
            r.get(layer)
                .expect("router replay: one recorded routing per sparse layer")
        });
        let t = moe.forward_traced(h, replay);
        self.own.push(t.own);
        self.used.push(t.used);
        self.probs.push(t.probs);
        t.output
    }
}

/// What the sparse layers of a pass did ([`Transformer::hidden_at_traced`]), one entry per
/// sparse layer in layer order, over the pass's `batch·L` tokens.
#[derive(Debug, Clone)]
pub struct RouterTrace {
    /// Each router's own top-k.
    pub own: Vec<Routing>,
    /// The experts the tokens went to (the replayed ones under replay).
    pub used: Vec<Routing>,
    /// Router probabilities `[batch·L, E]`, in the pass's autodiff graph.
    pub probs: Vec<Tensor<2>>,
}

/// Keys and values of earlier tokens, per layer, for incremental decoding (rows may be
/// left-padded: the cache keeps their attention mask).
#[derive(Debug, Clone, Default)]
pub struct KvCache {
    len: usize,
    pub(crate) layers: Vec<crate::layers::KvSlot>,
    /// `1` for real keys, `0` for padding, `[batch, len]`.
    pub(crate) mask: Option<Tensor<2, Int>>,
    /// Each key's position in its sequence, `[batch, len]` (for sliding windows).
    pub(crate) positions: Option<Tensor<2, Int>>,
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
        self.positions = self.positions.take().map(|p| p.select(0, idx.clone()));
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
        // Zeros keep the bias trainable (a new tensor is not, on an autodiff device).
        let zeros = |t: burn::tensor::Tensor<1>| match t.is_require_grad() {
            true => t.zeros_like().require_grad(),
            false => t.zeros_like(),
        };
        let value_head = Linear {
            bias: value_head.bias.map(|b| b.map(zeros)),
            ..value_head
        };
        Self { trunk, value_head }
    }

    /// Values `[batch, L]`, one per position (the head computes in f32).
    pub fn forward(&self, input: &ForwardInput) -> Tensor<2> {
        let h = self.trunk.hidden_states(input).cast(FloatDType::F32);
        self.value_head.forward_rows(h).squeeze_dim::<2>(2)
    }
}
