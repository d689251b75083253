//! Loading weights into a [`Transformer`]: Hugging Face safetensors checkpoints (single file or
//! sharded) and GGUF files (dequantised, llama.cpp's q/k row permutation undone), plus random
//! initialisation from a [`TransformerConfig`].

use crate::gguf::{GgufFile, GgufValue};
use crate::layers::{AttentionConfig, DecoderLayerConfig};
use crate::model::Transformer;
use crate::{ModelError, Result, TransformerConfig};
use burn::module::Param;
use burn::nn::{Embedding, Linear, RmsNorm, RmsNormConfig};
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

/// HF tensor name → GGUF tensor name (llama.cpp's naming).
pub(crate) fn gguf_name(hf: &str) -> Option<String> {
    let fixed = match hf {
        "model.embed_tokens.weight" => Some("token_embd.weight"),
        "model.norm.weight" => Some("output_norm.weight"),
        "lm_head.weight" => Some("output.weight"),
        _ => None,
    };
    if let Some(n) = fixed {
        return Some(n.into());
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let (module, suffix) = rest.rsplit_once('.')?;
    let g = GGUF_LAYER_NAMES.iter().find(|(h, _)| *h == module)?.1;
    Some(format!("blk.{layer}.{g}.{suffix}"))
}

/// GGUF tensor name → HF name (the inverse of [`gguf_name`]).
fn hf_name(gguf: &str) -> Option<String> {
    let fixed = match gguf {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(n) = fixed {
        return Some(n.into());
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let (module, suffix) = rest.rsplit_once('.')?;
    let h = GGUF_LAYER_NAMES.iter().find(|(_, g)| *g == module)?.0;
    Some(format!("model.layers.{layer}.{h}.{suffix}"))
}

const GGUF_LAYER_NAMES: [(&str, &str); 11] = [
    ("self_attn.q_proj", "attn_q"),
    ("self_attn.k_proj", "attn_k"),
    ("self_attn.v_proj", "attn_v"),
    ("self_attn.o_proj", "attn_output"),
    ("self_attn.q_norm", "attn_q_norm"),
    ("self_attn.k_norm", "attn_k_norm"),
    ("mlp.gate_proj", "ffn_gate"),
    ("mlp.up_proj", "ffn_up"),
    ("mlp.down_proj", "ffn_down"),
    ("input_layernorm", "attn_norm"),
    ("post_attention_layernorm", "ffn_norm"),
];

/// A GGUF file seen through HF names.
struct GgufSource<'a> {
    file: &'a GgufFile,
    /// `(query heads, kv heads)` when q/k rows are stored in llama.cpp's permuted order.
    permuted: Option<(usize, usize)>,
}

/// Undoes llama.cpp's `permute` of q/k projection rows: within each head, llama.cpp interleaves
/// the two rotary halves (`row h·hd + 2j + k` holds HF row `h·hd + k·hd/2 + j`).
fn unpermute_rows(values: &[f32], heads: usize, row_len: usize) -> Vec<f32> {
    let rows = values.len() / row_len;
    let hd = rows / heads;
    let mut out = vec![0.0; values.len()];
    for h in 0..heads {
        for j in 0..hd / 2 {
            for k in 0..2 {
                let src = h * hd + 2 * j + k;
                let dst = h * hd + k * (hd / 2) + j;
                out[dst * row_len..(dst + 1) * row_len]
                    .copy_from_slice(&values[src * row_len..(src + 1) * row_len]);
            }
        }
    }
    out
}

impl WeightSource for GgufSource<'_> {
    fn root(&self) -> &Path {
        self.file.path()
    }

    fn names(&self) -> Vec<String> {
        self.file
            .tensors
            .keys()
            .map(|g| hf_name(g).unwrap_or_else(|| g.clone()))
            .collect()
    }

    fn get(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let gname = gguf_name(name).ok_or_else(|| missing(name, shape, self.root()))?;
        let (got, values) = self
            .file
            .read_f32(&gname)
            .ok_or_else(|| missing(&gname, shape, self.root()))?;
        check_shape(&gname, &got, shape)?;
        let heads = match (self.permuted, name) {
            (Some((h, _)), n) if n.contains("self_attn.q_proj") => Some(h),
            (Some((_, kv)), n) if n.contains("self_attn.k_proj") => Some(kv),
            _ => None,
        };
        Ok(match heads {
            Some(h) => {
                let row_len = if shape.len() == 2 { shape[1] } else { 1 };
                unpermute_rows(&values, h, row_len)
            }
            None => values,
        })
    }
}

/// Builds tensors on one device in one dtype, recording which names were used.
struct Builder<'a> {
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
        let name = format!("{prefix}.weight");
        let hf = self.files.get(&name, &[d_out, d_in])?;
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
        build(&cfg, &files, device, dtype, &[])
    }

    /// Loads a GGUF file: the architecture from its metadata, the weights dequantised to `dtype`.
    /// Returns the model and the configuration it was built from.
    pub fn from_gguf(
        file: &GgufFile,
        device: &Device,
        dtype: DType,
    ) -> Result<(Self, TransformerConfig)> {
        let cfg = TransformerConfig::from_gguf(file)?;
        // llama.cpp's converter permutes q/k rows for the `llama` architecture only.
        let arch = file
            .get("general.architecture")
            .and_then(GgufValue::as_str)
            .unwrap_or_default();
        let permuted = (arch == "llama").then_some((cfg.num_heads, cfg.num_kv_heads));
        let source = GgufSource { file, permuted };
        let mut model = build(&cfg, &source, device, dtype, &[crate::rope::ROPE_FREQS])?;
        // Llama 3 GGUFs carry the rope scaling as per-frequency divisors: the model uses them
        // as they are; `cfg.rope_scaling` holds the parameters they were computed from.
        if let Some(inv_freq) = crate::rope::gguf_inv_freq(file, &cfg)? {
            model.rope_inv_freq = inv_freq;
        }
        Ok((model, cfg))
    }
}

impl TransformerConfig {
    /// The architecture described by a GGUF file's metadata (`general.architecture` =
    /// `llama`, `mistral`, `qwen2` or `qwen3`).
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        let err = |msg: String| ModelError::Config {
            path: file.path().into(),
            msg,
        };
        let arch = file
            .require("general.architecture")?
            .as_str()
            .ok_or_else(|| err("general.architecture is not a string".into()))?;
        let model_type = match arch {
            "llama" | "mistral" | "qwen2" | "qwen3" => arch,
            other => {
                return Err(err(format!(
                    "GGUF architecture '{other}' is not supported; supported: llama, mistral, qwen2, qwen3"
                )));
            }
        };
        let int = |key: &str| -> Result<usize> {
            let k = format!("{arch}.{key}");
            file.require(&k)?
                .as_u64()
                .map(|v| v as usize)
                .ok_or_else(|| err(format!("'{k}' is not a non-negative integer")))
        };
        let opt_int = |key: &str| {
            file.get(&format!("{arch}.{key}"))
                .and_then(GgufValue::as_u64)
        };
        let opt_f = |key: &str| {
            file.get(&format!("{arch}.{key}"))
                .and_then(GgufValue::as_f64)
        };
        let d = int("embedding_length")?;
        let heads = int("attention.head_count")?;
        let kv = opt_int("attention.head_count_kv").map_or(heads, |v| v as usize);
        if heads == 0 || kv == 0 || !heads.is_multiple_of(kv) {
            return Err(err(format!(
                "head_count ({heads}) must be a positive multiple of head_count_kv ({kv})"
            )));
        }
        let head_dim = opt_int("attention.key_length").map_or(d / heads, |v| v as usize);
        let embd = file
            .tensors
            .get("token_embd.weight")
            .ok_or_else(|| missing("token_embd.weight", &[0, d], file.path()))?;
        let vocab = opt_int("vocab_size").map_or_else(|| embd.shape()[0], |v| v as usize);
        let mut cfg = TransformerConfig {
            model_type: model_type.into(),
            vocab_size: vocab,
            hidden_size: d,
            intermediate_size: int("feed_forward_length")?,
            num_layers: int("block_count")?,
            num_heads: heads,
            num_kv_heads: kv,
            head_dim,
            rms_norm_eps: opt_f("attention.layer_norm_rms_epsilon").unwrap_or(1e-6),
            rope_theta: opt_f("rope.freq_base").unwrap_or(10000.0),
            rope_scaling: None,
            tie_word_embeddings: !file.tensors.contains_key("output.weight"),
            attention_bias: file.tensors.contains_key("blk.0.attn_q.bias"),
            qk_norm: file.tensors.contains_key("blk.0.attn_q_norm.weight"),
            max_position_embeddings: opt_int("context_length").map_or(4096, |v| v as usize),
        };
        cfg.rope_scaling = crate::rope::gguf_scaling(file, arch, &cfg)?;
        Ok(cfg)
    }

    /// A randomly initialised model (HF's scheme: weights N(0, 0.02), biases 0, norms 1) for
    /// training from scratch and tests; the same `seed` gives the same weights on every device
    /// (the values are drawn on the host, not from the device's shared RNG).
    pub fn init_seeded(&self, device: &Device, seed: u64) -> Transformer {
        let mut state = seed ^ 0x9E37_79B9_7F4A_7C15;
        let mut uniform = move || {
            // splitmix64 → (0, 1)
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            ((z >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        };
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
        files,
        device,
        dtype,
        used: BTreeSet::new(),
    };
    let (d, hd, eps) = (cfg.hidden_size, cfg.head_dim, cfg.rms_norm_eps);
    let embed = b.tensor("model.embed_tokens.weight", [cfg.vocab_size, d])?;
    // Not `with_capacity(num_layers)`: the count is untrusted until its tensors are found.
    let mut layers = Vec::new();
    let layer = cfg.layer_config();
    for i in 0..cfg.num_layers {
        let p = format!("model.layers.{i}");
        let b = std::cell::RefCell::new(&mut b);
        layers.push(layer.try_init_with(
            &mut |n, d_in, d_out, bias| {
                b.borrow_mut()
                    .linear(&format!("{p}.{n}"), d_in, d_out, bias)
            },
            &mut |n, w| b.borrow_mut().norm(&format!("{p}.{n}.weight"), w, eps),
        )?);
    }
    let norm = b.norm("model.norm.weight", d, eps)?;
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
        // Weights loaded in a half type compute in it.
        compute_dtype: match dtype {
            DType::BF16 => FloatDType::BF16,
            DType::F16 => FloatDType::F16,
            _ => FloatDType::F32,
        },
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gguf_names_round_trip() {
        for hf in [
            "model.embed_tokens.weight",
            "lm_head.weight",
            "model.norm.weight",
            "model.layers.3.self_attn.q_proj.weight",
            "model.layers.3.self_attn.q_proj.bias",
            "model.layers.12.self_attn.k_norm.weight",
            "model.layers.0.mlp.down_proj.weight",
            "model.layers.0.post_attention_layernorm.weight",
        ] {
            let g = gguf_name(hf).unwrap();
            assert_eq!(hf_name(&g).as_deref(), Some(hf), "{g}");
        }
        assert_eq!(
            gguf_name("model.layers.1.self_attn.o_proj.weight").as_deref(),
            Some("blk.1.attn_output.weight")
        );
        assert_eq!(hf_name("rope_freqs.weight"), None);
    }

    #[test]
    fn unpermute_inverts_llama_cpp_permute() {
        // llama.cpp: w.reshape(heads, 2, hd/2, cols).swapaxes(1, 2).reshape(rows, cols)
        let (heads, hd, cols) = (2, 4, 3);
        let hf: Vec<f32> = (0..heads * hd * cols).map(|i| i as f32).collect();
        let mut permuted = vec![0.0; hf.len()];
        for h in 0..heads {
            for k in 0..2 {
                for j in 0..hd / 2 {
                    let src = h * hd + k * hd / 2 + j;
                    let dst = h * hd + j * 2 + k;
                    permuted[dst * cols..(dst + 1) * cols]
                        .copy_from_slice(&hf[src * cols..(src + 1) * cols]);
                }
            }
        }
        assert_ne!(permuted, hf);
        assert_eq!(unpermute_rows(&permuted, heads, cols), hf);
    }
}
