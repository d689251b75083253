//! Property tests: rlft's readers of untrusted files (GGUF, safetensors, `config.json`,
//! `tokenizer.json`, `tokenizer_config.json`) return `Ok` or `Err` on any input, never panic and
//! never allocate from an untrusted length. Arbitrary bytes first, then structured generators
//! that get past the magic numbers and first checks.

mod gguf;
mod hf;

use proptest::prelude::*;
use serde_json::Value;
use std::path::PathBuf;

/// Cases per property: enough to reach the structured corners in a few seconds of a debug build.
const CASES: u32 = 256;

/// The proptest configuration of these tests (no regression files: fixed panics get plain
/// unit tests next to the code).
fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// A fresh, empty scratch folder for one test.
fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rlft-fuzz-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create a scratch folder");
    dir
}

/// Bytes of any kind.
fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..max)
}

/// Integers a reader should be wary of: small, zero, at type limits, huge.
fn wild_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 0u64..8,
        1 => Just(u64::MAX),
        1 => Just(u64::MAX - 1),
        1 => Just(1u64 << 24),
        1 => Just((1u64 << 24) + 1),
        1 => Just(1u64 << 32),
        1 => Just(1u64 << 62),
        1 => Just(1u64 << 63),
        2 => any::<u64>(),
    ]
}

/// A JSON number of a surprising kind (negative, fractional, huge, at a type limit).
fn wild_number() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => (0u64..6).prop_map(Value::from),
        1 => wild_u64().prop_map(Value::from),
        1 => any::<i64>().prop_map(Value::from),
        1 => Just(Value::from(-1)),
        1 => Just(Value::from(i64::MIN)),
        1 => any::<f64>().prop_map(Value::from),
        1 => Just(Value::from(1e300)),
        1 => Just(Value::from(0.5)),
    ]
}

/// Any JSON value, a few levels deep.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        wild_number(),
        ".{0,10}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 5, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            proptest::collection::btree_map(".{0,8}", inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A JSON object whose keys come mostly from `known`, each with a value of a random type.
fn json_object_of(known: &'static [&'static str]) -> impl Strategy<Value = Value> {
    let key = prop_oneof![
        8 => proptest::sample::select(known).prop_map(String::from),
        1 => "[a-z_]{0,8}",
    ];
    let value = prop_oneof![
        3 => wild_number(),
        1 => json_value(),
        1 => proptest::sample::select(
            ["", "silu", "llama3", "default", "gelu"]
                .into_iter()
                .chain(crate::families::model_types())
                .collect::<Vec<_>>()
        )
        .prop_map(Value::from),
    ];
    proptest::collection::btree_map(key, value, 0..known.len() + 2)
        .prop_map(|m| Value::Object(m.into_iter().collect()))
}

/// The sizes of a tiny decoder; each is 0–3 or, rarely, absurdly large (reachable with every
/// tensor empty when another size is 0).
#[derive(Debug, Clone)]
struct Dims {
    vocab: usize,
    hidden: usize,
    inter: usize,
    layers: usize,
    heads: usize,
    kv: usize,
    head_dim: usize,
    tie: bool,
}

/// A size: mostly 1–3, sometimes 0 or absurdly large.
fn size() -> impl Strategy<Value = usize> {
    prop_oneof![
        12 => 1usize..4,
        1 => Just(0usize),
        1 => Just(1usize << 40),
        1 => Just(usize::MAX / 2 + 1),
    ]
}

/// Sizes that mostly make a consistent config (query heads a multiple of the kv heads, an even
/// head width), so that loading gets as far as the tensors.
fn dims() -> impl Strategy<Value = Dims> {
    (
        (size(), size(), size(), size()),
        (
            size(),
            prop_oneof![6 => 1usize..3, 1 => size()],
            prop_oneof![6 => Just(2usize), 2 => Just(4usize), 1 => Just(3usize), 1 => size()],
            any::<bool>(),
        ),
    )
        .prop_map(
            |((vocab, hidden, inter, layers), (kv, group, head_dim, tie))| Dims {
                vocab,
                hidden,
                inter,
                layers,
                heads: kv.saturating_mul(group),
                kv,
                head_dim,
                tie,
            },
        )
}

impl Dims {
    /// Every tensor a Llama with these sizes has, HF names and row-major shapes (the first
    /// two layers at most), with shapes that overflow dropped.
    fn tensors(&self) -> Vec<(String, Vec<usize>)> {
        let (d, q, kv) = (
            self.hidden,
            self.heads.checked_mul(self.head_dim),
            self.kv.checked_mul(self.head_dim),
        );
        let mut out = vec![
            ("model.embed_tokens.weight".to_string(), vec![self.vocab, d]),
            ("model.norm.weight".to_string(), vec![d]),
        ];
        if !self.tie {
            out.push(("lm_head.weight".into(), vec![self.vocab, d]));
        }
        for i in 0..self.layers.min(2) {
            let p = format!("model.layers.{i}");
            let mut add = |n: &str, s: Option<Vec<usize>>| {
                if let Some(s) = s {
                    out.push((format!("{p}.{n}"), s));
                }
            };
            add("self_attn.q_proj.weight", q.map(|q| vec![q, d]));
            add("self_attn.k_proj.weight", kv.map(|kv| vec![kv, d]));
            add("self_attn.v_proj.weight", kv.map(|kv| vec![kv, d]));
            add("self_attn.o_proj.weight", q.map(|q| vec![d, q]));
            add("mlp.gate_proj.weight", Some(vec![self.inter, d]));
            add("mlp.up_proj.weight", Some(vec![self.inter, d]));
            add("mlp.down_proj.weight", Some(vec![d, self.inter]));
            add("input_layernorm.weight", Some(vec![d]));
            add("post_attention_layernorm.weight", Some(vec![d]));
        }
        out
    }

    /// The `config.json` describing these sizes.
    fn config_json(&self) -> Value {
        serde_json::json!({
            "model_type": crate::families::default_family().model_type(),
            "vocab_size": self.vocab,
            "hidden_size": self.hidden,
            "intermediate_size": self.inter,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv,
            "head_dim": self.head_dim,
            "tie_word_embeddings": self.tie,
        })
    }
}

/// Elements of `shape`, if the product fits and is small enough to write out.
fn small_numel(shape: &[usize]) -> Option<usize> {
    shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .filter(|&n| n <= 4096)
}
