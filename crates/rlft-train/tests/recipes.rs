//! Every recipe in `recipes/` runs for 2 steps on a tiny model (so recipes never rot); an
//! interrupted and resumed run repeats an uninterrupted one exactly; bad recipes fail early with
//! useful messages.

use rlft_train::{Recipe, Trainer, checkpoint};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tiny_llama() -> PathBuf {
    std::env::var_os("RLFT_FIXTURES_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("../shared/fixtures"))
        .join("tiny-llama")
}

fn tmp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("rlft-train-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Overrides that shrink any recipe to a 2-step smoke run.
fn smoke(out: &Path, model_path: Option<&Path>) -> Vec<String> {
    let mut o = vec![
        format!("output_dir=\"{}\"", out.display()),
        "device=\"flex\"".into(),
        "schedule.steps=2".into(),
        "schedule.warmup_steps=0".into(),
        "sft.steps=2".into(),
        "sft.batch_size=4".into(),
        "rollout.prompts_per_step=2".into(),
        "rollout.group_size=2".into(),
        "rollout.max_new_tokens=16".into(),
        "rollout.max_total_tokens=32".into(),
        "eval.size=4".into(),
        "eval.k=1".into(),
        "eval.every=0".into(),
        "checkpoint.every=1".into(),
        "logging.progress=false".into(),
    ];
    if let Some(p) = model_path {
        o.push(format!("model.path=\"{}\"", p.display()));
    }
    o
}

#[test]
fn every_recipe_runs_two_steps() {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(root().join("recipes")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        let out = tmp(&name);
        let base = Recipe::load(&path, &[]).unwrap_or_else(|e| panic!("{name}: {e}"));
        let model = (!base.model.path.is_empty()).then(tiny_llama);
        let recipe = Recipe::load(&path, &smoke(&out, model.as_deref()))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let summary = Trainer::new(recipe, None)
            .and_then(|mut t| t.run(None))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(summary.steps, 2, "{name}");
        let metrics = rlft_train::metrics::read_metrics(&out.join("metrics.jsonl")).unwrap();
        let steps: Vec<u64> = metrics
            .iter()
            .map(|m| m["step"].as_u64().unwrap())
            .collect();
        assert_eq!(steps, [0, 1, 2], "{name}");
        for key in [
            "reward/mean",
            "reward/std",
            "accuracy",
            "response_len/mean",
            "response_len/max",
            "clip_frac/low",
            "clip_frac/high",
            "kl",
            "entropy",
            "grad_norm",
            "lr",
            "tokens_per_s",
            "time/generate_s",
            "time/score_s",
            "time/train_s",
            "groups/filtered",
        ] {
            assert!(metrics[1].contains_key(key), "{name}: {key} missing");
        }
        let acc = metrics[2]["eval/accuracy"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&acc), "{name}: eval/accuracy {acc}");
        assert!(
            metrics[0].contains_key("eval/accuracy"),
            "{name}: eval at RL step 0"
        );
        assert!(
            out.join("final/model.safetensors").exists(),
            "{name}: exported"
        );
        assert!(out.join("latest").exists(), "{name}: checkpoint");
        names.push(name);
        std::fs::remove_dir_all(&out).ok();
    }
    names.sort();
    assert_eq!(
        names,
        [
            "cispo-smollm2-arith",
            "ctpo-smollm2-tool",
            "dapo-smollm2-arith",
            "grpo-smollm2-arith",
            "gspo-smollm2-arith",
            "ppo-critic-tiny",
            "quickstart"
        ]
    );
}

/// Interrupt after the first step (as Ctrl-C does), resume, and compare with a run that was
/// never interrupted: every metric except throughput and timings is bit-identical.
#[test]
fn resume_repeats_an_uninterrupted_run_exactly() {
    let path = root().join("recipes/quickstart.toml");
    let overrides = |out: &Path| {
        let mut o = smoke(out, None);
        o.push("schedule.steps=3".into());
        o.push("eval.every=2".into());
        o
    };
    let a = tmp("resume-a");
    Trainer::new(Recipe::load(&path, &overrides(&a)).unwrap(), None)
        .unwrap()
        .run(None)
        .unwrap();
    let b = tmp("resume-b");
    let stop = Arc::new(AtomicBool::new(true));
    let s = Trainer::new(Recipe::load(&path, &overrides(&b)).unwrap(), None)
        .unwrap()
        .run(Some(stop))
        .unwrap();
    assert!(s.interrupted);
    assert_eq!(s.steps, 1);
    assert_eq!(
        checkpoint::read_state(&checkpoint::locate(&b).unwrap())
            .unwrap()
            .step,
        1
    );
    let s = Trainer::new(Recipe::load(&path, &overrides(&b)).unwrap(), Some(&b))
        .unwrap()
        .run(None)
        .unwrap();
    assert_eq!(s.steps, 3);
    let strip = |dir: &Path| {
        rlft_train::metrics::read_metrics(&dir.join("metrics.jsonl"))
            .unwrap()
            .into_iter()
            .map(|mut m| {
                m.retain(|k, _| k != "tokens_per_s" && !k.starts_with("time/"));
                m
            })
            .collect::<Vec<_>>()
    };
    let (ma, mb) = (strip(&a), strip(&b));
    assert_eq!(ma.len(), 4);
    assert_eq!(ma, mb);
    std::fs::remove_dir_all(&a).ok();
    std::fs::remove_dir_all(&b).ok();
}

#[test]
fn bad_recipes_fail_before_loading_a_model() {
    let path = root().join("recipes/quickstart.toml");
    let err = |o: &[&str]| {
        let o: Vec<String> = o.iter().map(|s| s.to_string()).collect();
        Recipe::load(&path, &o).unwrap_err().to_string()
    };
    assert!(err(&["algorithm.kl_cof=0.1"]).contains("did you mean 'algorithm.kl_coef'"));
    assert!(err(&["rollout.top_p=1.5"]).contains("top_p"));
    assert!(err(&["algorithm.loss=\"grpoo\""]).contains("grpo"));
    assert!(err(&["optimizer.lr=-1"]).contains("optimizer.lr"));
    assert!(err(&["schedule.kind=\"step\""]).contains("constant, linear_warmup, linear or cosine"));
    assert!(err(&["algorithm.advantage=\"gae\""]).contains("model.critic"));
    assert!(err(&["nonsense"]).contains("KEY=VALUE"));
    assert!(err(&["sft.teacher_error=1.5"]).contains("sft.teacher_error: must be in [0, 1]"));
    assert!(
        err(&["sft.schedule=\"step\""])
            .contains("sft.schedule: 'step': use constant, linear_warmup, linear or cosine")
    );
    assert!(err(&["sft.min_lr_ratio=2.0"]).contains("sft.min_lr_ratio: must be in [0, 1], got 2"));
    assert!(err(&["task.name=\"countdown\""]).contains("only the arithmetic task"));
    // A missing model file is reported by the trainer, not a panic.
    let out = tmp("bad-model");
    let r = Recipe::load(
        &path,
        &[
            format!("output_dir=\"{}\"", out.display()),
            "model.path=\"/nope.gguf\"".into(),
        ],
    )
    .unwrap();
    assert!(Trainer::new(r, None).is_err());
    std::fs::remove_dir_all(&out).ok();
}

/// File, then `RLFT__SECTION__KEY`, then `--set`.
#[test]
fn environment_and_set_override_the_file() {
    let path = root().join("recipes/quickstart.toml");
    // SAFETY: no other test reads RLFT__EVAL__K without overriding eval.k with --set.
    unsafe { std::env::set_var("RLFT__EVAL__K", "3") };
    let from_env = Recipe::load(&path, &[]).unwrap();
    let from_set = Recipe::load(&path, &["eval.k=2".to_string()]).unwrap();
    unsafe { std::env::remove_var("RLFT__EVAL__K") };
    assert_eq!(from_env.eval.k, 3);
    assert_eq!(from_set.eval.k, 2);
    assert_eq!(
        Recipe::load(&path, &[]).unwrap().eval.k,
        4,
        "the file's value"
    );
    // PyTorch's AdamW epsilon, not burn's 1e-5.
    assert_eq!(Recipe::default().optimizer.eps, 1e-8);
}
