//! Random initialisation of a [`Transformer`] from a [`TransformerConfig`], and the layer
//! settings both initialisation and loading build from.

use crate::TransformerConfig;
use crate::layers::{AttentionConfig, DecoderLayerConfig, Norm, NormConfig, SparseMoeConfig};
use crate::model::{DecoderLayer, Transformer};
use burn::module::Param;
use burn::nn::{Embedding, Linear};
use burn::tensor::{Device, FloatDType, Tensor, TensorData};
use rlft_algo::seed::{GOLDEN_GAMMA, SplitMix64};

impl TransformerConfig {
    /// A randomly initialised model (HF's scheme: weights N(0, 0.02), biases 0, norms 1) for
    /// training from scratch and tests; the same `seed` gives the same weights on every device
    /// (the values are drawn on the host, not from the device's shared RNG).
    pub fn init_seeded(&self, device: &Device, seed: u64) -> Transformer {
        let mut rng = SplitMix64::new(seed ^ GOLDEN_GAMMA);
        let mut uniform = move || rng.next_open01();
        let mut normal = |shape: [usize; 2]| -> Tensor<2> {
            let n = shape[0] * shape[1];
            let v: Vec<f32> = (0..n)
                .map(|_| {
                    let (u1, u2) = (uniform(), uniform());
                    (0.02 * (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos())
                        as f32
                })
                .collect();
            Tensor::from_data(TensorData::new(v, shape), device)
        };
        let mut linear = |d_in: usize, d_out: usize, bias: bool| Linear {
            weight: Param::from_tensor(normal([d_in, d_out])),
            bias: bias.then(|| Param::from_tensor(Tensor::zeros([d_out], device))),
        };
        let norm = |d: usize| {
            NormConfig::new(d)
                .with_epsilon(self.rms_norm_eps)
                .with_unit_offset(self.norm_unit_offset)
                .init(device)
        };
        let d = self.hidden_size;
        let layers = (0..self.num_layers)
            .map(|i| {
                let Ok(l) = self
                    .layer_config(i)
                    .try_init_with::<std::convert::Infallible>(
                        &mut |_, i, o, b| Ok(linear(i, o, b)),
                        &mut |_, w| Ok(norm(w)),
                    );
                l
            })
            .collect();
        let lm_head = (!self.tie_word_embeddings).then(|| linear(d, self.vocab_size, false));
        let embed = normal([self.vocab_size, d]);
        self.assemble(embed, layers, norm(d), lm_head, FloatDType::F32)
    }

    /// The model from its weights, with this configuration's settings.
    pub(crate) fn assemble(
        &self,
        embed: Tensor<2>,
        layers: Vec<DecoderLayer>,
        norm: Norm,
        lm_head: Option<Linear>,
        compute_dtype: FloatDType,
    ) -> Transformer {
        Transformer {
            embed_tokens: Embedding {
                weight: Param::from_tensor(embed),
            },
            layers,
            norm,
            lm_head,
            num_heads: self.num_heads,
            num_kv_heads: self.num_kv_heads,
            head_dim: self.head_dim,
            rope_inv_freq: self.inv_freq(),
            local_rope_inv_freq: self.local_inv_freq(),
            embedding_multiplier: self.embedding_multiplier,
            final_logit_softcapping: self.final_logit_softcapping,
            logits_scaling: self.logits_scaling,
            compute_dtype,
        }
    }

    /// The settings of decoder layer `i` (its window, RoPE table and feed-forward block depend
    /// on the layer).
    pub fn layer_config(&self, i: usize) -> DecoderLayerConfig {
        let window = self.layer_window(i);
        let moe = self.moe.as_ref().filter(|m| m.is_sparse(i)).map(|m| {
            SparseMoeConfig::new(
                self.hidden_size,
                m.expert_intermediate_size,
                m.num_experts,
                m.experts_per_token,
            )
            .with_norm_topk_prob(m.norm_topk_prob)
        });
        DecoderLayerConfig::new(
            AttentionConfig::new(
                self.hidden_size,
                self.num_heads,
                self.num_kv_heads,
                self.head_dim,
            )
            .with_bias(self.attention_bias)
            .with_qk_norm(self.qk_norm)
            .with_qk_norm_whole(self.qk_norm_whole)
            .with_rms_norm_eps(self.rms_norm_eps)
            .with_scale(self.attention_multiplier)
            .with_softcap(self.attn_logit_softcapping)
            .with_window(window)
            .with_local_rope(window.is_some() && self.rope_local_theta.is_some()),
            self.intermediate_size,
        )
        .with_activation(self.activation)
        .with_moe(moe)
        .with_norm_placement(self.norm_placement)
        .with_residual_multiplier(self.residual_multiplier)
    }

    /// [`TransformerConfig::init_seeded`] with seed 0.
    pub fn init(&self, device: &Device) -> Transformer {
        self.init_seeded(device, 0)
    }
}
