//! `rlft export`: a quickstart run — its `final/` export and one of its checkpoints — and the
//! tiny Qwen2 fixture written as GGUF load back with identical f32 logits and the same
//! tokenizer; bad command lines and sources are clear errors that write nothing.

use burn::tensor::{DType, Device, Int, Tensor, TensorData};
use rlft::model::{ChatMessage, ForwardInput, Pretrained};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A scratch folder for one test, removed at the end.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!("rlft-export-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn rlft(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rlft"))
        .args(args)
        .env_remove("RLFT_DEVICE")
        .output()
        .unwrap()
}

fn ok(o: &Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn load(p: &Path) -> Pretrained {
    Pretrained::load(p, &Device::flex(), DType::F32).unwrap_or_else(|e| panic!("{e}"))
}

/// The logits of `text` (one row).
fn logits(p: &Pretrained, text: &str) -> Vec<f32> {
    let ids = p.tokenizer.encode(text).unwrap();
    let t = Tensor::<2, Int>::from_data(
        TensorData::new(ids.iter().map(|&i| i as i64).collect(), [1, ids.len()]),
        &Device::flex(),
    );
    p.model
        .forward(&ForwardInput::new(t))
        .into_data()
        .convert::<f32>()
        .try_to_vec::<f32>()
        .unwrap()
}

/// `b` computes what `a` computes: the same tokens, bit-identical logits, the same special
/// tokens and chat template.
fn assert_same(a: &Pretrained, b: &Pretrained, what: &str) {
    for text in ["What is 3 + 4? Answer with the number.", "x  12, 3.5\n\tok"] {
        assert_eq!(
            a.tokenizer.encode(text).unwrap(),
            b.tokenizer.encode(text).unwrap(),
            "{what}: tokens of {text:?}"
        );
        assert_eq!(logits(a, text), logits(b, text), "{what}: logits");
    }
    assert_eq!(a.tokenizer.eos_ids, b.tokenizer.eos_ids, "{what}: EOS");
    assert_eq!(a.tokenizer.pad_id, b.tokenizer.pad_id, "{what}: padding");
    let msgs = [ChatMessage::user("What is 7*8?")];
    assert_eq!(
        a.tokenizer.apply_chat_template(&msgs, true).ok(),
        b.tokenizer.apply_chat_template(&msgs, true).ok(),
        "{what}: chat template"
    );
}

#[test]
fn a_quickstart_run_exports_to_gguf_and_loads_back_identically() {
    let tmp = Scratch::new("quickstart");
    let run = tmp.0.join("run");
    let recipe = root().join("recipes/quickstart.toml");
    ok(&rlft(&[
        "train",
        recipe.to_str().unwrap(),
        "--set",
        &format!("output_dir=\"{}\"", run.display()),
        "--set",
        "sft.steps=20",
        "--set",
        "schedule.steps=2",
        "--set",
        "checkpoint.every=2",
        "--set",
        "eval.every=0",
        "--set",
        "logging.progress=false",
    ]));
    let hf = load(&run.join("final"));

    // The run folder exports its final/ model.
    let gguf = tmp.0.join("quickstart.gguf");
    let line = ok(&rlft(&[
        "export",
        run.to_str().unwrap(),
        "--gguf",
        gguf.to_str().unwrap(),
    ]));
    assert!(line.contains("wrote") && line.contains("f32"), "{line}");
    assert_same(&hf, &load(&gguf), "run → GGUF");

    // A checkpoint folder exports the policy it holds: after the last step, the final model.
    let ckpt = tmp.0.join("checkpoint.gguf");
    ok(&rlft(&[
        "export",
        run.join("step-2").to_str().unwrap(),
        "--gguf",
        ckpt.to_str().unwrap(),
    ]));
    assert_same(&hf, &load(&ckpt), "checkpoint → GGUF");

    // Hugging Face out, from the GGUF: the round trip closes.
    let back = tmp.0.join("back");
    ok(&rlft(&[
        "export",
        gguf.to_str().unwrap(),
        "--hf",
        back.to_str().unwrap(),
    ]));
    assert_same(&hf, &load(&back), "GGUF → HF");

    // Smaller types write smaller files that still load.
    for ty in ["f16", "q8_0"] {
        let p = tmp.0.join(format!("quickstart-{ty}.gguf"));
        ok(&rlft(&[
            "export",
            run.to_str().unwrap(),
            "--gguf",
            p.to_str().unwrap(),
            "--type",
            ty,
        ]));
        assert!(std::fs::metadata(&p).unwrap().len() < std::fs::metadata(&gguf).unwrap().len());
        assert_eq!(load(&p).config.num_layers, hf.config.num_layers);
    }
}

#[test]
fn a_qwen2_checkpoint_exports_to_gguf() {
    let tmp = Scratch::new("qwen2");
    let src = root().join("tests/data/fixtures/tiny-qwen2");
    let out = tmp.0.join("qwen2.gguf");
    ok(&rlft(&[
        "export",
        src.to_str().unwrap(),
        "--gguf",
        out.to_str().unwrap(),
    ]));
    let file = rlft::model::GgufFile::open(&out).unwrap();
    assert_eq!(
        file.get("general.architecture").and_then(|v| v.as_str()),
        Some("qwen2")
    );
    // The fixture's tokenizer splits digits before byte-level BPE, as SmolLM's does.
    assert_eq!(
        file.get("tokenizer.ggml.pre").and_then(|v| v.as_str()),
        Some("smollm")
    );
    assert_same(&load(&src), &load(&out), "Qwen2 → GGUF");
}

#[test]
fn bad_exports_are_clear_errors_that_write_nothing() {
    let tmp = Scratch::new("bad");
    let fixture = root().join("tests/data/fixtures/tiny-llama");
    let fixture = fixture.to_str().unwrap();
    let out = tmp.0.join("out.gguf");
    let out_s = out.to_str().unwrap();
    let missing = tmp.0.join("no-such-run");
    let cases: Vec<(Vec<&str>, u8, &str)> = vec![
        (vec!["export"], 2, "one SOURCE expected"),
        (vec!["export", fixture], 2, "exactly one of --gguf"),
        (
            vec!["export", fixture, "--gguf", out_s, "--hf", out_s],
            2,
            "exactly one of --gguf",
        ),
        (
            vec!["export", fixture, "--gguf", out_s, "--type", "q4_k"],
            2,
            "f32, f16 or q8_0",
        ),
        (
            vec!["export", fixture, "--hf", out_s, "--type", "f16"],
            2,
            "--type applies to --gguf",
        ),
        (
            vec!["export", fixture, "--gguf", out_s, "--bits", "4"],
            2,
            "--bits",
        ),
        (
            vec!["export", missing.to_str().unwrap(), "--gguf", out_s],
            2,
            "is not a model",
        ),
    ];
    for (args, code, expect) in cases {
        let o = rlft(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(i32::from(code)), "{args:?}: {err}");
        assert!(err.contains(expect), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(!out.exists(), "{args:?} wrote {out_s}");
    }

    // A family llama.cpp's converter was not checked against: refused before writing.
    let mistral = tmp.0.join("mistral");
    std::fs::create_dir_all(&mistral).unwrap();
    for entry in std::fs::read_dir(fixture).unwrap() {
        let p = entry.unwrap().path();
        std::fs::copy(&p, mistral.join(p.file_name().unwrap())).unwrap();
    }
    let cfg = mistral.join("config.json");
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(&cfg, text.replace("\"llama\"", "\"mistral\"")).unwrap();
    let o = rlft(&["export", mistral.to_str().unwrap(), "--gguf", out_s]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("model_type 'mistral' has no GGUF export"),
        "{err}"
    );
    assert!(!out.exists());
}
