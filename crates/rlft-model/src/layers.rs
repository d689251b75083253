//! The decoder's building blocks in burn's idiom — `XxxConfig` → `init` → `forward` —
//! grouped-query attention with RoPE and an optional KV cache, the gated MLP, the sparse
//! mixture of experts ([`moe`]), RMSNorm ([`norm`]), and the decoder layer with its norms before,
//! around or after the sub-layers. [`crate::Transformer`] stacks them; the host decode kernels
//! ([`crate::HostWeights`]) read the same weights and are tested against these passes.
//!
//! Every block is built from a constructor of its projections (`linear(name, d_in, d_out,
//! bias)`, called q, k, v, o, then gate, up, down) and of its norms (`norm(name, width)`), with
//! the Hugging Face names relative to the layer (`self_attn.q_proj`, `mlp.down_proj`,
//! `input_layernorm`): `init` uses burn's initialisers, the loaders read the named tensors and
//! the seeded initialisation draws them in that order.

pub mod moe;
pub mod norm;
pub mod rows;

use crate::config::{Activation, NormPlacement};
use burn::config::Config;
use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::tensor::{Bool, Device, Tensor};
pub use moe::{FeedForward, MoeTrace, Routing, SparseMoe, SparseMoeConfig, TokenRouting};
pub use norm::{Norm, NormConfig};
use rlft_algo::fused::{silu_mul, softmax};
pub use rows::LinearRows;
use std::convert::Infallible;

/// One layer's cached keys and values, `[batch, kv_heads, len, head_dim]` each.
pub type KvSlot = Option<(Tensor<4>, Tensor<4>)>;

/// Settings of a grouped-query attention block.
#[derive(Config, Debug)]
pub struct AttentionConfig {
    /// Model width `d`.
    pub d_model: usize,
    /// Query heads `H`.
    pub num_heads: usize,
    /// Key/value heads (`H` must be a multiple).
    pub num_kv_heads: usize,
    /// Head width.
    pub head_dim: usize,
    /// Biases on the q/k/v projections (Qwen2).
    #[config(default = false)]
    pub bias: bool,
    /// RMSNorm on queries and keys before RoPE (Qwen3, Gemma 3: per head; OLMo 2: whole).
    #[config(default = false)]
    pub qk_norm: bool,
    /// With `qk_norm`: one norm over the whole projection (OLMo 2) instead of one per head.
    #[config(default = false)]
    pub qk_norm_whole: bool,
    /// RMSNorm epsilon.
    #[config(default = 1e-6)]
    pub rms_norm_eps: f64,
    /// Score multiplier; `None`: `1/√head_dim`.
    pub scale: Option<f64>,
    /// Score soft-cap `c·tanh(s/c)` (Gemma 2).
    pub softcap: Option<f64>,
    /// Sliding window (keys within this many positions, itself included); `None`: causal.
    pub window: Option<usize>,
    /// Uses the model's local RoPE table (Gemma 3's sliding layers).
    #[config(default = false)]
    pub local_rope: bool,
}

impl AttentionConfig {
    /// An attention block with burn's default initialisers.
    pub fn init(&self, device: &Device) -> Attention {
        let Ok(a) = self.try_init_with(&mut default_linear(device), &mut default_norm(device));
        a
    }

    /// An attention block from `linear(name, d_in, d_out, bias)` (`q_proj`, `k_proj`,
    /// `v_proj`, `o_proj`, in that order) and `norm(name, width)` (`q_norm`, `k_norm`).
    pub fn try_init_with<E>(
        &self,
        linear: &mut impl FnMut(&str, usize, usize, bool) -> Result<Linear, E>,
        norm: &mut impl FnMut(&str, usize) -> Result<Norm, E>,
    ) -> Result<Attention, E> {
        let (d, hd) = (self.d_model, self.head_dim);
        let q = self.num_heads * hd;
        let kv = self.num_kv_heads * hd;
        let (qn, kn) = if self.qk_norm_whole {
            (q, kv)
        } else {
            (hd, hd)
        };
        Ok(Attention {
            q_proj: linear("q_proj", d, q, self.bias)?,
            k_proj: linear("k_proj", d, kv, self.bias)?,
            v_proj: linear("v_proj", d, kv, self.bias)?,
            o_proj: linear("o_proj", q, d, false)?,
            q_norm: self.qk_norm.then(|| norm("q_norm", qn)).transpose()?,
            k_norm: self.qk_norm.then(|| norm("k_norm", kn)).transpose()?,
            num_heads: self.num_heads,
            num_kv_heads: self.num_kv_heads,
            head_dim: hd,
            scale: self.scale.unwrap_or(1.0 / (hd as f64).sqrt()),
            softcap: self.softcap,
            window: self.window,
            local_rope: self.local_rope,
        })
    }
}

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
    /// Query RMSNorm: per head (`[head_dim]`: Qwen3, Gemma 3) or over the whole projection
    /// (`[H·hd]`: OLMo 2).
    pub q_norm: Option<Norm>,
    /// Key RMSNorm, as `q_norm`.
    pub k_norm: Option<Norm>,
    /// Query heads.
    #[module(skip)]
    pub num_heads: usize,
    /// Key/value heads.
    #[module(skip)]
    pub num_kv_heads: usize,
    /// Head width.
    #[module(skip)]
    pub head_dim: usize,
    /// Score multiplier (`1/√head_dim` unless the family says otherwise).
    #[module(skip)]
    pub scale: f64,
    /// Score soft-cap `c·tanh(s/c)`, applied before the mask (Gemma 2).
    #[module(skip)]
    pub softcap: Option<f64>,
    /// Sliding window in positions; the caller's mask must implement it.
    #[module(skip)]
    pub window: Option<usize>,
    /// Rotates with the model's local RoPE table (Gemma 3's sliding layers).
    #[module(skip)]
    pub local_rope: bool,
}

impl Attention {
    /// Causal grouped-query attention over `x`, with RoPE tables `(cos, sin)` and `mask` (true
    /// = not attended; every query must see at least one key, or its row is NaN). With a cache `slot`, the new keys and values are appended to the
    /// cached ones and attended together.
    ///
    /// # Shapes
    /// - `x`: `[batch, L, d]`; `cos`, `sin`: `[batch, 1, L, r]` for the `r ≤ head_dim` dims
    ///   that rotate
    /// - `mask`: `[batch, 1, L, past + L]` → `[batch, L, d]`
    pub fn forward(
        &self,
        x: Tensor<3>,
        (cos, sin): (&Tensor<4>, &Tensor<4>),
        mask: &Tensor<4, Bool>,
        slot: Option<&mut KvSlot>,
    ) -> Tensor<3> {
        let [b, l, _] = x.dims();
        let (h, kvh, hd) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let mut q = self.q_proj.forward_rows(x.clone());
        let mut k = self.k_proj.forward_rows(x.clone());
        let v = self.v_proj.forward_rows(x);
        let whole = self
            .q_norm
            .as_ref()
            .is_some_and(|n| n.gamma.dims()[0] != hd);
        if whole && let (Some(qn), Some(kn)) = (&self.q_norm, &self.k_norm) {
            q = qn.forward(q);
            k = kn.forward(k);
        }
        let split = |t: Tensor<3>, n: usize| t.reshape([b, l, n, hd]).swap_dims(1, 2);
        let mut q = split(q, h);
        let mut k = split(k, kvh);
        let mut v = split(v, kvh);
        if !whole && let (Some(qn), Some(kn)) = (&self.q_norm, &self.k_norm) {
            q = qn.forward(q);
            k = kn.forward(k);
        }
        let q = apply_rope(q, cos, sin);
        k = apply_rope(k, cos, sin);
        if let Some(slot) = slot {
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
        let mut scores = q.matmul(k.swap_dims(2, 3)) * self.scale;
        if let Some(c) = self.softcap {
            scores = scores.div_scalar(c).tanh().mul_scalar(c);
        }
        // -inf: every query sees at least its own key (the model's mask guarantees it), so no
        // row is masked whole, and `exp` returns 0 for -inf at once (a large finite value
        // takes libm's slow underflow path, element by element).
        let scores = scores
            .reshape([b, h, l, lk])
            .mask_fill(mask.clone().expand([b, h, l, lk]), f32::NEG_INFINITY);
        let probs = softmax(scores, 3).reshape([b, kvh, n * l, lk]);
        let out = probs
            .matmul(v)
            .reshape([b, h, l, hd])
            .swap_dims(1, 2)
            .reshape([b, l, h * hd]);
        self.o_proj.forward_rows(out)
    }
}

/// HF's `rotate_half` RoPE on the first `r` dims (`r` = the tables' width): `x·cos +
/// rotate_half(x)·sin`; the dims after `r` pass through (partial rotary).
fn apply_rope(x: Tensor<4>, cos: &Tensor<4>, sin: &Tensor<4>) -> Tensor<4> {
    let [_, _, _, hd] = x.dims();
    let r = cos.dims()[3];
    if r < hd {
        let pass = x.clone().narrow(3, r, hd - r);
        let rot = apply_rope(x.narrow(3, 0, r), cos, sin);
        return Tensor::cat(vec![rot, pass], 3);
    }
    let x1 = x.clone().narrow(3, 0, hd / 2);
    let x2 = x.clone().narrow(3, hd / 2, hd / 2);
    let rotated = Tensor::cat(vec![x2.neg(), x1], 3);
    x * cos.clone() + rotated * sin.clone()
}

/// Settings of the gated MLP.
#[derive(Config, Debug)]
pub struct MlpConfig {
    /// Model width `d`.
    pub d_model: usize,
    /// Inner width.
    pub d_ff: usize,
    /// The gate's activation.
    #[config(default = "Activation::Silu")]
    pub activation: Activation,
}

impl MlpConfig {
    /// An MLP with burn's default initialisers.
    pub fn init(&self, device: &Device) -> Mlp {
        let Ok(m) = self.try_init_with(&mut default_linear(device));
        m
    }

    /// An MLP from `linear(name, d_in, d_out, bias)` (`gate_proj`, `up_proj`, `down_proj`, in
    /// that order).
    pub fn try_init_with<E>(
        &self,
        linear: &mut impl FnMut(&str, usize, usize, bool) -> Result<Linear, E>,
    ) -> Result<Mlp, E> {
        let (d, f) = (self.d_model, self.d_ff);
        Ok(Mlp {
            gate_proj: linear("gate_proj", d, f, false)?,
            up_proj: linear("up_proj", d, f, false)?,
            down_proj: linear("down_proj", f, d, false)?,
            activation: self.activation,
        })
    }
}

/// Gated feed-forward: `down(act(gate(x)) · up(x))` (SwiGLU, or GeGLU in Gemma).
#[derive(Module, Debug)]
pub struct Mlp {
    /// Gate projection.
    pub gate_proj: Linear,
    /// Up projection.
    pub up_proj: Linear,
    /// Down projection.
    pub down_proj: Linear,
    /// The gate's activation.
    #[module(skip)]
    pub activation: Activation,
}

impl Mlp {
    /// # Shapes
    /// - `x`: `[..., d]` → `[..., d]`
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let gate = self.gate_proj.forward_rows(x.clone());
        let up = self.up_proj.forward_rows(x);
        let hidden = match self.activation {
            Activation::Silu => silu_mul(gate, up),
            Activation::GeluTanh => gelu_tanh(gate) * up,
        };
        self.down_proj.forward_rows(hidden)
    }
}

/// GELU with the tanh approximation: `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`.
pub fn gelu_tanh<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    let c = (2.0 / std::f64::consts::PI).sqrt();
    let inner = (x.clone() + x.clone().powi_scalar(3).mul_scalar(0.044715)).mul_scalar(c);
    (inner.tanh().add_scalar(1.0) * x).mul_scalar(0.5)
}

/// Settings of a decoder layer.
#[derive(Config, Debug)]
pub struct DecoderLayerConfig {
    /// The attention block.
    pub attention: AttentionConfig,
    /// The MLP's inner width.
    pub d_ff: usize,
    /// The MLP's activation.
    #[config(default = "Activation::Silu")]
    pub activation: Activation,
    /// A mixture of experts instead of the dense MLP.
    pub moe: Option<SparseMoeConfig>,
    /// Where the norms sit.
    #[config(default = "NormPlacement::Pre")]
    pub norm_placement: NormPlacement,
    /// Sub-layer outputs are multiplied by this before the residual add (Granite).
    #[config(default = 1.0)]
    pub residual_multiplier: f64,
}

impl DecoderLayerConfig {
    /// A layer with burn's default initialisers.
    pub fn init(&self, device: &Device) -> DecoderLayer {
        let Ok(l) = self.try_init_with(&mut default_linear(device), &mut default_norm(device));
        l
    }

    /// A layer from `linear` and `norm` as the blocks take them, with names relative to the
    /// layer: `self_attn.q_proj` … `mlp.down_proj` (a mixture of experts: `mlp.gate`, then
    /// `mlp.experts.E.*`), the norms (`input_layernorm`, `post_attention_layernorm`,
    /// `pre_feedforward_layernorm`, `post_feedforward_layernorm` as the placement has them),
    /// `self_attn.q_norm`. Projections are made attention first.
    pub fn try_init_with<E>(
        &self,
        linear: &mut impl FnMut(&str, usize, usize, bool) -> Result<Linear, E>,
        norm: &mut impl FnMut(&str, usize) -> Result<Norm, E>,
    ) -> Result<DecoderLayer, E> {
        let d = self.attention.d_model;
        let self_attn = self.attention.try_init_with(
            &mut |n, i, o, b| linear(&format!("self_attn.{n}"), i, o, b),
            &mut |n, w| norm(&format!("self_attn.{n}"), w),
        )?;
        let mut mlp_linear = |n: &str, i, o, b| linear(&format!("mlp.{n}"), i, o, b);
        let mlp = match &self.moe {
            Some(moe) => FeedForward::Experts(moe.try_init_with(&mut mlp_linear)?),
            None => FeedForward::Dense(
                MlpConfig::new(d, self.d_ff)
                    .with_activation(self.activation)
                    .try_init_with(&mut mlp_linear)?,
            ),
        };
        let (input, pre_ff, post_ff) = match self.norm_placement {
            NormPlacement::Pre => (true, false, false),
            NormPlacement::Sandwich => (true, true, true),
            NormPlacement::Post => (false, false, true),
        };
        let input_layernorm = input.then(|| norm("input_layernorm", d)).transpose()?;
        let post_attention_layernorm = norm("post_attention_layernorm", d)?;
        let pre_ff = pre_ff
            .then(|| norm("pre_feedforward_layernorm", d))
            .transpose()?;
        let post_ff = post_ff
            .then(|| norm("post_feedforward_layernorm", d))
            .transpose()?;
        Ok(DecoderLayer {
            input_layernorm,
            self_attn,
            post_attention_layernorm,
            pre_feedforward_layernorm: pre_ff,
            post_feedforward_layernorm: post_ff,
            mlp,
            residual_multiplier: self.residual_multiplier,
        })
    }
}

/// A decoder layer: attention and a feed-forward block, each added to the residual stream,
/// with norms before (Llama), around (Gemma) or after (OLMo 2) them.
#[derive(Module, Debug)]
pub struct DecoderLayer {
    /// Norm before attention (absent when norms come after the sub-layers).
    pub input_layernorm: Option<Norm>,
    /// Attention.
    pub self_attn: Attention,
    /// Pre-norm layers: the norm before the MLP. Sandwich and post-norm layers: the norm on
    /// attention's output.
    pub post_attention_layernorm: Norm,
    /// Sandwich layers: the norm before the MLP.
    pub pre_feedforward_layernorm: Option<Norm>,
    /// Sandwich and post-norm layers: the norm on the MLP's output.
    pub post_feedforward_layernorm: Option<Norm>,
    /// The feed-forward block.
    pub mlp: FeedForward,
    /// Sub-layer outputs are multiplied by this before the residual add (Granite).
    #[module(skip)]
    pub residual_multiplier: f64,
}

impl DecoderLayer {
    /// Where this layer's norms sit.
    pub fn norm_placement(&self) -> NormPlacement {
        match (&self.input_layernorm, &self.pre_feedforward_layernorm) {
            (None, _) => NormPlacement::Post,
            (Some(_), Some(_)) => NormPlacement::Sandwich,
            (Some(_), None) => NormPlacement::Pre,
        }
    }

    /// `x + attn(·)`, then `+ mlp(·)`, with the norms where [`DecoderLayer::norm_placement`]
    /// puts them; arguments as [`Attention::forward`] takes them.
    ///
    /// # Shapes
    /// - `x`: `[batch, L, d]` → `[batch, L, d]`
    pub fn forward(
        &self,
        x: Tensor<3>,
        rope: (&Tensor<4>, &Tensor<4>),
        mask: &Tensor<4, Bool>,
        slot: Option<&mut KvSlot>,
    ) -> Tensor<3> {
        self.forward_ff(x, rope, mask, slot, |ff, h| ff.forward(h))
    }

    /// [`DecoderLayer::forward`] with the feed-forward block run by `ff` (a caller that
    /// records or replays a mixture of experts' routing).
    pub fn forward_ff(
        &self,
        x: Tensor<3>,
        rope: (&Tensor<4>, &Tensor<4>),
        mask: &Tensor<4, Bool>,
        slot: Option<&mut KvSlot>,
        ff: impl FnOnce(&FeedForward, Tensor<3>) -> Tensor<3>,
    ) -> Tensor<3> {
        let scaled = |t: Tensor<3>| {
            if self.residual_multiplier == 1.0 {
                t
            } else {
                t.mul_scalar(self.residual_multiplier)
            }
        };
        let attn_in = match &self.input_layernorm {
            Some(n) => n.forward(x.clone()),
            None => x.clone(),
        };
        let a = self.self_attn.forward(attn_in, rope, mask, slot);
        match self.norm_placement() {
            NormPlacement::Pre => {
                let h = x + scaled(a);
                let m = ff(&self.mlp, self.post_attention_layernorm.forward(h.clone()));
                h + scaled(m)
            }
            // Sandwich and post-norm: the attention norm sits on its output; a sandwich layer
            // also norms the MLP's input.
            NormPlacement::Sandwich | NormPlacement::Post => {
                let h = x + scaled(self.post_attention_layernorm.forward(a));
                let m_in = match &self.pre_feedforward_layernorm {
                    Some(n) => n.forward(h.clone()),
                    None => h.clone(),
                };
                let m = ff(&self.mlp, m_in);
                let m = match &self.post_feedforward_layernorm {
                    Some(n) => n.forward(m),
                    None => m,
                };
                h + scaled(m)
            }
        }
    }
}

fn default_linear(
    device: &Device,
) -> impl FnMut(&str, usize, usize, bool) -> Result<Linear, Infallible> + '_ {
    move |_, d_in, d_out, bias| Ok(LinearConfig::new(d_in, d_out).with_bias(bias).init(device))
}

fn default_norm(device: &Device) -> impl FnMut(&str, usize) -> Result<Norm, Infallible> + '_ {
    move |_, width| Ok(NormConfig::new(width).init(device))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Int;

    fn rope(b: usize, l: usize, hd: usize, device: &Device) -> (Tensor<4>, Tensor<4>) {
        let pos = Tensor::<1, Int>::arange(0..l as i64, device)
            .float()
            .reshape([1, 1, l, 1])
            .expand([b, 1, l, hd]);
        ((pos.clone() * 0.1).cos(), (pos * 0.1).sin())
    }

    /// Shapes through a GQA layer; with the output projections zeroed both residual branches
    /// add nothing, so the layer is the identity.
    #[test]
    fn a_layer_with_zero_outputs_is_the_identity() {
        let device = Device::flex();
        let cfg = DecoderLayerConfig::new(AttentionConfig::new(16, 4, 2, 4).with_qk_norm(true), 32);
        let layer = cfg.init(&device);
        assert_eq!(layer.self_attn.k_proj.weight.dims(), [16, 8]);
        assert_eq!(
            layer.mlp.dense().expect("dense").down_proj.weight.dims(),
            [32, 16]
        );
        let (b, l) = (2, 5);
        let x = Tensor::<1, Int>::arange(0..(b * l * 16) as i64, &device)
            .float()
            .reshape([b, l, 16])
            .mul_scalar(0.01)
            .sin();
        let (cos, sin) = rope(b, l, 4, &device);
        let mask = Tensor::<2, Bool>::tril_mask([l, l], 0, &device)
            .unsqueeze::<4>()
            .expand([b, 1, l, l]);
        let y = layer.forward(x.clone(), (&cos, &sin), &mask, None);
        assert_eq!(y.dims(), [b, l, 16]);
        assert!(
            (y - x.clone()).abs().max().into_scalar::<f32>() > 1e-3,
            "an initialised layer changes its input"
        );
        let zero = |l: Linear| Linear {
            weight: l.weight.map(|w| w.zeros_like()),
            bias: l.bias,
        };
        let layer = DecoderLayer {
            self_attn: Attention {
                o_proj: zero(layer.self_attn.o_proj),
                ..layer.self_attn
            },
            mlp: match layer.mlp {
                FeedForward::Dense(m) => FeedForward::Dense(Mlp {
                    down_proj: zero(m.down_proj),
                    ..m
                }),
                other => other,
            },
            ..layer
        };
        let y = layer.forward(x.clone(), (&cos, &sin), &mask, None);
        assert_eq!(
            (y - x).abs().max().into_scalar::<f32>(),
            0.0,
            "zero output projections leave the residual stream as it is"
        );
    }

    /// Decoding one token at a time through the cache gives the full pass's outputs.
    #[test]
    fn cached_steps_equal_the_full_pass() {
        let device = Device::flex();
        let attn = AttentionConfig::new(16, 4, 2, 4).init(&device);
        let (b, l) = (1, 4);
        let x = Tensor::<1, Int>::arange(0..(b * l * 16) as i64, &device)
            .float()
            .reshape([b, l, 16])
            .mul_scalar(0.1)
            .cos();
        let (cos, sin) = rope(b, l, 4, &device);
        let causal = |q: usize, k: usize, past: usize| {
            Tensor::<2, Bool>::tril_mask([q, k], past as i64, &device)
                .unsqueeze::<4>()
                .expand([b, 1, q, k])
        };
        let full = attn.forward(x.clone(), (&cos, &sin), &causal(l, l, 0), None);
        let mut slot = None;
        for t in 0..l {
            let step = |v: &Tensor<4>| v.clone().narrow(2, t, 1);
            let y = attn.forward(
                x.clone().narrow(1, t, 1),
                (&step(&cos), &step(&sin)),
                &causal(1, t + 1, t),
                Some(&mut slot),
            );
            let want = full.clone().narrow(1, t, 1);
            let diff = (y - want).abs().max().into_scalar::<f32>();
            assert!(diff < 1e-5, "position {t}: {diff}");
        }
    }
}
