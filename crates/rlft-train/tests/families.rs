//! Every model family trains: a 2-step GRPO run at lag 0 on each checkpoint of
//! `tests/data/fixtures-families` (`RLFT_FAMILY_FIXTURES_DIR` points at another set), with π_old
//! recomputed on the learner's packed rows, finds the learner's log-probs of the sampled tokens
//! equal to the sampler's μ within 5e-5 on every step — sliding windows, soft-caps, partial
//! rotary and expert routing agree between the sampler's KV-cache decoding and the learner.

use rlft_train::{Recipe, Trainer};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn family_dirs() -> Vec<PathBuf> {
    let base = std::env::var_os("RLFT_FAMILY_FIXTURES_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("tests/data/fixtures-families"));
    let mut out: Vec<PathBuf> = std::fs::read_dir(&base)
        .expect("family fixtures folder")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("config.json").exists())
        .collect();
    out.sort();
    assert!(!out.is_empty(), "no fixtures in {base:?}");
    out
}

#[test]
fn lag_zero_learner_logprobs_equal_mu_for_every_family() {
    for dir in family_dirs() {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let out =
            std::env::temp_dir().join(format!("rlft-family-grpo-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out);
        let o: Vec<String> = vec![
            format!("output_dir=\"{}\"", out.display()),
            format!("model.path=\"{}\"", dir.display()),
            "device=\"flex\"".into(),
            "schedule.steps=2".into(),
            "schedule.warmup_steps=0".into(),
            "sft.steps=0".into(),
            "rollout.prompts_per_step=2".into(),
            "rollout.group_size=2".into(),
            "rollout.max_new_tokens=12".into(),
            "rollout.max_total_tokens=12".into(),
            "eval.every=0".into(),
            "checkpoint.every=0".into(),
            "logging.progress=false".into(),
            "algorithm.correction.mode=\"recompute\"".into(),
        ];
        let recipe = Recipe::load(&root().join("recipes/quickstart.toml"), &o)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        Trainer::new(recipe, None)
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .run(None)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let m = rlft_train::metrics::read_metrics(&out.join("metrics.jsonl")).unwrap();
        let steps: Vec<_> = m.iter().filter(|r| r["step"].as_u64() > Some(0)).collect();
        assert_eq!(steps.len(), 2, "{name}: two steps");
        for row in steps {
            let gap = row["offpolicy/max_abs_log_ratio"]
                .as_f64()
                .unwrap_or_else(|| panic!("{name}: no offpolicy/max_abs_log_ratio"));
            println!(
                "{name} step {}: max |log π_old − log μ| = {gap:.2e}",
                row["step"]
            );
            assert!(gap <= 5e-5, "{name} step {}: {gap}", row["step"]);
            assert!(
                row["grad_norm"].as_f64().is_some_and(f64::is_finite),
                "{name}"
            );
        }
        std::fs::remove_dir_all(&out).ok();
    }
}
