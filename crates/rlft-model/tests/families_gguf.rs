//! The family fixtures as llama.cpp's own converter writes them
//! (`tests/data/fixtures-families-gguf`, made by `scripts/families_to_gguf.py`): each file loads
//! with its tokenizer, and its logits equal transformers' on the model llama.cpp reads from the
//! file (`<name>.json`, within 1e-4), and exports to a Hugging Face folder that loads to the same
//! model. `RLFT_FAMILY_GGUF_DIR` points at another set.

mod common;

use burn::tensor::{DType, Device};
use common::*;
use rlft_model::{ForwardInput, Pretrained};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn gguf_fixtures() -> PathBuf {
    std::env::var_os("RLFT_FAMILY_GGUF_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/fixtures-families-gguf")
        })
}

/// Every `.gguf` of the set with its reference, sorted.
fn files() -> Vec<(PathBuf, Value)> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(gguf_fixtures())
        .expect("GGUF fixtures folder")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "gguf"))
        .collect();
    paths.sort();
    assert!(!paths.is_empty(), "no GGUF files in {:?}", gguf_fixtures());
    paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(p.with_extension("json")).expect("reference");
            (p, serde_json::from_str(&text).expect("json"))
        })
        .collect()
}

#[test]
fn every_converted_family_matches_transformers() {
    let device = Device::flex();
    let mut families = Vec::new();
    for (path, reference) in files() {
        let name = path.file_stem().and_then(|n| n.to_str()).unwrap_or("?");
        let p = Pretrained::load(&path, &device, DType::F32).unwrap_or_else(|e| panic!("{e}"));
        families.push(p.config.model_type.clone());
        for (i, case) in reference["cases"]
            .as_array()
            .expect("cases")
            .iter()
            .enumerate()
        {
            let input_ids = ids(&case["input_ids"]);
            let n = input_ids.len();
            let input = ForwardInput::new(int2(input_ids, [1, n], &device));
            let (got, _) = logits(&p.model, input);
            let diff = max_diff(&got, &floats(&case["logits"]));
            println!(
                "{name} ({}) case {i}: {n} tokens, max |Δlogit| = {diff:.2e}",
                p.config.model_type
            );
            assert!(diff < 1e-4, "{name} case {i}: max |Δlogit| = {diff}");
        }
        // `rlft export FILE.gguf --hf DIR`: the folder loads to the same model.
        let out = std::env::temp_dir().join(format!("rlft-gguf-hf-{name}-{}", std::process::id()));
        p.save_hf(&out).unwrap_or_else(|e| panic!("{name}: {e}"));
        let hf = Pretrained::load(&out, &device, DType::F32).unwrap_or_else(|e| panic!("{e}"));
        let ids: Vec<i64> = (0..24).map(|i| (i * 37 + 5) % 300).collect();
        let input = || ForwardInput::new(int2(ids.clone(), [1, 24], &device));
        let diff = max_diff(&logits(&hf.model, input()).0, &logits(&p.model, input()).0);
        assert!(diff < 1e-5, "{name}: exported to HF, max |Δlogit| = {diff}");
        std::fs::remove_dir_all(&out).ok();
    }
    families.sort();
    families.dedup();
    println!("families: {families:?}");
}

/// A GGUF of a family loads to the same model as its HF folder where llama.cpp's reading of the
/// file agrees with transformers' (every fixture the converter writes without overrides).
#[test]
fn converted_files_load_the_weights_of_their_source() {
    let device = Device::flex();
    let hf_root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/fixtures-families");
    let mut compared = 0;
    for (path, reference) in files() {
        let overrides = reference["overrides"].as_object().expect("overrides");
        let source = hf_root.join(reference["source"].as_str().expect("source"));
        if !overrides.is_empty() || !source.is_dir() {
            continue;
        }
        let gguf = Pretrained::load(&path, &device, DType::F32).unwrap_or_else(|e| panic!("{e}"));
        let hf = Pretrained::load(&source, &device, DType::F32).unwrap_or_else(|e| panic!("{e}"));
        let ids: Vec<i64> = (0..24).map(|i| (i * 37 + 5) % 300).collect();
        let input = || ForwardInput::new(int2(ids.clone(), [1, 24], &device));
        let diff = max_diff(
            &logits(&gguf.model, input()).0,
            &logits(&hf.model, input()).0,
        );
        assert!(
            diff < 1e-5,
            "{path:?}: max |Δlogit| vs the HF folder = {diff}"
        );
        compared += 1;
    }
    assert!(compared > 0, "no converted fixture without overrides");
}

/// A SentencePiece vocabulary as llama.cpp's converter writes it (`tokenizer.ggml.model =
/// llama`: pieces, scores, token types; `tests/data/spm-gguf`, `scripts/spm_gguf_fixture.py`)
/// encodes every text to the ids SentencePiece gives it (byte fallback, spaces, newlines,
/// accents, CJK and emoji) and decodes them back as SentencePiece does; the model loads with it.
#[test]
fn sentencepiece_vocabularies_encode_as_sentencepiece() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/spm-gguf");
    let path = dir.join("tiny-llama-spm.gguf");
    let p = Pretrained::load(&path, &Device::flex(), DType::F32).unwrap_or_else(|e| panic!("{e}"));
    let text = std::fs::read_to_string(dir.join("tokens.json")).expect("tokens.json");
    let reference: Value = serde_json::from_str(&text).expect("json");
    let cases = reference["cases"].as_array().expect("cases");
    assert!(cases.len() >= 5);
    for case in cases {
        let text = case["text"].as_str().expect("text");
        let want: Vec<u32> = ids(&case["ids"]).into_iter().map(|i| i as u32).collect();
        let got = p.tokenizer.encode(text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(got, want, "{text:?}");
        let back = p
            .tokenizer
            .decode(&got, false)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, case["decoded"].as_str().expect("decoded"), "{text:?}");
    }
    assert_eq!(
        (p.tokenizer.bos_id, p.tokenizer.eos_ids.clone()),
        (Some(1), vec![2])
    );
}
