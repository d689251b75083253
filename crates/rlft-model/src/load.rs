//! Loading Hugging Face safetensors checkpoints (single file or sharded) into a [`Transformer`].

use crate::model::{Attention, DecoderLayer, Mlp, Transformer};
use crate::{ModelError, Result, TransformerConfig};
use burn::module::Param;
use burn::nn::{Embedding, Linear, RmsNorm};
use burn::tensor::{DType, Device, Tensor, TensorData};
use safetensors::{Dtype, SafeTensors};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Memory-mapped safetensors files of one checkpoint.
struct WeightFiles {
    maps: Vec<(PathBuf, memmap2::Mmap)>,
    /// Tensor name → index into `maps`.
    index: BTreeMap<String, usize>,
    root: PathBuf,
}

impl WeightFiles {
    fn open(dir: &Path) -> Result<Self> {
        let single = dir.join("model.safetensors");
        let sharded = dir.join("model.safetensors.index.json");
        let files: Vec<PathBuf> = if single.exists() {
            vec![single]
        } else if sharded.exists() {
            let text = std::fs::read_to_string(&sharded).map_err(|source| ModelError::Io {
                path: sharded.clone(),
                source,
            })?;
            let json: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| ModelError::Weights {
                    path: sharded.clone(),
                    msg: format!("not JSON: {e}"),
                })?;
            let map = json
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| ModelError::Weights {
                    path: sharded.clone(),
                    msg: "no weight_map object".into(),
                })?;
            let names: BTreeSet<&str> = map.values().filter_map(|v| v.as_str()).collect();
            names.into_iter().map(|n| dir.join(n)).collect()
        } else {
            return Err(ModelError::Weights {
                path: dir.into(),
                msg: "no model.safetensors or model.safetensors.index.json in this folder".into(),
            });
        };
        let mut maps = Vec::new();
        let mut index = BTreeMap::new();
        for path in files {
            let file = std::fs::File::open(&path).map_err(|source| ModelError::Io {
                path: path.clone(),
                source,
            })?;
            // SAFETY: the map is read-only and lives as long as `WeightFiles`; a file changed
            // on disk while loading is the caller's race, as with any reader.
            let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|source| ModelError::Io {
                path: path.clone(),
                source,
            })?;
            let st = SafeTensors::deserialize(&map).map_err(|e| ModelError::Weights {
                path: path.clone(),
                msg: e.to_string(),
            })?;
            for name in st.names() {
                index.insert(name.to_string(), maps.len());
            }
            maps.push((path, map));
        }
        Ok(Self {
            maps,
            index,
            root: dir.into(),
        })
    }

    /// The tensor `name` as f32 values, checked against `shape`.
    fn get(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let missing = || ModelError::MissingTensor {
            name: name.into(),
            expected: shape.to_vec(),
            path: self.root.clone(),
        };
        let (path, map) = &self.maps[*self.index.get(name).ok_or_else(missing)?];
        let st = SafeTensors::deserialize(map).map_err(|e| ModelError::Weights {
            path: path.clone(),
            msg: e.to_string(),
        })?;
        let view = st.tensor(name).map_err(|_| missing())?;
        if view.shape() != shape {
            return Err(ModelError::TensorShape {
                name: name.into(),
                got: view.shape().to_vec(),
                expected: shape.to_vec(),
            });
        }
        let bytes = view.data();
        let values = match view.dtype() {
            Dtype::F32 => bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            Dtype::F16 => bytes
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            Dtype::BF16 => bytes
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            other => {
                return Err(ModelError::Dtype {
                    name: name.into(),
                    dtype: format!("{other:?}"),
                });
            }
        };
        Ok(values)
    }
}

/// Builds tensors on one device in one dtype, recording which names were used.
struct Builder<'a> {
    files: &'a WeightFiles,
    device: &'a Device,
    dtype: DType,
    used: BTreeSet<String>,
}

impl Builder<'_> {
    fn tensor<const D: usize>(&mut self, name: &str, shape: [usize; D]) -> Result<Tensor<D>> {
        let values = self.files.get(name, &shape)?;
        self.used.insert(name.to_string());
        Ok(Tensor::from_data(
            TensorData::new(values, shape),
            (self.device, self.dtype),
        ))
    }

    /// An HF `[out, in]` linear layer as burn's `[in, out]`.
    fn linear(&mut self, prefix: &str, d_in: usize, d_out: usize, bias: bool) -> Result<Linear> {
        let w = self
            .tensor(&format!("{prefix}.weight"), [d_out, d_in])?
            .transpose();
        let b = if bias {
            Some(Param::from_tensor(
                self.tensor(&format!("{prefix}.bias"), [d_out])?,
            ))
        } else {
            None
        };
        Ok(Linear {
            weight: Param::from_tensor(w),
            bias: b,
        })
    }

    fn norm(&mut self, name: &str, d: usize, eps: f64) -> Result<RmsNorm> {
        Ok(RmsNorm {
            gamma: Param::from_tensor(self.tensor(name, [d])?),
            epsilon: eps,
        })
    }
}

impl Transformer {
    /// Loads a Hugging Face checkpoint folder (`config.json` + `model.safetensors` or a sharded
    /// index) onto `device`, converting f32/f16/bf16 weights to `dtype`.
    ///
    /// Missing or mis-shaped tensors are errors naming the tensor and both shapes; tensors the
    /// architecture does not use are an error too (a config that does not match its weights).
    pub fn from_hf_dir(dir: &Path, device: &Device, dtype: DType) -> Result<Self> {
        let cfg = TransformerConfig::from_hf_file(&dir.join("config.json"))?;
        let files = WeightFiles::open(dir)?;
        let mut b = Builder {
            files: &files,
            device,
            dtype,
            used: BTreeSet::new(),
        };
        let (d, hd, eps) = (cfg.hidden_size, cfg.head_dim, cfg.rms_norm_eps);
        let embed = b.tensor("model.embed_tokens.weight", [cfg.vocab_size, d])?;
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for i in 0..cfg.num_layers {
            let p = format!("model.layers.{i}");
            let a = format!("{p}.self_attn");
            let qk_norm = |b: &mut Builder, n: &str| -> Result<Option<RmsNorm>> {
                if cfg.qk_norm {
                    b.norm(&format!("{a}.{n}.weight"), hd, eps).map(Some)
                } else {
                    Ok(None)
                }
            };
            let self_attn = Attention {
                q_proj: b.linear(
                    &format!("{a}.q_proj"),
                    d,
                    cfg.num_heads * hd,
                    cfg.attention_bias,
                )?,
                k_proj: b.linear(
                    &format!("{a}.k_proj"),
                    d,
                    cfg.num_kv_heads * hd,
                    cfg.attention_bias,
                )?,
                v_proj: b.linear(
                    &format!("{a}.v_proj"),
                    d,
                    cfg.num_kv_heads * hd,
                    cfg.attention_bias,
                )?,
                o_proj: b.linear(&format!("{a}.o_proj"), cfg.num_heads * hd, d, false)?,
                q_norm: qk_norm(&mut b, "q_norm")?,
                k_norm: qk_norm(&mut b, "k_norm")?,
            };
            let m = format!("{p}.mlp");
            let mlp = Mlp {
                gate_proj: b.linear(&format!("{m}.gate_proj"), d, cfg.intermediate_size, false)?,
                up_proj: b.linear(&format!("{m}.up_proj"), d, cfg.intermediate_size, false)?,
                down_proj: b.linear(&format!("{m}.down_proj"), cfg.intermediate_size, d, false)?,
            };
            layers.push(DecoderLayer {
                input_layernorm: b.norm(&format!("{p}.input_layernorm.weight"), d, eps)?,
                self_attn,
                post_attention_layernorm: b.norm(
                    &format!("{p}.post_attention_layernorm.weight"),
                    d,
                    eps,
                )?,
                mlp,
            });
        }
        let norm = b.norm("model.norm.weight", d, eps)?;
        let lm_head = if cfg.tie_word_embeddings {
            None
        } else {
            Some(b.linear("lm_head", d, cfg.vocab_size, false)?)
        };
        // Rotary caches some exporters write are derived data, not weights.
        let unused: Vec<String> = files
            .index
            .keys()
            .filter(|n| !b.used.contains(*n) && !n.ends_with("rotary_emb.inv_freq"))
            .filter(|n| !(cfg.tie_word_embeddings && *n == "lm_head.weight"))
            .cloned()
            .collect();
        if !unused.is_empty() {
            return Err(ModelError::UnexpectedTensors {
                path: dir.into(),
                names: unused,
            });
        }
        Ok(Transformer {
            embed_tokens: Embedding {
                weight: Param::from_tensor(embed),
            },
            layers,
            norm,
            lm_head,
            num_heads: cfg.num_heads,
            num_kv_heads: cfg.num_kv_heads,
            head_dim: hd,
            rope_inv_freq: cfg.inv_freq(),
        })
    }
}
