//! Random initialisation of a [`Transformer`] from a [`TransformerConfig`], and the layer
//! settings both initialisation and loading build from.

use crate::TransformerConfig;
use crate::layers::{AttentionConfig, DecoderLayerConfig};
use crate::model::Transformer;
use burn::module::Param;
use burn::nn::{Embedding, Linear, RmsNormConfig};
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
            RmsNormConfig::new(d)
                .with_epsilon(self.rms_norm_eps)
                .init(device)
        };
        let d = self.hidden_size;
        let layer = self.layer_config();
        let layers = (0..self.num_layers)
            .map(|_| {
                let Ok(l) = layer.try_init_with::<std::convert::Infallible>(
                    &mut |_, i, o, b| Ok(linear(i, o, b)),
                    &mut |_, w| Ok(norm(w)),
                );
                l
            })
            .collect();
        let lm_head = (!self.tie_word_embeddings).then(|| linear(d, self.vocab_size, false));
        let embed = normal([self.vocab_size, d]);
        Transformer {
            embed_tokens: Embedding {
                weight: Param::from_tensor(embed),
            },
            layers,
            norm: norm(d),
            lm_head,
            num_heads: self.num_heads,
            num_kv_heads: self.num_kv_heads,
            head_dim: self.head_dim,
            rope_inv_freq: self.inv_freq(),
            compute_dtype: FloatDType::F32,
        }
    }

    /// The settings of each decoder layer.
    pub fn layer_config(&self) -> DecoderLayerConfig {
        DecoderLayerConfig::new(
            AttentionConfig::new(
                self.hidden_size,
                self.num_heads,
                self.num_kv_heads,
                self.head_dim,
            )
            .with_bias(self.attention_bias)
            .with_qk_norm(self.qk_norm)
            .with_rms_norm_eps(self.rms_norm_eps),
            self.intermediate_size,
        )
    }

    /// [`TransformerConfig::init_seeded`] with seed 0.
    pub fn init(&self, device: &Device) -> Transformer {
        self.init_seeded(device, 0)
    }
}
