//! Bad input that must cost bounded memory or nothing at all, through the real program: a huge
//! warm-up demonstration or eval prompt is skipped without being tokenised; `rlft export` never
//! writes over the source, over an existing file or into a non-empty folder unasked; settings
//! that do nothing, or two spellings of one `config.json` key that disagree, are refused naming
//! both keys.

#[path = "support/cli.rs"]
mod cli;

use cli::*;
use std::path::Path;
use std::process::Command;

/// `n` small arithmetic rows of `field`, then `extra` lines.
fn jsonl(field: &str, n: usize, extra: &[String]) -> String {
    let mut text = String::new();
    for i in 0..n {
        text.push_str(&format!(
            "{{\"prompt\": \"{i}+1=\", \"answer\": \"{}\", \"{field}\": \"{}\"}}\n",
            i + 1,
            i + 1
        ));
    }
    for line in extra {
        text.push_str(line);
        text.push('\n');
    }
    text
}

/// The values of `key` in the JSON lines of `path`.
fn values(path: &Path, key: &str) -> Vec<f64> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|m| m[key].as_f64())
        .collect()
}

/// The crash recipe into `out` with `sets`, measured.
fn train_measured(out: &Path, sets: &[String]) -> (std::process::ExitStatus, String, u64) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rlft"));
    cmd.args(["train", &recipe(), "--set"])
        .arg(format!("output_dir=\"{}\"", out.display()));
    for set in sets {
        cmd.args(["--set", set]);
    }
    run_measured(cmd)
}

/// A 50 MB demonstration is skipped without being tokenised (and counted in `sft/skipped`), and
/// so is a row that fits in bytes but not in `sft.max_len` tokens; the warm-up trains on the
/// rest.
#[test]
fn a_huge_demonstration_is_skipped_without_tokenising_it() {
    let tmp = Scratch::new();
    let huge = format!(
        "{{\"prompt\": \"7+1=\", \"completion\": \"{}\"}}",
        "8".repeat(50 << 20)
    );
    let long = format!(
        "{{\"prompt\": \"7+2=\", \"completion\": \"{}\"}}",
        "9".repeat(200)
    );
    let data = tmp.file("sft.jsonl", jsonl("completion", 6, &[huge, long]));
    let out = tmp.path("out-sft");
    let (exit, err, peak_kb) = train_measured(
        &out,
        &[
            format!("data.sft=\"{data}\""),
            "sft.steps=2".into(),
            "sft.max_len=64".into(),
            "schedule.steps=1".into(),
        ],
    );
    assert!(exit.success(), "{err}");
    assert!(
        err.contains("sft.max_len"),
        "no note on the skipped rows: {err}"
    );
    let skipped = values(&out.join("sft_metrics.jsonl"), "sft/skipped");
    assert_eq!(skipped, [2.0, 2.0], "sft/skipped per warm-up step");
    // Tokenising 50 MB costs several GB; the text itself a few copies of 50 MB.
    assert!(peak_kb < 1 << 20, "peak memory {} MB", peak_kb >> 10);
}

/// A 50 MB eval prompt is skipped by its length in bytes: evaluation runs on the other
/// problems in bounded memory.
#[test]
fn a_huge_eval_prompt_is_skipped_without_tokenising_it() {
    let tmp = Scratch::new();
    let train = tmp.file("train.jsonl", jsonl("data_source", 6, &[]));
    let huge = format!(
        "{{\"prompt\": \"{}\", \"answer\": \"1\"}}",
        "9".repeat(50 << 20)
    );
    let eval = tmp.file("eval.jsonl", jsonl("data_source", 3, &[huge]));
    let out = tmp.path("out-eval");
    let (exit, err, peak_kb) = train_measured(
        &out,
        &[
            format!("data.train=\"{train}\""),
            format!("data.eval=\"{eval}\""),
            "reward=[{kind = \"exact\"}]".into(),
            "sft.steps=0".into(),
            "schedule.steps=2".into(),
            "eval.every=1".into(),
        ],
    );
    assert!(exit.success(), "{err}");
    let accuracy = values(&out.join("metrics.jsonl"), "eval/accuracy");
    assert!(!accuracy.is_empty(), "no evaluation ran");
    assert!(peak_kb < 1 << 20, "peak memory {} MB", peak_kb >> 10);
}

/// Settings that do nothing, or contradict another, are refused naming both keys; so are
/// demonstration bounds the model cannot hold and a `config.json` whose two spellings of one
/// key disagree. Nothing is written.
#[test]
fn settings_that_do_nothing_are_refused_naming_both_keys() {
    let tmp = Scratch::new();
    let mut cases: Vec<Case> = Vec::new();
    let set = |cases: &mut Vec<Case>, name: &str, sets: &[&str], expect: &[&str]| {
        with_set(cases, &tmp, name, sets, expect)
    };
    set(
        &mut cases,
        "moe_aux_coef negative",
        &["algorithm.moe_aux_coef=-0.01"],
        &["algorithm.moe_aux_coef", "≥ 0"],
    );
    set(
        &mut cases,
        "moe_aux_coef on a dense model",
        &["algorithm.moe_aux_coef=0.01"],
        &[
            "algorithm.moe_aux_coef",
            "no experts",
            "model.scratch.experts",
        ],
    );
    set(
        &mut cases,
        "kl_bias_correction without kl",
        &["algorithm.kl_bias_correction=true", "algorithm.kl_coef=0"],
        &["algorithm.kl_bias_correction", "algorithm.kl_coef"],
    );
    set(
        &mut cases,
        "kl_bias_correction with kl in the reward",
        &[
            "algorithm.kl_bias_correction=true",
            "algorithm.kl_placement=\"reward\"",
        ],
        &["algorithm.kl_bias_correction", "algorithm.kl_placement"],
    );
    set(
        &mut cases,
        "sampling_mask_max_ids without replay",
        &["rollout.sampling_mask_max_ids=64"],
        &["rollout.sampling_mask_max_ids", "algorithm.sampling_mask"],
    );
    set(
        &mut cases,
        "experts_per_token on a dense model",
        &["model.scratch.experts_per_token=4"],
        &["model.scratch.experts_per_token", "model.scratch.experts"],
    );
    set(
        &mut cases,
        "is_threshold without is_level",
        &[
            "algorithm.correction.mode=\"decoupled\"",
            "algorithm.correction.is_threshold=5.0",
        ],
        &["algorithm.correction.is_threshold", "is_level"],
    );
    set(
        &mut cases,
        "rejection_threshold without rejection",
        &[
            "algorithm.correction.mode=\"bypass\"",
            "algorithm.correction.rejection_threshold=2.0",
        ],
        &["algorithm.correction.rejection_threshold", "rejection"],
    );
    set(
        &mut cases,
        "sft.max_len zero",
        &["sft.max_len=0"],
        &["sft.max_len", "at least 1"],
    );
    set(
        &mut cases,
        "sft.max_len past the context",
        &["sft.max_len=5000"],
        &["sft.max_len", "max_position_embeddings = 1024"],
    );
    let every_row_long = tmp.file(
        "all-long.jsonl",
        format!(
            "{{\"prompt\": \"1+1=\", \"completion\": \"{}\"}}\n",
            "2".repeat(300)
        ),
    );
    set(
        &mut cases,
        "no demonstration fits",
        &[
            format!("data.sft=\"{every_row_long}\"").as_str(),
            "sft.max_len=32",
        ],
        &["data.sft", "sft.max_len = 32", "all-long.jsonl"],
    );
    let families = root().join("tests/data/fixtures-families");
    for (name, fixture, edit, expect) in [
        (
            "qwen3-moe experts spelled twice",
            "tiny-qwen3-moe",
            ("num_experts", 4),
            ["'num_experts' (4)", "'num_local_experts' (8)"],
        ),
        (
            "mixtral experts spelled twice",
            "tiny-mixtral",
            ("num_experts", 4),
            ["'num_local_experts' (8)", "'num_experts' (4)"],
        ),
    ] {
        let dir = tmp.copy_dir(&families.join(fixture), &format!("model-{fixture}"));
        edit_config(&dir, |v| v[edit.0] = edit.1.into());
        let path = format!("model.path=\"{}\"", dir.display());
        set(
            &mut cases,
            name,
            &[path.as_str()],
            &[expect[0], expect[1], "config.json"],
        );
    }
    check_all(cases.len(), &run_cases(&cases));
}

/// `rlft export` refuses, before anything is read or written, an empty output path, the source
/// itself, a path over one of the source's files, an existing GGUF file and a non-empty folder
/// (the last two unless `--force`); an existing empty folder is a valid `--hf` target.
#[test]
fn export_never_overwrites_unasked() {
    let tmp = Scratch::new();
    let src = tmp.copy_dir(&tiny_llama(), "source");
    let fingerprint = |dir: &Path| -> Vec<(String, Vec<u8>)> {
        let mut v: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_file())
            .map(|p| {
                (
                    p.file_name().unwrap().to_string_lossy().into_owned(),
                    std::fs::read(&p).unwrap(),
                )
            })
            .collect();
        v.sort();
        v
    };
    let before = fingerprint(&src);
    let existing = tmp.file("existing.gguf", "not a model, but someone's file");
    let full = tmp.path("full");
    tmp.file("full/notes.txt", "keep me");
    let a_file = tmp.file("a-file", "a file");
    let src_s: String = src.to_string_lossy().into();
    let src_s = src_s.as_str();
    let full_s = full.to_string_lossy().into_owned();
    let full_s = full_s.as_str();
    let existing = existing.as_str();
    let a_file = a_file.as_str();
    let in_src = format!("{src_s}/model.safetensors");
    let export = |name: &str, tail: &[&str], expect: &[&str], cwd: Option<&str>| Case {
        name: name.into(),
        args: ["export", src_s]
            .iter()
            .chain(tail)
            .map(|a| a.to_string())
            .collect(),
        env: vec![],
        expect: expect.iter().map(|e| e.to_string()).collect(),
        not_created: None,
        cwd: cwd.map(|c| tmp.path(c)),
    };
    let cases = vec![
        export(
            "hf empty",
            &["--hf", ""],
            &["--hf", "empty"],
            Some("cwd-hf"),
        ),
        export(
            "hf blank",
            &["--hf", "  "],
            &["--hf", "empty"],
            Some("cwd-hf2"),
        ),
        export(
            "gguf empty",
            &["--gguf", ""],
            &["--gguf", "empty"],
            Some("cwd-gguf"),
        ),
        export(
            "hf onto the source",
            &["--hf", src_s],
            &["source itself"],
            None,
        ),
        export(
            "hf onto the source forced",
            &["--hf", src_s, "--force"],
            &["source itself"],
            None,
        ),
        export(
            "gguf over a source file",
            &["--gguf", in_src.as_str(), "--force"],
            &["would overwrite", "model.safetensors"],
            None,
        ),
        export(
            "gguf over a file",
            &["--gguf", existing],
            &["existing.gguf", "--force"],
            None,
        ),
        export(
            "hf into a full folder",
            &["--hf", full_s],
            &["not empty", "--force"],
            None,
        ),
        export("hf onto a file", &["--hf", a_file], &["is a file"], None),
    ];
    check_all(cases.len(), &run_cases(&cases));
    assert_eq!(fingerprint(&src), before, "the source changed");
    assert_eq!(
        std::fs::read_to_string(existing).unwrap(),
        "not a model, but someone's file"
    );
    assert_eq!(fingerprint(&full).len(), 1, "the full folder changed");

    // What is allowed: an existing empty folder, and with --force a full one (its other files
    // kept) and an existing GGUF file.
    let rlft = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_rlft"))
            .args(args)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    };
    let help = Command::new(env!("CARGO_BIN_EXE_rlft"))
        .args(["export", "--help"])
        .output()
        .unwrap();
    assert!(help.status.success());
    assert!(String::from_utf8_lossy(&help.stdout).contains("--force"));
    let empty = tmp.path("empty");
    std::fs::create_dir_all(&empty).unwrap();
    rlft(&["export", src_s, "--hf", &empty.to_string_lossy()]);
    assert!(empty.join("model.safetensors").is_file());
    rlft(&["export", src_s, "--hf", full_s, "--force"]);
    assert!(full.join("config.json").is_file());
    assert_eq!(
        std::fs::read_to_string(full.join("notes.txt")).unwrap(),
        "keep me"
    );
    rlft(&["export", src_s, "--gguf", existing, "--force"]);
    assert!(std::fs::read(existing).unwrap().starts_with(b"GGUF"));
    assert_eq!(fingerprint(&src), before, "the source changed");
}
