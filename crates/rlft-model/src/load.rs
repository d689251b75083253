//! Loading weights into a [`Transformer`]: Hugging Face safetensors checkpoints (single file or
//! sharded) and GGUF files (dequantised, llama.cpp's q/k row permutation undone), plus random
//! initialisation from a [`TransformerConfig`].

pub(crate) mod gguf;
mod init;

pub(crate) mod names;

use crate::gguf::GgufFile;
use crate::layers::Norm;
use crate::model::Transformer;
use crate::{ModelError, Result, TransformerConfig};
use burn::module::Param;
use burn::nn::Linear;
use burn::tensor::{DType, Device, FloatDType, Tensor, TensorData};
use safetensors::{Dtype, SafeTensors};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Where weights come from, addressed by their Hugging Face names and shapes.
trait WeightSource {
    /// Folder or file named in errors.
    fn root(&self) -> &Path;
    /// Every tensor name the source holds (HF naming).
    fn names(&self) -> Vec<String>;
    /// The tensor `name` as f32 values, checked against `shape`.
    fn get(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>>;
}

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
                msg: "no model.safetensors or model.safetensors.index.json in this folder (PyTorch .bin \
                      files are not read: save the model with transformers' \
                      save_pretrained(dir, safe_serialization=True))"
                    .into(),
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
}

fn missing(name: &str, shape: &[usize], root: &Path) -> ModelError {
    ModelError::MissingTensor {
        name: name.into(),
        expected: shape.to_vec(),
        path: root.into(),
    }
}

pub(crate) fn check_shape(name: &str, got: &[usize], expected: &[usize]) -> Result<()> {
    if got != expected {
        return Err(ModelError::TensorShape {
            name: name.into(),
            got: got.to_vec(),
            expected: expected.to_vec(),
        });
    }
    Ok(())
}

impl WeightSource for WeightFiles {
    fn root(&self) -> &Path {
        &self.root
    }

    fn names(&self) -> Vec<String> {
        self.index.keys().cloned().collect()
    }

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
        check_shape(name, view.shape(), shape)?;
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
    cfg: &'a TransformerConfig,
    files: &'a dyn WeightSource,
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
        // Transposed on the host: a transposed *view* would be copied to contiguous memory by
        // every forward pass (a third of decode time, measured with perf).
        let (disk, rows) = names::on_disk(self.cfg, prefix);
        let name = format!("{disk}.weight");
        let hf = match &rows {
            None => self.files.get(&name, &[d_out, d_in])?,
            Some(r) => {
                let all = self.files.get(&name, &[r.total, d_in])?;
                all[r.start * d_in..(r.start + d_out) * d_in].to_vec()
            }
        };
        self.used.insert(name);
        let mut t = vec![0.0f32; hf.len()];
        for (o, row) in hf.chunks_exact(d_in).enumerate() {
            for (i, &v) in row.iter().enumerate() {
                t[i * d_out + o] = v;
            }
        }
        let w =
            Tensor::<2>::from_data(TensorData::new(t, [d_in, d_out]), (self.device, self.dtype));
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

    fn norm(&mut self, name: &str, d: usize) -> Result<Norm> {
        Ok(Norm {
            gamma: Param::from_tensor(self.tensor(name, [d])?),
            epsilon: self.cfg.rms_norm_eps,
            unit_offset: self.cfg.norm_unit_offset,
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
        build(&cfg, &files, device, dtype, &[])
    }
}

/// Builds the model `cfg` describes from `files`; tensors in `files` the model does not use are
/// an error (except derived data named in `ignore` and rotary caches).
fn build(
    cfg: &TransformerConfig,
    files: &dyn WeightSource,
    device: &Device,
    dtype: DType,
    ignore: &[&str],
) -> Result<Transformer> {
    let dir = files.root();
    check_sizes(cfg, dir)?;
    let mut b = Builder {
        cfg,
        files,
        device,
        dtype,
        used: BTreeSet::new(),
    };
    let d = cfg.hidden_size;
    let embed = b.tensor("model.embed_tokens.weight", [cfg.vocab_size, d])?;
    // Not `with_capacity(num_layers)`: the count is untrusted until its tensors are found.
    let mut layers = Vec::new();
    for i in 0..cfg.num_layers {
        let p = format!("model.layers.{i}");
        let b = std::cell::RefCell::new(&mut b);
        layers.push(cfg.layer_config(i).try_init_with(
            &mut |n, d_in, d_out, bias| {
                b.borrow_mut()
                    .linear(&format!("{p}.{n}"), d_in, d_out, bias)
            },
            &mut |n, w| b.borrow_mut().norm(&format!("{p}.{n}.weight"), w),
        )?);
    }
    let norm = b.norm("model.norm.weight", d)?;
    let lm_head = if cfg.tie_word_embeddings {
        None
    } else {
        Some(b.linear("lm_head", d, cfg.vocab_size, false)?)
    };
    // Rotary caches some exporters write are derived data, not weights.
    let unused: Vec<String> = files
        .names()
        .into_iter()
        .filter(|n| !b.used.contains(n) && !n.ends_with("rotary_emb.inv_freq"))
        .filter(|n| !ignore.contains(&n.as_str()))
        .filter(|n| !(cfg.tie_word_embeddings && n == "lm_head.weight"))
        .collect();
    if !unused.is_empty() {
        return Err(ModelError::UnexpectedTensors {
            path: dir.into(),
            names: unused,
        });
    }
    // Weights loaded in a half type compute in it.
    let compute = match dtype {
        DType::BF16 => FloatDType::BF16,
        DType::F16 => FloatDType::F16,
        _ => FloatDType::F32,
    };
    Ok(cfg.assemble(embed, layers, norm, lm_head, compute))
}

/// A tokenizer whose ids run past the embedding would index outside it on the first such token.
fn check_vocab(
    path: &Path,
    config: &TransformerConfig,
    tokenizer: &crate::Tokenizer,
) -> Result<()> {
    if tokenizer.vocab_size() > config.vocab_size {
        return Err(ModelError::Config {
            path: path.into(),
            msg: format!(
                "the tokenizer has {} token ids but the model's embedding has {} rows \
                 (vocab_size): the tokenizer belongs to another model; use the tokenizer files \
                 that came with these weights",
                tokenizer.vocab_size(),
                config.vocab_size
            ),
        });
    }
    Ok(())
}

/// Rejects sizes no checkpoint has before any tensor is shaped from them: a 0 (every tensor
/// could then be empty, so nothing in the file would bound `head_dim` before the RoPE table of
/// `head_dim / 2` entries is allocated, and a zero width divides), an odd `head_dim` (GGUF
/// metadata is not checked for it as `config.json` is) or a head product that overflows. `root` is the checkpoint folder (its `config.json` is named) or the GGUF file.
fn check_sizes(cfg: &TransformerConfig, root: &Path) -> Result<()> {
    let path = if root.is_dir() {
        root.join("config.json")
    } else {
        root.into()
    };
    let err = |msg: String| Err(ModelError::Config { path, msg });
    for (name, v) in [
        ("vocab_size", cfg.vocab_size),
        ("hidden_size", cfg.hidden_size),
        ("intermediate_size", cfg.intermediate_size),
        ("num_hidden_layers", cfg.num_layers),
        ("num_attention_heads", cfg.num_heads),
        ("num_key_value_heads", cfg.num_kv_heads),
        ("head_dim", cfg.head_dim),
    ] {
        if v == 0 {
            return err(format!("{name} is 0; it must be at least 1"));
        }
    }
    if !cfg.head_dim.is_multiple_of(2) {
        return err(format!("head_dim {} must be even for RoPE", cfg.head_dim));
    }
    for (name, heads) in [
        ("num_attention_heads", cfg.num_heads),
        ("num_key_value_heads", cfg.num_kv_heads),
    ] {
        if heads.checked_mul(cfg.head_dim).is_none() {
            return err(format!(
                "{name} ({heads}) × head_dim ({}) overflows",
                cfg.head_dim
            ));
        }
    }
    Ok(())
}

/// A checkpoint ready to use: model, architecture and tokenizer.
#[derive(Debug)]
pub struct Pretrained {
    /// The model.
    pub model: Transformer,
    /// Its architecture (written back on export).
    pub config: TransformerConfig,
    /// Its tokenizer, special tokens and chat template.
    pub tokenizer: crate::Tokenizer,
}

impl Pretrained {
    /// Loads an HF checkpoint folder or a `.gguf` file onto `device` in `dtype`.
    pub fn load(path: &Path, device: &Device, dtype: DType) -> Result<Self> {
        if path.is_dir() {
            let config = TransformerConfig::from_hf_file(&path.join("config.json"))?;
            let tokenizer = crate::Tokenizer::from_hf_dir(path)?;
            check_vocab(path, &config, &tokenizer)?;
            let files = WeightFiles::open(path)?;
            let model = build(&config, &files, device, dtype, &[])?;
            Ok(Self {
                model,
                config,
                tokenizer,
            })
        } else if path.extension().is_some_and(|e| e == "gguf") {
            let file = GgufFile::open(path)?;
            let tokenizer = crate::Tokenizer::from_gguf(&file)?;
            let (model, config) = Transformer::from_gguf(&file, device, dtype)?;
            check_vocab(path, &config, &tokenizer)?;
            Ok(Self {
                model,
                config,
                tokenizer,
            })
        } else if !path.exists() {
            Err(ModelError::Io {
                path: path.into(),
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or folder"),
            })
        } else {
            Err(ModelError::Weights {
                path: path.into(),
                msg: "expected an HF checkpoint folder or a .gguf file".into(),
            })
        }
    }

    /// Exports as an HF checkpoint (see [`Transformer::save_hf`]).
    pub fn save_hf(&self, dir: &Path) -> Result<()> {
        self.model.save_hf(&self.config, Some(&self.tokenizer), dir)
    }
}
