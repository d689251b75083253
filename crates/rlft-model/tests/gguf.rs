//! GGUF export and loading: a tiny fixture exported as GGUF the way llama.cpp's converter writes
//! it (q/k rows permuted, tokenizer as vocab + merges + token types) loads to the same logits as
//! the HF folder; truncated files are errors; and, when `models/SmolLM2-135M-Instruct.Q4_1.gguf` exists
//! (`scripts/fetch-smollm2.sh`), the real model continues a known sentence correctly.

use burn::tensor::{DType, Device, Int, Tensor, TensorData};
use rlft_model::{
    ForwardInput, GgufFile, GgufFileType, KvCache, Llama3RopeScaling, ModelError, Pretrained,
    Tokenizer, TransformerConfig,
};
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

/// The largest |a − b|.
fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max)
}

/// Logits of `ids` (one row).
fn logits(p: &Pretrained, ids: &[u32], device: &Device) -> Vec<f32> {
    let t = Tensor::<2, Int>::from_data(
        TensorData::new(ids.iter().map(|&i| i as i64).collect(), [1, ids.len()]),
        device,
    );
    to_vec(p.model.forward(&ForwardInput::new(t)))
}

/// The tiny-llama fixture exported as GGUF (q/k rows permuted, tokenizer as vocab + merges +
/// token types, as llama.cpp's converter writes it) loads back to bit-identical f32 logits and
/// the same tokenizer; f16 and Q8_0 exports load close to it; truncated files are errors.
#[test]
fn gguf_loads_like_the_hf_checkpoint_and_truncation_is_an_error() {
    let device = Device::flex();
    let tmp = std::env::temp_dir().join(format!("rlft-gguf-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let path = tmp.join("tiny-llama.gguf");
    let hf = Pretrained::load(&fixtures().join("tiny-llama"), &device, DType::F32).unwrap();
    hf.save_gguf(&path, GgufFileType::F32).unwrap();
    let file = GgufFile::open(&path).unwrap();
    for key in [
        "general.architecture",
        "llama.context_length",
        "llama.embedding_length",
        "llama.block_count",
        "llama.feed_forward_length",
        "llama.attention.head_count",
        "llama.attention.head_count_kv",
        "llama.rope.freq_base",
        "llama.attention.layer_norm_rms_epsilon",
        "llama.vocab_size",
        "tokenizer.ggml.model",
        "tokenizer.ggml.merges",
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.token_type",
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id",
        "tokenizer.chat_template",
    ] {
        assert!(file.get(key).is_some(), "{key} missing");
    }
    assert_eq!(
        file.get("tokenizer.ggml.pre").and_then(|v| v.as_str()),
        Some("smollm"),
        "the fixture splits digits before byte-level BPE"
    );
    drop(file);

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

    // f16 and Q8_0: the same tokenizer, logits close to the f32 ones.
    let ids = hf.tokenizer.encode("The answer is 42; 7*8=56.").unwrap();
    let want = logits(&hf, &ids, &device);
    // Tolerances relative to the largest logit: f16 keeps 11 significant bits, Q8_0 ~8.
    let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    for (ty, rel) in [(GgufFileType::F16, 5e-3), (GgufFileType::Q8_0, 5e-2)] {
        let p = tmp.join(format!("tiny-llama-{ty}.gguf"));
        hf.save_gguf(&p, ty).unwrap();
        let q = Pretrained::load(&p, &device, DType::F32).unwrap_or_else(|e| panic!("{ty}: {e}"));
        assert_eq!(
            q.tokenizer.encode("7*8=56").unwrap(),
            hf.tokenizer.encode("7*8=56").unwrap()
        );
        let d = max_abs_diff(&logits(&q, &ids, &device), &want);
        println!("{ty}: max |Δ logit| {d:e} of max |logit| {scale}");
        assert!(
            d > 0.0 && d <= rel * scale,
            "{ty}: max |Δ logit| {d} of {scale}"
        );
        assert!(std::fs::metadata(&p).unwrap().len() < std::fs::metadata(&path).unwrap().len());
    }

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

/// New models of each exported architecture — Qwen3 (q/k norms, a head width that is not
/// hidden / heads), Qwen2 (q/k/v biases, tied head), Llama with GQA and with Llama 3 RoPE
/// scaling (`rope_freqs.weight`) — load back from GGUF with the same architecture and
/// bit-identical f32 logits (the scaled one within the converter's f32 divisors).
#[test]
fn every_exported_architecture_loads_back() {
    let device = Device::flex();
    let tmp = std::env::temp_dir().join(format!("rlft-gguf-archs-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let tokenizer = Tokenizer::byte_level();
    let base = TransformerConfig::new(tokenizer.vocab_size(), 64, 96, 2, 4, 2, 16);
    let scaled = base
        .clone()
        .with_rope_theta(500000.0)
        .with_rope_scaling(Some(Llama3RopeScaling {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 64.0,
        }));
    let configs = [
        (
            "qwen3",
            TransformerConfig {
                head_dim: 32,
                ..base.clone()
            }
            .with_model_type("qwen3".into())
            .with_qk_norm(true)
            .with_rope_theta(1e6),
        ),
        (
            "qwen2",
            base.clone()
                .with_model_type("qwen2".into())
                .with_attention_bias(true)
                .with_tie_word_embeddings(true),
        ),
        ("llama", base.clone().with_rms_norm_eps(1e-5)),
        ("llama-scaled", scaled),
    ];
    let text = "What is 12 + 30? 42 . . . . . . . . . . . . . . . . . . . . . . . . . end";
    for (seed, (name, config)) in configs.into_iter().enumerate() {
        let p = Pretrained {
            model: config.init_seeded(&device, seed as u64 + 1),
            config,
            tokenizer: tokenizer.clone(),
        };
        let path = tmp.join(format!("{name}.gguf"));
        p.save_gguf(&path, GgufFileType::F32)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let back =
            Pretrained::load(&path, &device, DType::F32).unwrap_or_else(|e| panic!("{name}: {e}"));
        let ids = p.tokenizer.encode(text).unwrap();
        assert_eq!(back.tokenizer.encode(text).unwrap(), ids, "{name}: tokens");
        let (want, got) = (logits(&p, &ids, &device), logits(&back, &ids, &device));
        let c = (&back.config, &p.config);
        assert_eq!(c.0.model_type, c.1.model_type, "{name}");
        assert_eq!(
            (
                c.0.head_dim,
                c.0.qk_norm,
                c.0.attention_bias,
                c.0.tie_word_embeddings
            ),
            (
                c.1.head_dim,
                c.1.qk_norm,
                c.1.attention_bias,
                c.1.tie_word_embeddings
            ),
            "{name}"
        );
        if name == "llama-scaled" {
            assert_eq!(c.0.rope_scaling, c.1.rope_scaling, "{name}");
            let d = max_abs_diff(&got, &want);
            assert!(d <= 1e-4, "{name}: max |Δ logit| {d}");
        } else {
            assert_eq!(got, want, "{name}: logits");
        }
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
