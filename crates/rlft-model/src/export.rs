//! Export to a Hugging Face checkpoint (`config.json`, `model.safetensors`, tokenizer files,
//! `generation_config.json`) that transformers, vLLM and llama.cpp's converter read, or to a
//! GGUF file llama.cpp and Ollama load ([`GgufFileType`]); and LoRA adapters through burn's
//! `apply_lora`, merged into the weights on export.

mod gguf;
pub use gguf::GgufFileType;

use crate::model::{FeedForward, Mlp, Transformer};
use crate::{ModelError, Result, Tokenizer, TransformerConfig};
use burn::config::Config;
use burn::module::{Lora, Module, ParamGroup};
use burn::tensor::Tensor;
use safetensors::Dtype;
use safetensors::tensor::TensorView;
use std::collections::HashMap;
use std::path::Path;

/// Projections LoRA can adapt, by their HF names. Phi-3's fused `qkv_proj` and `gate_up_proj`
/// adapt the projections they hold: each of q, k and v (gate and up) gets its own rank-r
/// adapter, and the merged weights are written fused again. The experts of a mixture adapt
/// under the dense names (`gate_proj`, `up_proj`, `down_proj`, Mixtral's `w1`, `w3`, `w2`).
pub const LORA_TARGETS: [&str; 12] = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
    "qkv_proj",
    "gate_up_proj",
    "w1",
    "w2",
    "w3",
];

/// The model's projection names a LoRA target stands for.
fn lora_modules(target: &str) -> &'static [&'static str] {
    match target {
        "q_proj" => &["q_proj"],
        "k_proj" => &["k_proj"],
        "v_proj" => &["v_proj"],
        "o_proj" => &["o_proj"],
        "gate_proj" | "w1" => &["gate_proj"],
        "up_proj" | "w3" => &["up_proj"],
        "down_proj" | "w2" => &["down_proj"],
        "qkv_proj" => &["q_proj", "k_proj", "v_proj"],
        "gate_up_proj" => &["gate_proj", "up_proj"],
        _ => &[],
    }
}

/// LoRA adapters: `W + (alpha / rank) · A·B` on the named projections; everything else frozen.
#[derive(Config, Debug, PartialEq)]
pub struct LoraConfig {
    /// Rank of `A·B`.
    pub rank: usize,
    /// Scale numerator (the update is scaled by `alpha / rank`).
    pub alpha: f64,
    /// Projections to adapt (any of [`LORA_TARGETS`]).
    #[config(
        default = "vec![\"q_proj\".into(), \"k_proj\".into(), \"v_proj\".into(), \"o_proj\".into()]"
    )]
    pub target_modules: Vec<String>,
}

/// The files [`Transformer::save_hf`] writes into its folder (the last three only for a
/// tokenizer, and `chat_template.jinja` only for one with a chat template).
pub const HF_EXPORT_FILES: [&str; 6] = [
    "model.safetensors",
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
];

impl LoraConfig {
    /// Checks rank, alpha and module names.
    pub fn validate(&self) -> Result<()> {
        if self.rank == 0 {
            return Err(ModelError::Lora("rank must be at least 1".into()));
        }
        if !(self.alpha.is_finite() && self.alpha > 0.0) {
            return Err(ModelError::Lora(format!(
                "alpha must be a positive number, got {}",
                self.alpha
            )));
        }
        if self.target_modules.is_empty() {
            return Err(ModelError::Lora(format!(
                "target_modules is empty; choose from {LORA_TARGETS:?}"
            )));
        }
        for m in &self.target_modules {
            if !LORA_TARGETS.contains(&m.as_str()) {
                return Err(ModelError::Lora(format!(
                    "target module '{m}' does not exist; choose from {LORA_TARGETS:?}"
                )));
            }
        }
        Ok(())
    }
}

impl Transformer {
    /// Attaches LoRA adapters to the projections in `cfg.target_modules` and freezes every other
    /// weight: only the adapters train. [`Transformer::merged`] folds them back in.
    pub fn with_lora(self, cfg: &LoraConfig) -> Result<Self> {
        cfg.validate()?;
        let mut modules: Vec<&str> = cfg
            .target_modules
            .iter()
            .flat_map(|m| lora_modules(m).iter().copied())
            .collect();
        modules.sort_unstable();
        modules.dedup();
        let group =
            ParamGroup::from_any_predicates(modules.iter().map(|m| format!(".{m}.")).collect());
        Ok(self.apply_lora(Lora::new(cfg.rank, cfg.alpha).set_param_group(group)))
    }

    /// A plain copy with any LoRA adapters merged into the weights (no autodiff).
    pub fn merged(&self) -> Self {
        self.valid().materialize()
    }

    /// The weights under the model's own names (Llama's and Qwen3-MoE's Hugging Face names)
    /// and shapes (`[out, in]` for projections), as f32, LoRA merged. A family that names or
    /// fuses its weights otherwise on disk (Phi-3, Mixtral) is written through
    /// [`Transformer::save_hf`], which maps them.
    pub fn hf_tensors(&self) -> Vec<(String, Vec<usize>, Vec<f32>)> {
        fn host<const D: usize>(t: Tensor<D>) -> (Vec<usize>, Vec<f32>) {
            let shape = t.dims().to_vec();
            let data = t.into_data().convert::<f32>();
            (shape, data.try_into_vec::<f32>().expect("converted to f32"))
        }
        let m = self.merged();
        let mut out = Vec::new();
        let mut push =
            |name: String, (shape, v): (Vec<usize>, Vec<f32>)| out.push((name, shape, v));
        let linear = |l: &burn::nn::Linear| host(l.weight.val().transpose());
        let mlp = |p: &str, mlp: &Mlp, push: &mut dyn FnMut(String, (Vec<usize>, Vec<f32>))| {
            for (n, l) in [
                ("gate_proj", &mlp.gate_proj),
                ("up_proj", &mlp.up_proj),
                ("down_proj", &mlp.down_proj),
            ] {
                push(format!("{p}.{n}.weight"), linear(l));
            }
        };
        push(
            "model.embed_tokens.weight".into(),
            host(m.embed_tokens.weight.val()),
        );
        for (i, layer) in m.layers.iter().enumerate() {
            let p = format!("model.layers.{i}");
            let a = &layer.self_attn;
            for (n, l) in [
                ("q_proj", &a.q_proj),
                ("k_proj", &a.k_proj),
                ("v_proj", &a.v_proj),
                ("o_proj", &a.o_proj),
            ] {
                push(format!("{p}.self_attn.{n}.weight"), linear(l));
                if let Some(b) = &l.bias {
                    push(format!("{p}.self_attn.{n}.bias"), host(b.val()));
                }
            }
            for (n, norm) in [("q_norm", &a.q_norm), ("k_norm", &a.k_norm)] {
                if let Some(norm) = norm {
                    push(format!("{p}.self_attn.{n}.weight"), host(norm.gamma.val()));
                }
            }
            match &layer.mlp {
                FeedForward::Dense(d) => mlp(&format!("{p}.mlp"), d, &mut push),
                FeedForward::Experts(moe) => {
                    push(format!("{p}.mlp.gate.weight"), linear(&moe.gate));
                    for (e, expert) in moe.experts.iter().enumerate() {
                        mlp(&format!("{p}.mlp.experts.{e}"), expert, &mut push);
                    }
                }
            }
            for (n, norm) in [
                ("input_layernorm", layer.input_layernorm.as_ref()),
                (
                    "post_attention_layernorm",
                    Some(&layer.post_attention_layernorm),
                ),
                (
                    "pre_feedforward_layernorm",
                    layer.pre_feedforward_layernorm.as_ref(),
                ),
                (
                    "post_feedforward_layernorm",
                    layer.post_feedforward_layernorm.as_ref(),
                ),
            ] {
                if let Some(norm) = norm {
                    push(format!("{p}.{n}.weight"), host(norm.gamma.val()));
                }
            }
        }
        push("model.norm.weight".into(), host(m.norm.gamma.val()));
        if let Some(head) = &m.lm_head {
            push("lm_head.weight".into(), linear(head));
        }
        out
    }

    /// Writes a Hugging Face checkpoint into `dir` (created if needed): `config.json`,
    /// `model.safetensors` (f32, LoRA merged), `generation_config.json` and, given a tokenizer,
    /// its files. Files are written under temporary names and renamed, so an interrupted export
    /// never leaves a half-written `model.safetensors`.
    ///
    /// # Errors
    /// [`ModelError::RopeScaling`], before anything is written, when `config` declares other
    /// RoPE frequencies than the model uses (a GGUF whose `rope_freqs.weight` is not Llama 3
    /// scaling: `config.json` cannot express it); I/O errors.
    pub fn save_hf(
        &self,
        config: &TransformerConfig,
        tokenizer: Option<&Tokenizer>,
        dir: &Path,
    ) -> Result<()> {
        crate::rope::check_exportable(&self.rope_inv_freq, config)?;
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| ModelError::Io { path, source }
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let write_atomic = |name: &str, bytes: &[u8]| -> Result<()> {
            let path = dir.join(name);
            crate::write_atomic(&path, bytes).map_err(io(&path))
        };
        let tensors = crate::load::names::to_disk(config, self.hf_tensors());
        let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
            .into_iter()
            .map(|(n, s, v)| (n, s, v.iter().flat_map(|x| x.to_le_bytes()).collect()))
            .collect();
        let views = bytes
            .iter()
            .map(|(n, s, b)| {
                TensorView::new(Dtype::F32, s.clone(), b)
                    .map(|v| (n.clone(), v))
                    .map_err(|e| ModelError::Input(format!("tensor {n}: {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
        let st = safetensors::serialize(views, Some(meta)).map_err(|e| ModelError::Weights {
            path: dir.join("model.safetensors"),
            msg: e.to_string(),
        })?;
        write_atomic("model.safetensors", &st)?;
        let json = |v: &serde_json::Value| serde_json::to_vec_pretty(v).expect("JSON serialises");
        write_atomic("config.json", &json(&config.to_hf_json()))?;
        let mut generation = serde_json::json!({});
        if let Some(t) = tokenizer {
            generation["bos_token_id"] = serde_json::json!(t.bos_id);
            generation["eos_token_id"] = match t.eos_ids.as_slice() {
                [one] => serde_json::json!(one),
                many => serde_json::json!(many),
            };
            generation["pad_token_id"] = serde_json::json!(t.pad_id.or(t.eos_ids.first().copied()));
            t.save(dir)?;
        }
        write_atomic("generation_config.json", &json(&generation))?;
        Ok(())
    }
}
