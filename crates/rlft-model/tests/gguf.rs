//! GGUF loading: a tiny fixture rewritten as GGUF the way llama.cpp's converter writes it (q/k
//! rows permuted, tokenizer as vocab + merges + token types) loads to the same logits as the HF
//! folder; truncated files are errors; and, when `models/SmolLM2-135M-Instruct.Q4_1.gguf` exists
//! (`scripts/fetch-smollm2.sh`), the real model continues a known sentence correctly.

use burn::tensor::{DType, Device, Int, Tensor, TensorData};
use rlft_model::{ForwardInput, GgufFile, KvCache, ModelError, Pretrained, Tokenizer};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    std::env::var_os("RLFT_FIXTURES_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/fixtures"))
}

fn to_vec(t: Tensor<3>) -> Vec<f32> {
    t.into_data()
        .convert::<f32>()
        .try_to_vec::<f32>()
        .expect("f32")
}

/// Minimal GGUF v3 writer for tests.
#[derive(Default)]
struct Writer {
    kv: Vec<u8>,
    n_kv: u64,
    tensors: Vec<(String, Vec<u64>, Vec<f32>)>,
}

fn put_str(b: &mut Vec<u8>, s: &str) {
    b.extend_from_slice(&(s.len() as u64).to_le_bytes());
    b.extend_from_slice(s.as_bytes());
}

impl Writer {
    fn key(&mut self, k: &str, ty: u32) {
        put_str(&mut self.kv, k);
        self.kv.extend_from_slice(&ty.to_le_bytes());
        self.n_kv += 1;
    }
    fn u32(&mut self, k: &str, v: u32) {
        self.key(k, 4);
        self.kv.extend_from_slice(&v.to_le_bytes());
    }
    fn f32(&mut self, k: &str, v: f32) {
        self.key(k, 6);
        self.kv.extend_from_slice(&v.to_le_bytes());
    }
    fn str(&mut self, k: &str, v: &str) {
        self.key(k, 8);
        put_str(&mut self.kv, v);
    }
    fn strs(&mut self, k: &str, v: &[String]) {
        self.key(k, 9);
        self.kv.extend_from_slice(&8u32.to_le_bytes());
        self.kv.extend_from_slice(&(v.len() as u64).to_le_bytes());
        for s in v {
            put_str(&mut self.kv, s);
        }
    }
    fn i32s(&mut self, k: &str, v: &[i32]) {
        self.key(k, 9);
        self.kv.extend_from_slice(&5u32.to_le_bytes());
        self.kv.extend_from_slice(&(v.len() as u64).to_le_bytes());
        for x in v {
            self.kv.extend_from_slice(&x.to_le_bytes());
        }
    }
    /// `shape` in row-major (HF) order; stored as F32 with GGUF's reversed dims.
    fn tensor(&mut self, name: &str, shape: &[usize], values: Vec<f32>) {
        let dims = shape.iter().rev().map(|&d| d as u64).collect();
        self.tensors.push((name.into(), dims, values));
    }
    fn finish(self) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        b.extend_from_slice(&self.n_kv.to_le_bytes());
        b.extend_from_slice(&self.kv);
        let mut offset = 0u64;
        for (name, dims, values) in &self.tensors {
            put_str(&mut b, name);
            b.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                b.extend_from_slice(&d.to_le_bytes());
            }
            b.extend_from_slice(&0u32.to_le_bytes());
            b.extend_from_slice(&offset.to_le_bytes());
            offset += (values.len() as u64 * 4).div_ceil(32) * 32;
        }
        while !b.len().is_multiple_of(32) {
            b.push(0);
        }
        for (_, _, values) in &self.tensors {
            for v in values {
                b.extend_from_slice(&v.to_le_bytes());
            }
            while !b.len().is_multiple_of(32) {
                b.push(0);
            }
        }
        b
    }
}

/// llama.cpp's q/k row permutation (convert_hf_to_gguf.py `LlamaModel.permute`).
fn permute(w: &[f32], heads: usize, cols: usize) -> Vec<f32> {
    let hd = w.len() / cols / heads;
    let mut out = vec![0.0; w.len()];
    for h in 0..heads {
        for k in 0..2 {
            for j in 0..hd / 2 {
                let (src, dst) = (h * hd + k * hd / 2 + j, h * hd + 2 * j + k);
                out[dst * cols..(dst + 1) * cols].copy_from_slice(&w[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

/// Writes the tiny-llama fixture as a llama-architecture GGUF with an embedded tokenizer.
fn tiny_llama_gguf(path: &Path) {
    let dir = fixtures().join("tiny-llama");
    let device = Device::flex();
    let hf = Pretrained::load(&dir, &device, DType::F32).expect("load fixture");
    let c = &hf.config;
    let mut w = Writer::default();
    w.str("general.architecture", "llama");
    w.u32("llama.embedding_length", c.hidden_size as u32);
    w.u32("llama.block_count", c.num_layers as u32);
    w.u32("llama.feed_forward_length", c.intermediate_size as u32);
    w.u32("llama.attention.head_count", c.num_heads as u32);
    w.u32("llama.attention.head_count_kv", c.num_kv_heads as u32);
    w.u32("llama.context_length", c.max_position_embeddings as u32);
    w.f32(
        "llama.attention.layer_norm_rms_epsilon",
        c.rms_norm_eps as f32,
    );
    w.f32("llama.rope.freq_base", c.rope_theta as f32);
    // Tokenizer: vocab and merges from tokenizer.json, added tokens as control tokens.
    let tj: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("tokenizer.json")).unwrap())
            .unwrap();
    let vocab = tj["model"]["vocab"].as_object().unwrap();
    let mut tokens = vec![String::new(); hf.tokenizer.vocab_size()];
    for (t, id) in vocab {
        tokens[id.as_u64().unwrap() as usize] = t.clone();
    }
    let mut types = vec![1i32; tokens.len()];
    for a in tj["added_tokens"].as_array().unwrap() {
        let id = a["id"].as_u64().unwrap() as usize;
        tokens[id] = a["content"].as_str().unwrap().into();
        types[id] = 3;
    }
    let merges: Vec<String> = tj["model"]["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| match m {
            Value::String(s) => s.clone(),
            Value::Array(p) => format!("{} {}", p[0].as_str().unwrap(), p[1].as_str().unwrap()),
            _ => panic!("merge"),
        })
        .collect();
    w.str("tokenizer.ggml.model", "gpt2");
    w.str("tokenizer.ggml.pre", "default");
    w.strs("tokenizer.ggml.tokens", &tokens);
    w.i32s("tokenizer.ggml.token_type", &types);
    w.strs("tokenizer.ggml.merges", &merges);
    w.u32("tokenizer.ggml.bos_token_id", hf.tokenizer.bos_id.unwrap());
    w.u32("tokenizer.ggml.eos_token_id", hf.tokenizer.eos_ids[0]);
    w.u32(
        "tokenizer.ggml.padding_token_id",
        hf.tokenizer.pad_id.unwrap(),
    );
    w.str(
        "tokenizer.chat_template",
        hf.tokenizer.chat_template.as_ref().unwrap().source(),
    );
    for (name, shape, values) in hf.model.hf_tensors() {
        let g = name
            .replace("model.embed_tokens", "token_embd")
            .replace("model.norm", "output_norm")
            .replace("lm_head", "output")
            .replace("model.layers.", "blk.")
            .replace("self_attn.q_proj", "attn_q")
            .replace("self_attn.k_proj", "attn_k")
            .replace("self_attn.v_proj", "attn_v")
            .replace("self_attn.o_proj", "attn_output")
            .replace("mlp.gate_proj", "ffn_gate")
            .replace("mlp.up_proj", "ffn_up")
            .replace("mlp.down_proj", "ffn_down")
            .replace("post_attention_layernorm", "ffn_norm")
            .replace("input_layernorm", "attn_norm");
        let values = if g.contains("attn_q.") {
            permute(&values, c.num_heads, shape[1])
        } else if g.contains("attn_k.") {
            permute(&values, c.num_kv_heads, shape[1])
        } else {
            values
        };
        w.tensor(&g, &shape, values);
    }
    std::fs::write(path, w.finish()).expect("write gguf");
}

#[test]
fn gguf_loads_like_the_hf_checkpoint_and_truncation_is_an_error() {
    let device = Device::flex();
    let tmp = std::env::temp_dir().join(format!("rlft-gguf-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let path = tmp.join("tiny-llama.gguf");
    tiny_llama_gguf(&path);

    let hf = Pretrained::load(&fixtures().join("tiny-llama"), &device, DType::F32).unwrap();
    let gg = Pretrained::load(&path, &device, DType::F32).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(gg.config.num_kv_heads, hf.config.num_kv_heads);
    assert!(!gg.config.tie_word_embeddings);
    let expected: Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("tiny-llama/expected.json")).unwrap(),
    )
    .unwrap();
    for case in expected["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let ids = gg.tokenizer.encode(text).unwrap();
        assert_eq!(
            ids,
            hf.tokenizer.encode(text).unwrap(),
            "tokenizer from GGUF"
        );
        let n = ids.len();
        let t = Tensor::<2, Int>::from_data(
            TensorData::new(ids.iter().map(|&i| i as i64).collect(), [1, n]),
            &device,
        );
        let input = ForwardInput::new(t);
        assert_eq!(
            to_vec(gg.model.forward(&input)),
            to_vec(hf.model.forward(&input)),
            "logits from GGUF (q/k un-permuted) equal the HF ones"
        );
    }
    assert_eq!(gg.tokenizer.eos_ids, hf.tokenizer.eos_ids);
    let msgs = [rlft_model::ChatMessage::user("What is 7*8?")];
    assert_eq!(
        gg.tokenizer.apply_chat_template(&msgs, true).unwrap(),
        hf.tokenizer.apply_chat_template(&msgs, true).unwrap()
    );

    let bytes = std::fs::read(&path).unwrap();
    for cut in [10, 100, bytes.len() / 3, bytes.len() - 1] {
        let p = tmp.join(format!("cut-{cut}.gguf"));
        std::fs::write(&p, &bytes[..cut]).unwrap();
        let e = Pretrained::load(&p, &device, DType::F32).unwrap_err();
        assert!(matches!(e, ModelError::Weights { .. }), "cut {cut}: {e}");
        assert!(e.to_string().contains("truncated"), "cut {cut}: {e}");
    }
    std::fs::remove_dir_all(&tmp).ok();
}

fn smollm2_path() -> Option<PathBuf> {
    let p = std::env::var_os("RLFT_SMOLLM2_GGUF")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf")
        });
    if p.exists() {
        Some(p)
    } else {
        println!(
            "skipped: {} not found; run scripts/fetch-smollm2.sh to fetch SmolLM2-135M-Instruct",
            p.display()
        );
        None
    }
}

#[test]
fn smollm2_gguf_continues_armstrong_and_tokenizes_like_its_export() {
    let Some(path) = smollm2_path() else { return };
    let device = Device::flex();
    let p = Pretrained::load(&path, &device, DType::F32).unwrap_or_else(|e| panic!("{e}"));
    let tok = &p.tokenizer;
    assert_eq!(
        tok.eos_ids,
        vec![2],
        "eos is <|im_end|> per the GGUF metadata"
    );
    assert_eq!(tok.bos_id, Some(1));

    // The smollm pre-tokenizer splits digits first: "  2" → ["ĠĠ", "2"], not ["Ġ", "Ġ2"].
    let ids = tok.encode("x  2").unwrap();
    let pieces: Vec<String> = ids.iter().map(|&i| tok.id_to_token(i).unwrap()).collect();
    assert_eq!(pieces, ["x", "ĠĠ", "2"]);

    // The tokenizer.json it exports encodes identically.
    let tmp = std::env::temp_dir().join(format!("rlft-smol-tok-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    tok.save(&tmp).unwrap();
    let exported = Tokenizer::from_hf_dir(&tmp).unwrap();
    for s in [
        "What is 23+45? Answer with the number.",
        "x  2 and   17, 3.14159 1,000,000",
        "The quick brown fox\n\n  jumps 12 times.\t9",
        "<|im_start|>user\nHi<|im_end|>\n",
    ] {
        assert_eq!(tok.encode(s).unwrap(), exported.encode(s).unwrap(), "{s:?}");
        assert_eq!(tok.decode(&tok.encode(s).unwrap(), false).unwrap(), s);
    }
    std::fs::remove_dir_all(&tmp).ok();

    let prompt = tok
        .encode("In 1969, Neil Armstrong became the first person to")
        .unwrap();
    let mut ids: Vec<i64> = prompt.iter().map(|&i| i as i64).collect();
    let mut cache = KvCache::new();
    let mut input = ForwardInput::new(Tensor::from_data(
        TensorData::new(ids.clone(), [1, ids.len()]),
        &device,
    ));
    let mut new = Vec::new();
    for _ in 0..6 {
        let logits = p.model.forward_cached(&input, &mut cache);
        let [_, l, _] = logits.dims();
        let next = logits
            .narrow(1, l - 1, 1)
            .argmax(2)
            .into_data()
            .convert::<i64>()
            .try_to_vec::<i64>()
            .unwrap()[0];
        new.push(next as u32);
        ids.push(next);
        input = ForwardInput {
            input_ids: Tensor::from_data(TensorData::new(vec![next], [1, 1]), &device),
            position_ids: Tensor::from_data(
                TensorData::new(vec![ids.len() as i64 - 1], [1, 1]),
                &device,
            ),
            attention_mask: None,
            segment_ids: None,
            prefix_ids: None,
        };
    }
    let text = tok.decode(&new, false).unwrap();
    println!("SmolLM2 greedy continuation: {text:?}");
    assert!(text.starts_with(" walk on the moon"), "{text:?}");
    let file = GgufFile::open(&path).unwrap();
    assert_eq!(file.version, 3);
}
