//! GGUF files: the container parser, then the config, tokenizer and model built from one.

use super::*;
use crate::{GgufFile, Tokenizer, Transformer, TransformerConfig};
use burn::tensor::{DType, Device};
use std::path::Path;

const KEYS: &[&str] = &[
    "general.architecture",
    "general.alignment",
    "llama.embedding_length",
    "llama.attention.head_count",
    "llama.attention.key_length",
    "tokenizer.ggml.model",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.bos_token_id",
];

/// ggml type ids: every supported one, unsupported ones, and any.
fn type_id() -> impl Strategy<Value = u32> {
    prop_oneof![
        4 => proptest::sample::select(&[0u32, 1, 2, 3, 8, 12, 13, 14, 30][..]),
        1 => any::<u32>(),
    ]
}

fn put_str(b: &mut Vec<u8>, s: &[u8]) {
    b.extend_from_slice(&(s.len() as u64).to_le_bytes());
    b.extend_from_slice(s);
}

/// The bytes of one metadata value of type `ty` (0–12, or unknown), arrays holding `count`
/// items of type `item` whatever count they claim.
fn value_bytes(
    ty: u32,
    scalar: u64,
    text: &[u8],
    item: u32,
    count: usize,
    claim: Option<u64>,
) -> Vec<u8> {
    let mut b = Vec::new();
    let n = |ty: u32| match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        10..=12 => 8,
        _ => 0,
    };
    match ty {
        8 => put_str(&mut b, text),
        9 => {
            b.extend_from_slice(&item.to_le_bytes());
            b.extend_from_slice(&claim.unwrap_or(count as u64).to_le_bytes());
            for i in 0..count {
                match item {
                    8 => put_str(&mut b, text),
                    9 => {
                        b.extend_from_slice(&item.to_le_bytes());
                        b.extend_from_slice(&(i as u64).to_le_bytes());
                    }
                    t => b.extend_from_slice(&scalar.to_le_bytes()[..n(t)]),
                }
            }
        }
        t => b.extend_from_slice(&scalar.to_le_bytes()[..n(t)]),
    }
    b
}

/// One metadata key/value: a known or random key (whose length prefix may lie), a value of any
/// type.
fn kv() -> impl Strategy<Value = Vec<u8>> {
    (
        prop_oneof![
            8 => proptest::sample::select(KEYS).prop_map(|k| k.as_bytes().to_vec()),
            1 => "[a-z.]{0,8}".prop_map(String::into_bytes),
            1 => bytes(12),
        ],
        prop_oneof![8 => Just(None), 1 => wild_u64().prop_map(Some)],
        prop_oneof![8 => 0u32..13, 1 => any::<u32>()],
        wild_u64(),
        prop_oneof![8 => "[a-z]{0,6}".prop_map(String::into_bytes), 1 => bytes(8)],
        prop_oneof![8 => 0u32..13, 1 => any::<u32>()],
        0usize..6,
        prop_oneof![4 => Just(None), 1 => wild_u64().prop_map(Some)],
    )
        .prop_map(|(key, key_len, ty, scalar, text, item, count, claim)| {
            let mut b = key_len.unwrap_or(key.len() as u64).to_le_bytes().to_vec();
            b.extend_from_slice(&key);
            b.extend_from_slice(&ty.to_le_bytes());
            b.extend(value_bytes(ty, scalar, &text, item, count, claim));
            b
        })
}

/// One tensor directory entry: any name, 0–5 dims of any size, any type, any offset.
fn tensor_entry() -> impl Strategy<Value = Vec<u8>> {
    (
        "[a-z._0-9]{0,12}",
        prop_oneof![6 => 0u32..6, 1 => any::<u32>()],
        proptest::collection::vec(prop_oneof![3 => 0u64..300, 1 => wild_u64()], 0..6),
        type_id(),
        prop_oneof![3 => (0u64..8).prop_map(|k| 32 * k), 1 => wild_u64()],
    )
        .prop_map(|(name, n_dims, dims, ty, offset)| {
            let mut b = Vec::new();
            put_str(&mut b, name.as_bytes());
            b.extend_from_slice(&n_dims.to_le_bytes());
            for d in dims.iter().take(n_dims as usize) {
                b.extend_from_slice(&d.to_le_bytes());
            }
            b.extend_from_slice(&ty.to_le_bytes());
            b.extend_from_slice(&offset.to_le_bytes());
            b
        })
}

/// A GGUF file: magic, version 2/3 (or any), tensor and metadata counts that are true or wild,
/// the entries, padding and some data; then possibly cut short.
fn gguf_file() -> impl Strategy<Value = Vec<u8>> {
    (
        prop_oneof![10 => 2u32..4, 1 => any::<u32>()],
        proptest::collection::vec(kv(), 0..5),
        proptest::collection::vec(tensor_entry(), 0..4),
        prop_oneof![8 => Just(None), 1 => wild_u64().prop_map(Some)],
        prop_oneof![8 => Just(None), 1 => wild_u64().prop_map(Some)],
        bytes(1024),
        prop_oneof![6 => Just(None), 1 => any::<proptest::sample::Index>().prop_map(Some)],
    )
        .prop_map(|(version, kvs, tensors, n_kv, n_tensors, data, cut)| {
            let mut b = b"GGUF".to_vec();
            b.extend_from_slice(&version.to_le_bytes());
            b.extend_from_slice(&n_tensors.unwrap_or(tensors.len() as u64).to_le_bytes());
            b.extend_from_slice(&n_kv.unwrap_or(kvs.len() as u64).to_le_bytes());
            kvs.iter()
                .chain(&tensors)
                .for_each(|e| b.extend_from_slice(e));
            while !b.len().is_multiple_of(32) {
                b.push(0);
            }
            b.extend(data);
            if let Some(cut) = cut {
                b.truncate(cut.index(b.len() + 1));
            }
            b
        })
}

/// Builds GGUF files key by key and tensor by tensor (F32 data, 32-byte aligned).
#[derive(Default)]
struct Writer {
    kv: Vec<u8>,
    n_kv: u64,
    tensors: Vec<(String, Vec<u64>, usize)>,
}

impl Writer {
    fn key(&mut self, k: &str, ty: u32) {
        put_str(&mut self.kv, k.as_bytes());
        self.kv.extend_from_slice(&ty.to_le_bytes());
        self.n_kv += 1;
    }
    fn u64(&mut self, k: &str, v: u64) {
        self.key(k, 10);
        self.kv.extend_from_slice(&v.to_le_bytes());
    }
    fn str(&mut self, k: &str, v: &str) {
        self.key(k, 8);
        put_str(&mut self.kv, v.as_bytes());
    }
    fn strs(&mut self, k: &str, v: &[String]) {
        self.key(k, 9);
        self.kv.extend_from_slice(&8u32.to_le_bytes());
        self.kv.extend_from_slice(&(v.len() as u64).to_le_bytes());
        v.iter().for_each(|s| put_str(&mut self.kv, s.as_bytes()));
    }
    fn i64s(&mut self, k: &str, v: &[i64]) {
        self.key(k, 9);
        self.kv.extend_from_slice(&11u32.to_le_bytes());
        self.kv.extend_from_slice(&(v.len() as u64).to_le_bytes());
        v.iter()
            .for_each(|x| self.kv.extend_from_slice(&x.to_le_bytes()));
    }
    /// An F32 tensor of row-major `shape` (zeros), or of shape `[1]` if `shape` is too large.
    fn tensor(&mut self, name: &str, shape: &[usize]) {
        let (dims, n) = match small_numel(shape) {
            Some(n) => (shape.iter().rev().map(|&d| d as u64).collect(), n),
            None => (vec![1], 1),
        };
        self.tensors.push((name.into(), dims, n));
    }
    fn finish(self) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        b.extend_from_slice(&self.n_kv.to_le_bytes());
        b.extend_from_slice(&self.kv);
        let mut offset = 0u64;
        for (name, dims, n) in &self.tensors {
            put_str(&mut b, name.as_bytes());
            b.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            dims.iter()
                .for_each(|d| b.extend_from_slice(&d.to_le_bytes()));
            b.extend_from_slice(&0u32.to_le_bytes());
            b.extend_from_slice(&offset.to_le_bytes());
            offset += (*n as u64 * 4).div_ceil(32) * 32;
        }
        while !b.len().is_multiple_of(32) {
            b.push(0);
        }
        let data = usize::try_from(offset).expect("small test data");
        b.resize(b.len() + data, 0);
        b
    }
}

/// Opens `bytes` as a GGUF file and, if that works, reads every tensor and builds the
/// config, the tokenizer and the model from it; only panics matter.
fn open_all(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).expect("write a scratch file");
    let Ok(file) = GgufFile::open(path) else {
        return;
    };
    for name in file.tensors.keys() {
        let _ = file.read_f32(name);
    }
    let _ = TransformerConfig::from_gguf(&file);
    let _ = Tokenizer::from_gguf(&file);
    let _ = Transformer::from_gguf(&file, &Device::default(), DType::F32);
}

/// HF → GGUF tensor names for [`Dims::tensors`].
fn gguf_name(hf: &str) -> String {
    let fixed = [
        ("model.embed_tokens.weight", "token_embd.weight"),
        ("model.norm.weight", "output_norm.weight"),
        ("lm_head.weight", "output.weight"),
    ];
    if let Some((_, g)) = fixed.iter().find(|(h, _)| *h == hf) {
        return g.to_string();
    }
    let (layer, rest) = hf
        .strip_prefix("model.layers.")
        .and_then(|r| r.split_once('.'))
        .expect("a layer tensor");
    let module = rest.strip_suffix(".weight").expect("a weight");
    let g = match module {
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        "input_layernorm" => "attn_norm",
        _ => "ffn_norm",
    };
    format!("blk.{layer}.{g}.weight")
}

proptest! {
    #![proptest_config(config(CASES))]

    /// Any bytes, and any bytes after a valid magic and version.
    #[test]
    fn gguf_any_bytes(data in bytes(4096), version in 2u32..4, headed in any::<bool>()) {
        let path = scratch("gguf-bytes").join("x.gguf");
        let mut b = Vec::new();
        if headed {
            b.extend_from_slice(b"GGUF");
            b.extend_from_slice(&version.to_le_bytes());
        }
        b.extend(data);
        open_all(&path, &b);
    }

    /// Structured files: wild counts (`u64::MAX` included), key lengths that lie, every value
    /// type, arrays claiming any length, tensors with any dims, types and offsets.
    #[test]
    fn gguf_structured(file in gguf_file()) {
        let path = scratch("gguf-structured").join("x.gguf");
        open_all(&path, &file);
    }

    /// Complete tiny models (sizes 0–3 or absurd) with an embedded tokenizer of any tokens,
    /// merges, token types and special ids.
    #[test]
    fn gguf_tiny_models(
        d in dims(),
        arch in proptest::sample::select(
            crate::families::gguf_architectures().into_iter().chain(["gpt2"]).collect::<Vec<_>>()
        ),
        tokens in proptest::collection::vec("[a-c ]{0,3}", 0..6),
        merges in proptest::collection::vec("[a-c ]{0,4}", 0..4),
        types in proptest::collection::vec(-1i64..6, 0..7),
        ids in proptest::collection::vec(prop_oneof![0u64..8, wild_u64()], 3),
        pre in proptest::sample::select(
            crate::families::GGUF_PRES.into_iter().chain(["default", "other"]).collect::<Vec<_>>()
        ),
        template in proptest::option::of(".{0,20}"),
    ) {
        let mut w = Writer::default();
        w.str("general.architecture", arch);
        for (k, v) in [
            ("embedding_length", d.hidden),
            ("attention.head_count", d.heads),
            ("attention.head_count_kv", d.kv),
            ("attention.key_length", d.head_dim),
            ("feed_forward_length", d.inter),
            ("block_count", d.layers),
        ] {
            w.u64(&format!("{arch}.{k}"), v as u64);
        }
        w.str("tokenizer.ggml.model", "gpt2");
        w.str("tokenizer.ggml.pre", pre);
        w.strs("tokenizer.ggml.tokens", &tokens);
        w.strs("tokenizer.ggml.merges", &merges);
        w.i64s("tokenizer.ggml.token_type", &types);
        for (k, id) in ["bos", "eos", "padding"].iter().zip(&ids) {
            w.u64(&format!("tokenizer.ggml.{k}_token_id"), *id);
        }
        if let Some(t) = &template {
            w.str("tokenizer.chat_template", t);
        }
        for (name, shape) in d.tensors() {
            w.tensor(&gguf_name(&name), &shape);
        }
        let path = scratch("gguf-tiny").join("x.gguf");
        open_all(&path, &w.finish());
    }
}
