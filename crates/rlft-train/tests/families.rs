//! Every model family trains: a 2-step GRPO run at lag 0 on each checkpoint of
//! `tests/data/fixtures-families` (`RLFT_FAMILY_FIXTURES_DIR` points at another set), with π_old
//! recomputed on the learner's packed rows, finds the learner's log-probs of the sampled tokens
//! equal to the sampler's μ within 5e-5 on every step — sliding windows, soft-caps, partial
//! rotary and expert routing agree between the sampler's KV-cache decoding and the learner —
//! and router replay keeps the mixtures of experts on the sampler's experts.

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

/// The metrics of the steps of a 2-step GRPO run on `dir` with `extra` overrides.
fn two_steps(dir: &Path, tag: &str, extra: &[&str]) -> Vec<rlft_train::metrics::StepMetrics> {
    let name = dir.file_name().unwrap().to_string_lossy().to_string();
    let out = std::env::temp_dir().join(format!(
        "rlft-family-grpo-{name}-{tag}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&out);
    let mut o: Vec<String> = vec![
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
    o.extend(extra.iter().map(|s| s.to_string()));
    let recipe = Recipe::load(&root().join("recipes/quickstart.toml"), &o)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    Trainer::new(recipe, None)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .run(None)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let m = rlft_train::metrics::read_metrics(&out.join("metrics.jsonl")).unwrap();
    std::fs::remove_dir_all(&out).ok();
    let steps: Vec<_> = m
        .into_iter()
        .filter(|r| r["step"].as_u64() > Some(0))
        .collect();
    assert_eq!(steps.len(), 2, "{name}: two steps");
    steps
}

#[test]
fn lag_zero_learner_logprobs_equal_mu_for_every_family() {
    for dir in family_dirs() {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        for row in two_steps(&dir, "lag0", &[]) {
            let gap = row["offpolicy/max_abs_log_ratio"]
                .as_f64()
                .unwrap_or_else(|| panic!("{name}: no offpolicy/max_abs_log_ratio"));
            println!(
                "{name} step {}: max |log π_old − log μ| = {gap:.2e}",
                row["step"]
            );
            assert!(gap <= 5e-5, "{name} step {}: {gap}", row["step"]);
            let finite = row["grad_norm"].as_f64().is_some_and(f64::is_finite);
            assert!(finite, "{name}");
        }
    }
}

/// Router replay on every mixture of experts: the update passes use the sampler's experts
/// (`moe/routing_mismatch` 0 on every step, the drift reported), and at lag 0 the learner's
/// log-probs still equal μ; without replay the passes use their own top-k (mismatch = drift);
/// on a dense model the setting is refused before anything is written.
#[test]
fn router_replay_keeps_the_sampler_experts() {
    let mut moe = 0;
    for dir in family_dirs() {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let config = rlft_model::TransformerConfig::from_hf_file(&dir.join("config.json")).unwrap();
        if config.moe.is_none() {
            continue;
        }
        moe += 1;
        for replay in [true, false] {
            let set = format!("algorithm.router_replay={replay}");
            for row in two_steps(&dir, &format!("r3-{replay}"), &[&set]) {
                let get = |k: &str| row[k].as_f64().unwrap_or_else(|| panic!("{name}: no {k}"));
                let (mismatch, drift) = (get("moe/routing_mismatch"), get("moe/router_drift"));
                println!(
                    "{name} replay={replay} step {}: mismatch {mismatch}, drift {drift}",
                    row["step"]
                );
                if replay {
                    assert_eq!(mismatch, 0.0, "{name}");
                } else {
                    assert_eq!(mismatch, drift, "{name}: the pass's own top-k");
                }
                let gap = get("offpolicy/max_abs_log_ratio");
                assert!(gap <= 5e-5, "{name}: {gap}");
            }
        }
    }
    assert!(moe > 0, "no mixture of experts among the fixtures");
    // The load-balancing loss trains and is reported.
    let dir = family_dirs()
        .into_iter()
        .find(|d| {
            rlft_model::TransformerConfig::from_hf_file(&d.join("config.json"))
                .is_ok_and(|c| c.moe.is_some())
        })
        .unwrap();
    for row in two_steps(&dir, "aux", &["algorithm.moe_aux_coef=0.01"]) {
        let aux = row["moe/aux_loss"].as_f64().expect("moe/aux_loss");
        assert!(aux.is_finite() && aux > 0.0, "{aux}");
    }
    let out = std::env::temp_dir().join(format!("rlft-r3-dense-{}", std::process::id()));
    let o = vec![
        format!("output_dir=\"{}\"", out.display()),
        "algorithm.router_replay=true".to_string(),
    ];
    let recipe = Recipe::load(&root().join("recipes/quickstart.toml"), &o).unwrap();
    let err = Trainer::new(recipe, None)
        .err()
        .expect("a dense model refuses router replay");
    assert!(err.to_string().contains("algorithm.router_replay"), "{err}");
    assert!(!out.exists(), "nothing written");
}
