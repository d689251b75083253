//! Hugging Face checkpoint folders: `model.safetensors` (and its sharded index), `config.json`,
//! `tokenizer.json` with `tokenizer_config.json` and `generation_config.json`.

use super::*;
use crate::{Tokenizer, Transformer, TransformerConfig};
use burn::tensor::{DType, Device};
use std::path::Path;

const CONFIG_KEYS: &[&str] = &[
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "rms_norm_eps",
    "rope_theta",
    "rope_parameters",
    "rope_scaling",
    "tie_word_embeddings",
    "attention_bias",
    "max_position_embeddings",
    "hidden_act",
];

const TENSOR_NAMES: &[&str] = &[
    "model.embed_tokens.weight",
    "model.norm.weight",
    "lm_head.weight",
    "model.layers.0.self_attn.q_proj.weight",
    "model.layers.0.mlp.down_proj.weight",
    "__metadata__",
];

const DTYPES: &[&str] = &[
    "F32", "F16", "BF16", "F64", "I8", "U8", "I64", "BOOL", "F8_E4M3", "F4", "f32", "", "X",
];

/// A `config.json` for a 1-layer model of width 2 whose tensors the generators below name.
const TINY_CONFIG: &str = r#"{"vocab_size":2,"hidden_size":2,"intermediate_size":2,"num_hidden_layers":1,
    "num_attention_heads":1,"num_key_value_heads":1,"head_dim":2}"#;

/// Writes `files` (name, contents) into `dir` after clearing it of earlier cases' files.
fn write_dir(dir: &Path, files: &[(&str, &[u8])]) {
    for name in [
        "config.json",
        "model.safetensors",
        "model.safetensors.index.json",
        "shard.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
        "chat_template.jinja",
    ] {
        let _ = std::fs::remove_file(dir.join(name));
    }
    for (name, bytes) in files {
        std::fs::write(dir.join(name), bytes).expect("write a scratch file");
    }
}

/// Loads the folder the way `Pretrained::load` does for the weights; only panics matter.
fn load(dir: &Path) {
    let _ = Transformer::from_hf_dir(dir, &Device::default(), DType::F32);
}

/// A safetensors file: 8-byte little-endian header length (`header_len`, or the true one),
/// the JSON header, then `data`.
fn safetensors(header: &[u8], header_len: Option<u64>, data: &[u8]) -> Vec<u8> {
    let len = header_len.unwrap_or(header.len() as u64);
    let mut out = len.to_le_bytes().to_vec();
    out.extend_from_slice(header);
    out.extend_from_slice(data);
    out
}

/// A well-formed safetensors file holding `tensors` (name, dtype, shape, data) back to back.
fn safetensors_of(tensors: &[(String, String, Vec<Value>, Vec<u8>)]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, dtype, shape, bytes) in tensors {
        let begin = data.len();
        data.extend_from_slice(bytes);
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [begin, data.len()]}),
        );
    }
    let header = Value::Object(header).to_string();
    safetensors(header.as_bytes(), None, &data)
}

/// One header entry: a tensor description with any dtype, shape (huge products included) and
/// offsets (past the end, reversed, overflowing), or a value that is not a description at all.
fn header_entry() -> impl Strategy<Value = Value> {
    let dim = prop_oneof![4 => wild_u64().prop_map(Value::from), 1 => wild_number()];
    let shape = proptest::collection::vec(dim, 0..4);
    let offset = prop_oneof![3 => 0u64..64, 1 => wild_u64()];
    let entry = (
        proptest::sample::select(DTYPES),
        shape,
        offset.clone(),
        offset,
    )
        .prop_map(|(dtype, shape, begin, end)| {
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [begin, end]})
        });
    prop_oneof![6 => entry, 1 => json_value()]
}

/// Bytes per element ×2 of the dtypes safetensors knows (F4 is half a byte), 0 for the others.
fn half_bytes(dtype: &str) -> u64 {
    match dtype {
        "F64" | "I64" => 16,
        "F32" => 8,
        "F16" | "BF16" => 4,
        "I8" | "U8" | "BOOL" | "F8_E4M3" => 2,
        "F4" => 1,
        _ => 0,
    }
}

/// A well-formed file of up to four tensors (known names, any dtype, small shapes, often the
/// ones the tiny config asks for, exactly the data they need), then one corruption: a dim made huge, offsets reversed, past the end
/// or at `u64::MAX`, a wrong header length, a cut.
fn near_valid_safetensors() -> impl Strategy<Value = Vec<u8>> {
    let tensor = (
        prop_oneof![4 => proptest::sample::select(TENSOR_NAMES).prop_map(String::from), 1 => "[a-z.]{0,6}"],
        prop_oneof![6 => proptest::sample::select(&["F32", "F16", "BF16"][..]), 1 => proptest::sample::select(DTYPES)],
        prop_oneof![
            3 => Just(vec![2u64, 2]),
            1 => Just(vec![2u64]),
            3 => proptest::collection::vec(prop_oneof![6 => 1u64..3, 1 => Just(0u64)], 0..3),
        ],
    );
    (
        proptest::collection::vec(tensor, 0..4),
        0u8..8,
        any::<proptest::sample::Index>(),
        wild_u64(),
    )
        .prop_map(|(tensors, corruption, at, wild)| {
            let mut header = serde_json::Map::new();
            let mut data = Vec::new();
            for (name, dtype, shape) in tensors {
                let numel: u64 = shape.iter().product();
                let begin = data.len() as u64;
                data.resize(data.len() + (numel * half_bytes(dtype)).div_ceil(2) as usize, 0x3c);
                let entry = serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [begin, data.len()]});
                header.insert(name, entry);
            }
            let keys: Vec<String> = header.keys().cloned().collect();
            let mut header_len = None;
            if let Some(key) = (!keys.is_empty()).then(|| &keys[at.index(keys.len())]) {
                let e = &mut header[key];
                match corruption {
                    0 => e["shape"] = serde_json::json!([wild, 2]),
                    1 => e["data_offsets"] = serde_json::json!([8, 4]),
                    2 => e["data_offsets"][1] = Value::from(wild),
                    3 => e["data_offsets"] = serde_json::json!([wild, wild]),
                    4 => header_len = Some(wild),
                    _ => {}
                }
            }
            let header = Value::Object(header).to_string();
            let mut file = safetensors(header.as_bytes(), header_len, &data);
            if corruption == 5 {
                file.truncate(at.index(file.len() + 1));
            }
            file
        })
}

proptest! {
    #![proptest_config(config(CASES))]

    /// Nearly valid files: mostly F32/F16/BF16 tensors the tiny config asks for, with exact
    /// data, then one corruption.
    #[test]
    fn safetensors_near_valid(file in near_valid_safetensors()) {
        let dir = scratch("st-near");
        write_dir(&dir, &[("config.json", TINY_CONFIG.as_bytes()), ("model.safetensors", &file)]);
        load(&dir);
    }

    /// Any bytes as `model.safetensors` next to a valid `config.json`.
    #[test]
    fn safetensors_any_bytes(data in bytes(4096)) {
        let dir = scratch("st-bytes");
        write_dir(&dir, &[("config.json", TINY_CONFIG.as_bytes()), ("model.safetensors", &data)]);
        load(&dir);
    }

    /// A header length of any size (huge included) before JSON headers describing tensors with
    /// any dtype, shape and offsets, followed by some data.
    #[test]
    fn safetensors_any_header(
        entries in proptest::collection::btree_map(
            prop_oneof![3 => proptest::sample::select(TENSOR_NAMES).prop_map(String::from), 1 => ".{0,6}"],
            header_entry(),
            0..5,
        ),
        header_len in prop_oneof![4 => Just(None), 1 => wild_u64().prop_map(Some)],
        pad in proptest::collection::vec(Just(b' '), 0..9),
        data in bytes(256),
    ) {
        let mut header = Value::Object(entries.into_iter().collect()).to_string().into_bytes();
        header.extend(pad);
        let dir = scratch("st-header");
        let file = safetensors(&header, header_len, &data);
        write_dir(&dir, &[("config.json", TINY_CONFIG.as_bytes()), ("model.safetensors", &file)]);
        load(&dir);
    }

    /// Checkpoints of every tiny size (zero and absurd sizes included), each tensor with the
    /// shape the config implies unless that shape is too large to write; one tensor then gets
    /// a random dtype and another a random shape.
    #[test]
    fn tiny_checkpoints_of_any_size(
        d in dims(),
        retype in any::<proptest::sample::Index>(),
        dtype in proptest::sample::select(DTYPES),
        reshape in any::<proptest::sample::Index>(),
        shape in proptest::collection::vec(0u64..4, 0..3),
        mutate in any::<bool>(),
    ) {
        let mut tensors: Vec<(String, String, Vec<Value>, Vec<u8>)> = d
            .tensors()
            .into_iter()
            .map(|(name, shape)| match small_numel(&shape) {
                Some(n) => (name, "F32".into(), shape.iter().map(|&s| Value::from(s)).collect(), vec![0; 4 * n]),
                None => (name, "F32".into(), vec![Value::from(1)], vec![0; 4]),
            })
            .collect();
        if mutate && !tensors.is_empty() {
            let i = retype.index(tensors.len());
            tensors[i].1 = dtype.into();
            let j = reshape.index(tensors.len());
            tensors[j].2 = shape.into_iter().map(Value::from).collect();
        }
        let dir = scratch("st-tiny");
        let config = d.config_json().to_string();
        write_dir(&dir, &[("config.json", config.as_bytes()), ("model.safetensors", &safetensors_of(&tensors))]);
        load(&dir);
    }

    /// Any `model.safetensors.index.json`: arbitrary JSON or a `weight_map` whose values are
    /// anything (missing shards, the folder itself, absolute paths, non-strings).
    #[test]
    fn sharded_index_any_json(
        index in prop_oneof![
            json_value(),
            proptest::collection::btree_map(
                proptest::sample::select(TENSOR_NAMES).prop_map(String::from),
                prop_oneof![
                    3 => proptest::sample::select(&["shard.safetensors", "missing.safetensors", "", ".", "/", "config.json"][..]).prop_map(Value::from),
                    1 => json_value(),
                ],
                0..4,
            ).prop_map(|m| serde_json::json!({"weight_map": m})),
        ],
        shard in bytes(64),
    ) {
        let dir = scratch("st-index");
        let index = index.to_string();
        write_dir(&dir, &[
            ("config.json", TINY_CONFIG.as_bytes()),
            ("model.safetensors.index.json", index.as_bytes()),
            ("shard.safetensors", &shard),
        ]);
        load(&dir);
    }

    /// Any bytes as `config.json` (through the file reader) and any text (through the parser).
    #[test]
    fn config_json_any_bytes(data in bytes(1024), text in ".{0,256}") {
        let dir = scratch("config-bytes");
        write_dir(&dir, &[("config.json", &data)]);
        let _ = TransformerConfig::from_hf_file(&dir.join("config.json"));
        let _ = TransformerConfig::from_hf_json(&text);
    }

    /// `config.json` objects with the known keys holding values of any type (negative, huge,
    /// fractional, strings, nested objects).
    #[test]
    fn config_json_any_fields(
        obj in json_object_of(CONFIG_KEYS),
        rope in json_object_of(&["rope_type", "type", "rope_theta", "factor", "low_freq_factor",
            "high_freq_factor", "original_max_position_embeddings"]),
    ) {
        let mut obj = obj;
        if let Value::Object(m) = &mut obj
            && m.contains_key("rope_scaling")
        {
            m.insert("rope_scaling".into(), rope);
        }
        let _ = TransformerConfig::from_hf_json(&obj.to_string());
    }

    /// Any bytes as `tokenizer.json`.
    #[test]
    fn tokenizer_json_any_bytes(data in bytes(2048)) {
        let dir = scratch("tok-bytes");
        write_dir(&dir, &[("tokenizer.json", &data)]);
        let _ = Tokenizer::from_hf_dir(&dir);
    }

    /// A valid `tokenizer.json` with `tokenizer_config.json` and `generation_config.json` of any
    /// JSON (or bytes), special tokens of any type and any chat template text.
    #[test]
    fn tokenizer_side_files_any_json(
        cfg in prop_oneof![
            json_object_of(&["bos_token", "eos_token", "pad_token", "chat_template", "unk_token"]),
            json_value(),
        ],
        generation in prop_oneof![json_object_of(&["eos_token_id", "bos_token_id"]), json_value()],
        raw in bytes(64),
        use_raw in any::<bool>(),
        template in proptest::option::of(".{0,40}"),
    ) {
        let dir = scratch("tok-side");
        write_dir(&dir, &[]);
        Tokenizer::byte_level().save(&dir).expect("save the byte-level tokenizer");
        let _ = std::fs::remove_file(dir.join("chat_template.jinja"));
        let cfg = if use_raw { raw } else { cfg.to_string().into_bytes() };
        std::fs::write(dir.join("tokenizer_config.json"), cfg).unwrap();
        std::fs::write(dir.join("generation_config.json"), generation.to_string()).unwrap();
        if let Some(t) = template {
            std::fs::write(dir.join("chat_template.jinja"), t).unwrap();
        }
        let _ = Tokenizer::from_hf_dir(&dir);
    }
}

/// Loads a folder of `config` and F32 tensors of `shapes` (zeros); the error it gives.
fn load_err(tag: &str, config: Value, shapes: &[(&str, &[u64])]) -> String {
    let tensors: Vec<_> = shapes
        .iter()
        .map(|(name, shape)| {
            let n: u64 = shape.iter().product();
            let dims = shape.iter().map(|&d| Value::from(d)).collect();
            (
                name.to_string(),
                "F32".to_string(),
                dims,
                vec![0; 4 * n as usize],
            )
        })
        .collect();
    let dir = scratch(tag);
    let config = config.to_string();
    write_dir(
        &dir,
        &[
            ("config.json", config.as_bytes()),
            ("model.safetensors", &safetensors_of(&tensors)),
        ],
    );
    let e = Transformer::from_hf_dir(&dir, &Device::default(), DType::F32)
        .expect_err("the checkpoint is rejected");
    e.to_string()
}

fn config_of(hidden: u64, layers: u64, head_dim: u64) -> Value {
    serde_json::json!({"vocab_size": 1, "hidden_size": hidden, "intermediate_size": 1,
        "num_hidden_layers": layers, "num_attention_heads": 1, "head_dim": head_dim,
        "tie_word_embeddings": true})
}

/// Regression (found by the property tests): `hidden_size` 0 made every tensor empty and the
/// first linear layer panicked splitting its rows into chunks of width 0.
#[test]
fn zero_hidden_size_is_an_error() {
    let e = load_err(
        "zero-hidden",
        config_of(0, 1, 2),
        &[("model.embed_tokens.weight", &[1, 0])],
    );
    assert!(
        e.contains("config.json") && e.contains("hidden_size is 0"),
        "{e}"
    );
}

/// Regression: with no layers nothing in the file bounds `head_dim`, and the RoPE table of
/// 2^39 entries aborted the process on allocation.
#[test]
fn zero_layers_are_an_error() {
    let e = load_err(
        "zero-layers",
        config_of(1, 0, 1 << 40),
        &[
            ("model.embed_tokens.weight", &[1, 1]),
            ("model.norm.weight", &[1]),
        ],
    );
    assert!(e.contains("num_hidden_layers is 0"), "{e}");
}

/// Regression: a layer count of 2^40 was reserved up front (capacity overflow) before any
/// layer's tensors were looked up.
#[test]
fn huge_layer_count_fails_on_the_first_missing_layer() {
    let e = load_err(
        "huge-layers",
        config_of(1, 1 << 40, 2),
        &[("model.embed_tokens.weight", &[1, 1])],
    );
    assert!(
        e.contains("missing tensor 'model.layers.0.self_attn.q_proj.weight'"),
        "{e}"
    );
}
