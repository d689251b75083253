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
        .unwrap_or_else(|| root().join("tests/data/fixtures"))
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

/// `recipes/custom-loss.toml` names a loss that `examples/custom_reward.rs` registers: the
/// trainer with the built-in losses refuses it before writing anything, listing the registered
/// names; a trainer that registers the name (here as a preset of the PPO-clip loss) runs it.
fn custom_loss_trainer(recipe: Recipe) -> rlft_train::Result<Trainer> {
    let out = recipe.output_dir.clone();
    let err = Trainer::new(recipe.clone(), None)
        .err()
        .expect("the built-ins lack the custom loss")
        .to_string();
    for needle in ["algorithm.loss", "truncated_is_pg", "grpo", "dapo", "cispo"] {
        assert!(err.contains(needle), "no {needle:?} in: {err}");
    }
    assert!(!out.exists(), "a refused recipe wrote {}", out.display());
    let mut ext = rlft_train::Extensions::default();
    ext.registry
        .register_preset(rlft_algo::loss::Preset::new("truncated_is_pg", "ppo"))?;
    Trainer::with_extensions(recipe, None, ext)
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
        if name == "plugin-loss" {
            // Its loss and table are registered by examples/plugin_loss.rs (whose test trains
            // from it); the built-ins refuse the table, listing the losses they have.
            let err = Recipe::load(&path, &[]).unwrap_err().to_string();
            for needle in [
                "algorithm.clamped_is_pg",
                "grpo",
                "vespo ([algorithm.vespo])",
            ] {
                assert!(err.contains(needle), "no {needle:?} in: {err}");
            }
            names.push(name);
            continue;
        }
        // Paths in a recipe are relative to where rlft runs (the repository root); a test runs
        // in its crate's folder.
        let text = std::fs::read_to_string(&path)
            .unwrap()
            .replace("\"recipes/", &format!("\"{}/recipes/", root().display()));
        let base = Recipe::from_toml_str(&text, &[]).unwrap_or_else(|e| panic!("{name}: {e}"));
        let model = (!base.model.path.is_empty()).then(tiny_llama);
        let recipe = Recipe::from_toml_str(&text, &smoke(&out, model.as_deref()))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let summary = if name == "custom-loss" {
            custom_loss_trainer(recipe)
        } else {
            Trainer::new(recipe, None)
        }
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
        if name == "own-data" {
            // Both terms of its own data scored every step, the scorer program included.
            for key in ["reward/exact", "reward/terse"] {
                assert!(metrics[1].contains_key(key), "{name}: {key} missing");
            }
            assert_eq!(metrics[1]["reward/failed"].as_f64(), Some(0.0), "{name}");
        }
        if name == "quickstart" {
            // A sync run: every picture is written; those without data say why.
            let files = rlft_train::plot::plot_run(&out, None).unwrap();
            for stem in ["ratio_fan", "staleness", "offpolicy", "timeline"] {
                for ext in ["png", "svg"] {
                    let f = out.join(format!("{stem}.{ext}"));
                    assert!(files.contains(&f), "{} not written", f.display());
                }
            }
        }
        names.push(name);
        std::fs::remove_dir_all(&out).ok();
    }
    names.sort();
    assert_eq!(
        names,
        [
            "cispo-smollm2-arith",
            "ctpo-smollm2-tool",
            "custom-loss",
            "dapo-smollm2-arith",
            "grpo-async-smollm2-arith",
            "grpo-smollm2-arith",
            "gspo-smollm2-arith",
            "own-data",
            "plugin-loss",
            "ppo-critic-tiny",
            "quickstart",
            "quickstart-moe",
            "staleness-testbed"
        ]
    );
}

/// Interrupt during the warm-up and at its end (as Ctrl-C does), resume, and compare with a
/// run that was never interrupted: every metric except throughput and timings is bit-identical.
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
    // Asked to stop from the start: the warm-up stops after its first step...
    let s = Trainer::new(Recipe::load(&path, &overrides(&b)).unwrap(), None)
        .unwrap()
        .run(Some(stop.clone()))
        .unwrap();
    assert!(s.interrupted);
    assert_eq!((s.steps, s.warmup_steps), (0, Some(1)));
    let state = checkpoint::read_state(&checkpoint::locate(&b).unwrap()).unwrap();
    assert_eq!((state.sft_done, state.sft_step), (false, 1));
    // ...then, resumed, the warm-up ends (its last step is not cut: `step-0` is its end's
    // checkpoint) and the run stops before RL's first step...
    let s = Trainer::new(Recipe::load(&path, &overrides(&b)).unwrap(), Some(&b))
        .unwrap()
        .run(Some(stop))
        .unwrap();
    assert!(s.interrupted);
    assert_eq!((s.steps, s.warmup_steps), (0, None));
    let state = checkpoint::read_state(&checkpoint::locate(&b).unwrap()).unwrap();
    assert_eq!((state.sft_done, state.step), (true, 0));
    // ...and runs to the end.
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

/// A trainer that drives the loop itself: steps, evaluation, a checkpoint and the shutdown of
/// the async workers through the public API, and the checkpoint resumes.
#[test]
fn a_hand_driven_loop_evaluates_checkpoints_and_shuts_down() {
    let path = root().join("recipes/quickstart.toml");
    let out = tmp("hand-driven");
    let mut o = smoke(&out, None);
    o.push("async.mode=\"async\"".into());
    let mut t = Trainer::new(Recipe::load(&path, &o).unwrap(), None).unwrap();
    t.train_step().unwrap();
    t.train_step().unwrap();
    let eval = t.evaluate().unwrap();
    let acc = eval["eval/accuracy"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&acc), "{eval:?}");
    assert!(eval.contains_key("eval/mean@1") && !eval.contains_key("eval/mean_at_k"));
    let dir = t.save_checkpoint().unwrap();
    assert_eq!(checkpoint::read_state(&dir).unwrap().step, 2);
    t.shutdown().unwrap();
    drop(t);
    // The checkpoint continues the run: a third step from where it stopped.
    let mut t = Trainer::new(Recipe::load(&path, &o).unwrap(), Some(&out)).unwrap();
    t.train_step().unwrap();
    t.shutdown().unwrap();
    std::fs::remove_dir_all(&out).ok();
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
    let e = err(&["algorithm.correction.prox=\"loglinear\""]);
    assert!(
        e.contains("algorithm.correction.prox") && e.contains("decoupled"),
        "{e}"
    );
    let e = err(&["algorithm.correction.opsm=\"trl\""]);
    assert!(e.contains("opsm_delta"), "{e}");
    // A loss's table is read by its settings type: keys and ranges, whatever the run's loss.
    let e = err(&["algorithm.vespo.pos=[0.0, 1.0]"]);
    assert!(
        e.contains("algorithm.vespo.pos") && e.contains("> 0"),
        "{e}"
    );
    let e = err(&["algorithm.clip_cov.poss=1.0"]);
    assert!(
        e.contains("did you mean 'algorithm.clip_cov.ub'") || e.contains("algorithm.clip_cov.lb"),
        "{e}"
    );
    let e = err(&["algorithm.sapo.tau_pos=\"warm\""]);
    assert!(e.contains("algorithm.sapo.tau_pos"), "{e}");
    let e = err(&["algorithm.no_such_loss.x=1"]);
    assert!(
        e.contains("algorithm.no_such_loss") && e.contains("registered losses"),
        "{e}"
    );
    // Loss-dependent settings are checked against the loss the trainer resolves, before it
    // writes anything.
    let trainer_err = |o: &[&str]| {
        let o: Vec<String> = o.iter().map(|s| s.to_string()).collect();
        match Trainer::new(Recipe::load(&path, &o).unwrap(), None) {
            Ok(_) => panic!("{o:?} trained"),
            Err(e) => e.to_string(),
        }
    };
    let e = trainer_err(&["algorithm.vespo.pos=[2.0, 3.0]"]);
    assert!(e.contains("algorithm.vespo") && e.contains("'grpo'"), "{e}");
    let e = trainer_err(&["algorithm.prime_rl.kl_tau=0.01"]);
    assert!(e.contains("algorithm.prime_rl.kl_tau"), "{e}");
    let e = err(&["algorithm.top_entropy_quantile=1.5"]);
    assert!(e.contains("algorithm.top_entropy_quantile"), "{e}");
    let e = err(&["algorithm.correction.kpop_threshold=0.4"]);
    assert!(e.contains("algorithm.correction.kpop_threshold"), "{e}");
    let e = err(&[
        "algorithm.correction.mode=\"decoupled\"",
        "algorithm.correction.kpop_level=\"seq_mean\"",
    ]);
    assert!(e.contains("kpop_level"), "{e}");
    let e = err(&["algorithm.correction.m2po_threshold=0.04"]);
    assert!(
        e.contains("algorithm.correction.m2po_threshold") && e.contains("decoupled"),
        "{e}"
    );
    let e = err(&["algorithm.correction.train_versions=\"current\""]);
    assert!(
        e.contains("algorithm.correction.train_versions") && e.contains("async.interruptible"),
        "{e}"
    );
    let e = err(&["algorithm.sampling_mask=\"replay\""]);
    assert!(
        e.contains("algorithm.sampling_mask") && e.contains("top_k"),
        "{e}"
    );
    let e = err(&[
        "algorithm.sampling_mask=\"replay\"",
        "rollout.top_p=0.9",
        "rollout.sampling_mask_max_ids=0",
    ]);
    assert!(e.contains("rollout.sampling_mask_max_ids"), "{e}");
    let e = err(&["algorithm.sampling_mask=\"kept\""]);
    assert!(e.contains("sampling_mask") && e.contains("replay"), "{e}");
    let e = err(&["algorithm.outside_mass_coef=0.5"]);
    assert!(
        e.contains("algorithm.outside_mass_coef") && e.contains("replay"),
        "{e}"
    );
    let e = err(&[
        "algorithm.sampling_mask=\"replay\"",
        "rollout.top_p=0.9",
        "algorithm.outside_mass_coef=-1",
    ]);
    assert!(e.contains("algorithm.outside_mass_coef"), "{e}");
    // The loss is looked up in the registry the run uses: a name the built-ins lack loads, and
    // the trainer (here `validate`, which it runs first) refuses it, listing the known names.
    let unknown = Recipe::load(&path, &["algorithm.loss=\"grpoo\"".into()]).unwrap();
    let e = unknown.validate().unwrap_err().to_string();
    assert!(e.contains("algorithm.loss") && e.contains("grpo"), "{e}");
    assert!(err(&["optimizer.lr=-1"]).contains("optimizer.lr"));
    let e = err(&["schedule.kind=\"step\""]);
    assert!(
        e.contains("schedule.kind") && e.contains("`linear_warmup`, `linear`, `cosine`"),
        "{e}"
    );
    let e = err(&["algorithm.kl_placement=\"both\""]);
    assert!(
        e.contains("algorithm.kl_placement") && e.contains("`reward`"),
        "{e}"
    );
    assert!(err(&["algorithm.advantage=\"gae\""]).contains("model.critic"));
    assert!(err(&["nonsense"]).contains("KEY=VALUE"));
    assert!(err(&["sft.teacher_error=1.5"]).contains("sft.teacher_error: must be in [0, 1]"));
    let e = err(&["sft.schedule=\"step\""]);
    assert!(e.contains("sft.schedule") && e.contains("`cosine`"), "{e}");
    assert!(err(&["sft.min_lr_ratio=2.0"]).contains("sft.min_lr_ratio: must be in [0, 1], got 2"));
    assert!(err(&["task.name=\"countdown\""]).contains("only the arithmetic task"));
    let e = err(&["algorithm.clip_low=-0.1"]);
    assert!(e.contains("algorithm.clip_low") && e.contains("≥ 0"), "{e}");
    let e = err(&["rollout.max_prompt_len=0"]);
    assert!(
        e.contains("rollout.max_prompt_len") && e.contains("at least 1"),
        "{e}"
    );
    let e = err(&["sft.batch_size=0"]);
    assert!(
        e.contains("sft.batch_size") && e.contains("sft.steps = 0"),
        "{e}"
    );
    // Off-policy correction settings are checked before any model loads.
    let e = err(&["algorithm.correction.is_level=\"token\""]);
    assert!(
        e.contains("algorithm.correction.is_level") && e.contains("decoupled"),
        "{e}"
    );
    let e = err(&[
        "algorithm.correction.mode=\"decoupled\"",
        "algorithm.correction.rejection=[\"token_k7\"]",
    ]);
    assert!(
        e.contains("algorithm.correction.rejection") && e.contains("token_k1"),
        "{e}"
    );
    let e = err(&["algorithm.correction.mode=\"often\""]);
    assert!(
        e.contains("algorithm.correction.mode") && e.contains("bypass"),
        "{e}"
    );
    let e = err(&[
        "algorithm.correction.mode=\"bypass\"",
        "model.critic=true",
        "algorithm.advantage=\"gae\"",
    ]);
    assert!(e.contains("bypass") && e.contains("critic"), "{e}");
    // Whether the ratio's anchor fits depends on the loss: the trainer's resolution says.
    let e = Recipe::load(&path, &["algorithm.ratio_reference=\"behaviour\"".into()])
        .unwrap()
        .validate()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("algorithm.ratio_reference") && e.contains("cumulative"),
        "{e}"
    );
    let e = err(&["algorithm.kl_target=0.1"]);
    assert!(e.contains("kl_horizon"), "{e}");
    let e = err(&["algorithm.advantage=\"remax\""]);
    assert!(e.contains("remax") && e.contains("greedy"), "{e}");
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

/// The quickstart, 2 steps of 2 epochs × 2 mini-batches (stale inside a step), in `mode` with
/// extra `--set`s; returns its metrics.
fn quickstart_metrics(tag: &str, extra: &[&str]) -> Vec<rlft_train::metrics::StepMetrics> {
    let path = root().join("recipes/quickstart.toml");
    let out = tmp(tag);
    let mut o = smoke(&out, None);
    o.extend(extra.iter().map(|s| s.to_string()));
    Trainer::new(Recipe::load(&path, &o).unwrap(), None)
        .unwrap()
        .run(None)
        .unwrap();
    let m = rlft_train::metrics::read_metrics(&out.join("metrics.jsonl")).unwrap();
    std::fs::remove_dir_all(&out).ok();
    m
}

/// Every correction mode trains and reports its off-policy metrics every step.
#[test]
fn correction_modes_train_and_report() {
    let stale = ["algorithm.ppo_epochs=2", "algorithm.mini_batches=2"];
    let modes: [(&str, &[&str], &[&str]); 4] = [
        ("auto", &[], &["offpolicy/kl", "time/prox_s"]),
        (
            "recompute",
            &[],
            &["offpolicy/k3_kl", "offpolicy/pos/cum/1-8/p50"],
        ),
        (
            "decoupled",
            &[
                "algorithm.correction.is_level=\"token\"",
                "algorithm.correction.is_threshold=2.0",
                "algorithm.correction.rejection=[\"token_k1\"]",
                "algorithm.correction.rejection_threshold=\"0.2_5.0\"",
            ],
            &[
                "offpolicy/rollout_is_mean",
                "offpolicy/rollout_rs_token_k1_masked_fraction",
                "offpolicy/pos/token/1-8/p95",
                "time/prox_s",
            ],
        ),
        (
            "bypass",
            &[
                "algorithm.correction.is_level=\"sequence\"",
                "algorithm.correction.rejection=[\"seq_mean_k3\"]",
                "algorithm.correction.rejection_threshold=1.0",
            ],
            &["offpolicy/rollout_is_eff_sample_size", "offpolicy/chi2_seq"],
        ),
    ];
    for (mode, sets, keys) in modes {
        let mut o: Vec<String> = stale.iter().map(|s| s.to_string()).collect();
        o.push(format!("algorithm.correction.mode=\"{mode}\""));
        o.extend(sets.iter().map(|s| s.to_string()));
        let o: Vec<&str> = o.iter().map(String::as_str).collect();
        let metrics = quickstart_metrics(&format!("mode-{mode}"), &o);
        let steps: Vec<_> = metrics.iter().filter(|m| m.contains_key("kl")).collect();
        assert_eq!(steps.len(), 2, "{mode}");
        for m in steps {
            assert!(m.contains_key("time/correction_s"), "{mode}");
            for k in keys {
                let v = m.get(*k).and_then(|v| v.as_f64());
                assert!(v.is_some_and(f64::is_finite), "{mode}: {k} in {m:?}");
            }
            if mode == "bypass" {
                assert!(!m.contains_key("time/prox_s"), "bypass runs no π_old pass");
            }
        }
    }
}

/// With one update per batch nothing is stale: μ anchoring the ratio (bypass) trains as π_old
/// does (recompute), up to the rounding between the sampler's and the learner's forward passes.
#[test]
fn bypass_equals_recompute_when_nothing_is_stale() {
    let run = |mode: &str| {
        quickstart_metrics(
            &format!("fresh-{mode}"),
            &[&format!("algorithm.correction.mode=\"{mode}\"")],
        )
    };
    let (b, r) = (run("bypass"), run("recompute"));
    let first = |m: &[rlft_train::metrics::StepMetrics], k: &str| {
        m.iter()
            .find_map(|s| s.get(k).and_then(|v| v.as_f64()))
            .unwrap()
    };
    for k in [
        "grad_norm",
        "entropy",
        "reward/mean",
        "clip_frac/low",
        "clip_frac/high",
    ] {
        let (x, y) = (first(&b, k), first(&r, k));
        assert!(
            (x - y).abs() <= 1e-5 * (1.0 + y.abs()),
            "{k}: bypass {x} vs recompute {y}"
        );
    }
    // The gap μ vs π_old that recompute measures is rounding only.
    assert!(first(&r, "offpolicy/k3_kl").abs() < 1e-6);
}

/// Decoupled mode with AReaL's log-linear π_prox: with nothing stale every token's α is 0, so
/// π_prox = μ and the IS weights are 1, and training equals bypass mode's (μ anchors the ratio)
/// exactly; at lag 2 π_prox moves toward πθ and the gap to μ shows, without a π_old pass.
#[test]
fn loglinear_prox_is_mu_when_fresh_and_moves_when_stale() {
    let is = ["algorithm.correction.is_level=\"token\""];
    let bypass = quickstart_metrics(
        "bypass-fresh",
        &[is[0], "algorithm.correction.mode=\"bypass\""],
    );
    let decoupled = [
        "algorithm.correction.mode=\"decoupled\"",
        "algorithm.correction.prox=\"loglinear\"",
    ];
    let loglinear = quickstart_metrics("loglinear-fresh", &[is[0], decoupled[0], decoupled[1]]);
    for (b, l) in bypass.iter().zip(&loglinear).skip(1) {
        for key in [
            "reward/mean",
            "kl",
            "entropy",
            "grad_norm",
            "clip_frac/low",
            "clip_frac/high",
        ] {
            assert_eq!(b[key], l[key], "{key} at step {}", b["step"]);
        }
        assert_eq!(
            l["offpolicy/kl"].as_f64(),
            Some(0.0),
            "π_prox = μ when fresh"
        );
    }
    let stale = quickstart_metrics(
        "loglinear-lag2",
        &[
            is[0],
            decoupled[0],
            decoupled[1],
            "schedule.steps=3",
            "async.mode=\"lagged\"",
            "async.lag=2",
        ],
    );
    let gap = stale[3]["offpolicy/kl"].as_f64().expect("measured");
    assert!(
        gap.abs() > 0.0 && gap.is_finite(),
        "π_prox moved toward πθ: {gap}"
    );
}

/// OPSM (TRL's and slime's), M2PO, KPop, slime's veto and top-entropy masking train on stale
/// samples and change the update only when their bound is crossed; the anchors' loss settings
/// (VESPO, TOPR, prime-rl, the bias-corrected KL) change it only when set off their defaults: with a bound nothing reaches, the run equals the plain one exactly;
/// with a tight one, what is learned changes.
#[test]
fn loss_masks_and_settings_act_only_past_their_bound() {
    // A length reward: rewards differ within groups, so advantages and gradients are nonzero.
    let lag = [
        "schedule.steps=4",
        "rollout.prompts_per_step=4",
        "rollout.group_size=4",
        "async.mode=\"lagged\"",
        "async.lag=2",
        "reward=[{kind = \"length\", target = 2, coef = 1.0, correctness = true}]",
    ];
    let run = |tag: &str, extra: &[&str]| {
        let mut o: Vec<&str> = lag.to_vec();
        o.extend(extra);
        quickstart_metrics(tag, &o)
    };
    let update = |m: &[rlft_train::metrics::StepMetrics]| {
        m[1..]
            .iter()
            .map(|r| {
                (
                    r["grad_norm"].clone(),
                    r["entropy"].clone(),
                    r["reward/mean"].clone(),
                )
            })
            .collect::<Vec<_>>()
    };
    let decoupled = "algorithm.correction.mode=\"decoupled\"";
    // (name, switch, the base run's settings, a bound nothing reaches, a bound everything does)
    type Case<'a> = (&'a str, &'a [&'a str], &'a [&'a str], &'a str, &'a str);
    let vespo = "algorithm.loss=\"vespo\"";
    let topr = "algorithm.loss=\"topr\"";
    let prime = "algorithm.loss=\"prime_rl\"";
    let kl = "algorithm.kl_coef=0.1";
    let cases: [Case; 10] = [
        (
            "top_entropy",
            &[],
            &[],
            "algorithm.top_entropy_quantile=1.0",
            "algorithm.top_entropy_quantile=0.2",
        ),
        (
            "vespo",
            &[vespo],
            &[vespo],
            "algorithm.vespo.pos=[2.0, 3.0]",
            "algorithm.vespo.pos=[5.0, 0.5]",
        ),
        (
            "topr",
            &[topr],
            &[topr],
            "algorithm.topr.weights=[1.0, 1.0]",
            "algorithm.topr.weights=[1.0, 0.1]",
        ),
        (
            "prime_rl",
            &[prime],
            &[prime],
            "algorithm.prime_rl.adv_tau=1.0",
            "algorithm.prime_rl.adv_tau=3.0",
        ),
        (
            "bias_corrected_kl",
            &[kl],
            &[kl],
            "algorithm.kl_bias_correction=false",
            "algorithm.kl_bias_correction=true",
        ),
        (
            "trl",
            &["algorithm.correction.opsm=\"trl\""],
            &[],
            "algorithm.correction.opsm_delta=1e9",
            "algorithm.correction.opsm_delta=0.0",
        ),
        (
            "slime",
            &["algorithm.correction.opsm=\"slime\""],
            &[],
            "algorithm.correction.opsm_delta=1e9",
            "algorithm.correction.opsm_delta=0.0",
        ),
        (
            "m2po",
            &[decoupled],
            &[decoupled],
            "algorithm.correction.m2po_threshold=1e9",
            "algorithm.correction.m2po_threshold=1e-9",
        ),
        (
            "kpop",
            &[decoupled, "algorithm.correction.kpop_level=\"seq_max\""],
            &[decoupled],
            "algorithm.correction.kpop_threshold=1e9",
            "algorithm.correction.kpop_threshold=1e-12",
        ),
        (
            "veto",
            &[decoupled],
            &[decoupled],
            "algorithm.correction.veto_threshold=1e-30",
            "algorithm.correction.veto_threshold=1e9",
        ),
    ];
    for (name, on, base_extra, loose, tight) in cases {
        let base = run(&format!("{name}-base"), base_extra);
        let mut o = on.to_vec();
        o.push(loose);
        assert_eq!(
            update(&base),
            update(&run(&format!("{name}-loose"), &o)),
            "{name}"
        );
        let mut o = on.to_vec();
        o.push(tight);
        assert_ne!(
            update(&base),
            update(&run(&format!("{name}-tight"), &o)),
            "{name}"
        );
    }
}

/// Every built-in loss and preset a recipe can name trains through the trainer (losses that
/// weigh rows by their reward get each row's score).
#[test]
fn every_registered_loss_trains_two_steps() {
    let registry = rlft_algo::loss::LossRegistry::with_builtins();
    let names = registry.names();
    assert!(names.len() > 10, "{names:?}");
    for name in names {
        let loss = format!("algorithm.loss=\"{name}\"");
        let mut o = vec![loss.as_str()];
        // Presets whose advantage needs values (PPO's GAE) train with a critic.
        if registry.resolve(&name).unwrap().advantage.needs_values() {
            o.push("model.critic=true");
        }
        let m = quickstart_metrics(&format!("loss-{name}"), &o);
        assert!(
            m.iter()
                .skip(1)
                .all(|r| r["grad_norm"].as_f64().is_some_and(f64::is_finite)),
            "{name}"
        );
    }
}

/// With top-k and top-p on, μ is the log-prob under the filtered, renormalised distribution:
/// every step logs `rollout/filter_log_mass` (mean log S < 0), auto mode computes π_old (μ is
/// not the learner's distribution), and the measured gap between μ and π_old is exactly log S
/// (up to the decode pass's rounding). Without filters the key is absent.
#[test]
fn filtered_sampling_records_exact_mu_and_its_kept_mass() {
    let filters = ["rollout.top_p=0.8", "rollout.top_k=20"];
    let m = quickstart_metrics("filtered", &filters);
    let steps: Vec<_> = m.iter().filter(|r| r["step"].as_u64() > Some(0)).collect();
    assert!(!steps.is_empty());
    for row in steps {
        let s = row["rollout/filter_log_mass"]
            .as_f64()
            .expect("logged every step");
        assert!(s < 0.0 && s.is_finite(), "log S = {s}");
        assert!(
            row.contains_key("time/prox_s"),
            "auto mode runs the π_old pass"
        );
        let kl = row["offpolicy/kl"]
            .as_f64()
            .expect("the gap to μ is measured");
        assert!(
            (kl.abs() - s.abs()).abs() <= 1e-3 * (1.0 + s.abs()),
            "offpolicy/kl {kl} vs mean log S {s}"
        );
    }
    let plain = quickstart_metrics("unfiltered", &[]);
    assert!(plain.iter().all(|r| {
        !r.contains_key("rollout/filter_log_mass") && !r.contains_key("rollout/mass_outside_kept")
    }));
}

/// Sampling-mask replay at lag 0: the learner takes its log-probs over each token's kept set,
/// so μ (the filtered, renormalised draw) is its own distribution and the measured gap
/// vanishes; a kept set larger than `rollout.sampling_mask_max_ids` is counted and masked.
#[test]
fn sampling_mask_replay_closes_the_gap_to_mu() {
    let replay = [
        "async.mode=\"lagged\"",
        "async.lag=0",
        "rollout.top_p=0.8",
        "rollout.top_k=20",
        "algorithm.correction.mode=\"bypass\"",
        "algorithm.sampling_mask=\"replay\"",
    ];
    let m = quickstart_metrics("replay", &replay);
    let steps: Vec<_> = m.iter().filter(|r| r["step"].as_u64() > Some(0)).collect();
    assert!(!steps.is_empty());
    for row in &steps {
        for key in ["offpolicy/kl", "offpolicy/k3_kl"] {
            let v = row[key].as_f64().expect("measured every step");
            assert!(v.abs() <= 1e-6, "{key} = {v} at step {}", row["step"]);
        }
        assert_eq!(row["rollout/sampling_mask_overflow"].as_f64(), Some(0.0));
        // The learner's mass outside the kept sets: top-p 0.8 leaves some out.
        let outside = row["rollout/mass_outside_kept"].as_f64().expect("reported");
        assert!(outside > 0.0 && outside < 1.0, "mass outside {outside}");
        assert!(
            row["rollout/filter_log_mass"]
                .as_f64()
                .is_some_and(|s| s < 0.0)
        );
    }
    // Sets of more than one token overflow at a limit of 1: counted, masked, still trained.
    let mut tight = replay.to_vec();
    tight.push("rollout.sampling_mask_max_ids=1");
    let m = quickstart_metrics("replay-overflow", &tight);
    for row in m.iter().filter(|r| r["step"].as_u64() > Some(0)) {
        let n = row["rollout/sampling_mask_overflow"].as_f64().unwrap();
        assert!(n > 0.0, "overflow {n}");
        assert!(row["grad_norm"].as_f64().is_some_and(f64::is_finite));
    }
}

/// Sampling-mask replay against a stale sampler: with the lag as long as the run, every step
/// samples with the warmed-up policy, so the replayed kept sets stop matching the policy being
/// trained. The loss over the kept sets neither sees nor moves the probability outside them: the
/// mass the policy puts there grows (`rollout/mass_outside_kept`), and steps come whose gradient
/// is exactly zero (every token either alone in its kept set or clipped). A penalty on that
/// mass (`algorithm.outside_mass_coef`) keeps it down and the gradient alive.
#[test]
fn replay_against_a_stale_sampler_loses_mass_outside_the_kept_sets() {
    let stale = |coef: &'static str| {
        let sets = [
            "schedule.steps=8",
            "sft.steps=300",
            "sft.batch_size=32",
            "rollout.prompts_per_step=16",
            "rollout.group_size=8",
            "rollout.max_new_tokens=4",
            "rollout.max_total_tokens=4",
            "async.mode=\"lagged\"",
            "async.lag=8",
            "rollout.top_p=0.8",
            "algorithm.correction.mode=\"bypass\"",
            "algorithm.sampling_mask=\"replay\"",
            coef,
        ];
        let m = quickstart_metrics(&format!("stale-replay-{}", &coef[coef.len() - 3..]), &sets);
        let steps: Vec<(f64, f64)> = m
            .iter()
            .filter(|r| r["step"].as_u64() > Some(0))
            .map(|r| {
                let outside = r["rollout/mass_outside_kept"].as_f64().expect("reported");
                (outside, r["grad_norm"].as_f64().expect("a gradient norm"))
            })
            .collect();
        assert_eq!(steps.len(), 8);
        steps
    };
    let plain = stale("algorithm.outside_mass_coef=0.0");
    let held = stale("algorithm.outside_mass_coef=1.0");
    let (first, last) = (plain[0].0, plain[7].0);
    assert!(
        last > 1.5 * first,
        "mass outside the kept sets {first} -> {last}: {plain:?}"
    );
    assert!(
        plain.iter().any(|&(_, g)| g == 0.0),
        "no step without a gradient: {plain:?}"
    );
    assert!(held.iter().all(|&(_, g)| g > 0.0), "{held:?}");
    assert!(
        held[7].0 < 0.75 * last,
        "the penalty leaves {} outside, against {last} without",
        held[7].0
    );
}

/// `kl_target` / `kl_horizon` adapt β each step from the measured KL, and the checkpoint keeps
/// the controller's β.
#[test]
fn adaptive_kl_moves_beta_and_is_checkpointed() {
    let path = root().join("recipes/quickstart.toml");
    let out = tmp("adaptive-kl");
    let mut o = smoke(&out, None);
    o.extend(
        [
            "algorithm.kl_coef=0.05",
            "algorithm.kl_target=1e-6",
            "algorithm.kl_horizon=10.0",
            "algorithm.ppo_epochs=2",
        ]
        .map(String::from),
    );
    Trainer::new(Recipe::load(&path, &o).unwrap(), None)
        .unwrap()
        .run(None)
        .unwrap();
    let m = rlft_train::metrics::read_metrics(&out.join("metrics.jsonl")).unwrap();
    let betas: Vec<f64> = m
        .iter()
        .filter_map(|s| s.get("kl_coef").and_then(|v| v.as_f64()))
        .collect();
    assert_eq!(betas.len(), 2);
    assert_eq!(betas[0], 0.05);
    // The first update moves the policy away from the reference: KL above the target, β grows
    // (by at most 20 % × samples / horizon).
    assert!(betas[1] > betas[0], "{betas:?}");
    let state = checkpoint::read_state(&checkpoint::locate(&out).unwrap()).unwrap();
    assert!(state.kl_coef.is_some_and(|b| b > betas[1]), "{state:?}");
    std::fs::remove_dir_all(&out).ok();
}

/// Prompts longer than `rollout.max_prompt_len` are skipped, and counted.
#[test]
fn overlong_prompts_are_counted() {
    let m = quickstart_metrics("overlong", &["rollout.max_prompt_len=3"]);
    let skipped: Vec<f64> = m
        .iter()
        .filter_map(|s| s.get("prompts/skipped").and_then(|v| v.as_f64()))
        .collect();
    assert_eq!(
        skipped,
        vec![2.0, 2.0],
        "both prompts of each step are longer than 3 tokens"
    );
}

/// The output head in chunks of 3 response positions and micro-batches of at most 12 tokens
/// train like the plain pass: the same gradient up to float rounding, so the first step's
/// metrics agree closely (later steps sample from slightly different weights).
#[test]
fn chunked_head_and_token_budget_train_like_the_plain_pass() {
    let plain = quickstart_metrics("chunk-plain", &["algorithm.entropy_coef=0.01"]);
    let chunked = quickstart_metrics(
        "chunk-3",
        &[
            "algorithm.entropy_coef=0.01",
            "algorithm.logits_chunk_tokens=3",
            "algorithm.micro_batch_tokens=12",
        ],
    );
    let (a, b) = (&plain[1], &chunked[1]);
    for key in [
        "grad_norm",
        "entropy",
        "kl",
        "clip_frac/high",
        "reward/mean",
    ] {
        let (x, y) = (a[key].as_f64().unwrap(), b[key].as_f64().unwrap());
        assert!(
            (x - y).abs() <= 1e-4 * x.abs().max(1e-3),
            "{key}: plain {x}, chunked {y}"
        );
    }
    assert!(a["grad_norm"].as_f64().unwrap() > 0.0);
}

/// `async.mode = "lagged"` with `lag = 0` is sync, bit for bit (the staleness metrics included);
/// with `lag = 2` each step samples with the policy two versions old.
#[test]
fn lagged_mode_of_lag_zero_is_sync_and_lag_two_is_two_versions_old() {
    let three = ["schedule.steps=3"];
    let sync = quickstart_metrics("lag-sync", &three);
    let lag0 = quickstart_metrics(
        "lag-0",
        &["schedule.steps=3", "async.mode=\"lagged\"", "async.lag=0"],
    );
    let strip = |v: &[rlft_train::metrics::StepMetrics]| {
        v.iter()
            .map(|m| {
                let mut m = m.clone();
                m.retain(|k, _| k != "tokens_per_s" && !k.starts_with("time/"));
                m
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(strip(&sync), strip(&lag0));
    assert!(sync[1..].iter().all(|m| m["staleness/max"] == 0.0));
    let lag2 = quickstart_metrics(
        "lag-2",
        &["schedule.steps=3", "async.mode=\"lagged\"", "async.lag=2"],
    );
    let at = |k: usize, key: &str| lag2[k][key].as_f64().unwrap();
    assert_eq!(at(1, "staleness/hist/0"), 1.0, "step 1 has no older policy");
    assert_eq!(at(2, "staleness/hist/1"), 1.0);
    assert_eq!(at(3, "staleness/hist/2"), 1.0);
    assert_eq!(at(3, "staleness/max"), 2.0);
    // Without partial rollouts every token is as old as its group.
    for k in 1..=3 {
        assert_eq!(at(k, "staleness/token_age_mean"), at(k, "staleness/mean"));
    }
    // Sampling with older weights changes what is learned.
    assert_ne!(strip(&sync)[3], strip(&lag2)[3]);
}

/// `async.mode = "async"` with `max_staleness = 0` is sync, bit for bit (each batch's RNG comes
/// from (seed, batch serial) and a batch starts only once the weights it needs reached the
/// worker); with η = 2 and two workers no consumed group is older than 2 versions, every step
/// reports the async metrics, and `events.jsonl` holds both sides' intervals.
#[test]
fn async_mode_of_eta_zero_is_sync_and_eta_two_stays_within_two_versions() {
    let steps = ["schedule.steps=4", "checkpoint.every=2"];
    let strip = |v: &[rlft_train::metrics::StepMetrics]| {
        v.iter()
            .map(|m| {
                let mut m = m.clone();
                m.retain(|k, _| {
                    k != "tokens_per_s" && !k.starts_with("time/") && !k.starts_with("async/")
                });
                m
            })
            .collect::<Vec<_>>()
    };
    let sync = quickstart_metrics("async-sync", &steps);
    let eta0 = quickstart_metrics(
        "async-0",
        &[
            steps[0],
            steps[1],
            "async.mode=\"async\"",
            "async.max_staleness=0",
        ],
    );
    assert_eq!(strip(&sync), strip(&eta0));
    assert!(eta0[1..].iter().all(|m| m["async/requeued"] == 0.0));
    let out = tmp("async-2");
    let mut o = smoke(&out, None);
    o.extend(
        [
            "schedule.steps=6",
            "async.mode=\"async\"",
            "async.max_staleness=2",
            "async.rollout_workers=2",
            "async.rollout_threads=1",
            "async.learner_threads=1",
        ]
        .map(String::from),
    );
    let recipe = Recipe::load(&root().join("recipes/quickstart.toml"), &o).unwrap();
    Trainer::new(recipe, None).unwrap().run(None).unwrap();
    let m = rlft_train::metrics::read_metrics(&out.join("metrics.jsonl")).unwrap();
    assert_eq!(m.len(), 7);
    for s in &m[1..] {
        assert!(s["staleness/max"].as_f64().unwrap() <= 2.0, "{s:?}");
        assert_eq!(s["staleness/hist/over"], 0.0);
        for key in [
            "async/queue_len",
            "async/requeued",
            "async/dropped",
            "async/learner_idle",
            "async/rollout_idle",
            "async/rollout_tokens_per_s",
            "async/learner_tokens_per_s",
            "async/version_spread",
        ] {
            let v = s[key].as_f64().unwrap_or_else(|| panic!("{key} missing"));
            assert!(v.is_finite() && v >= 0.0, "{key} = {v}");
        }
        for key in ["async/learner_idle", "async/rollout_idle"] {
            assert!(s[key].as_f64().unwrap() <= 1.0, "{key}");
        }
    }
    // Interruptible generation keeps the bound: a group's oldest token decides its staleness;
    // the workers may sample on their own device.
    let out_i = tmp("async-2-interruptible");
    let mut o = smoke(&out_i, None);
    o.extend(
        [
            "schedule.steps=4",
            "async.mode=\"async\"",
            "async.max_staleness=2",
            "async.interruptible=true",
            "async.kv_on_update=\"recompute\"",
            // Only the newest version's tokens of a row get loss.
            "algorithm.correction.train_versions=\"current\"",
            // The workers' snapshots on another backend than the learner's (flex).
            "rollout.device=\"ndarray\"",
        ]
        .map(String::from),
    );
    let recipe = Recipe::load(&root().join("recipes/quickstart.toml"), &o).unwrap();
    Trainer::new(recipe, None).unwrap().run(None).unwrap();
    let mi = rlft_train::metrics::read_metrics(&out_i.join("metrics.jsonl")).unwrap();
    assert_eq!(mi.len(), 5);
    assert!(
        mi[1..]
            .iter()
            .all(|s| s["staleness/max"].as_f64().unwrap() <= 2.0)
    );
    std::fs::remove_dir_all(&out_i).ok();
    let events: Vec<serde_json::Value> = std::fs::read_to_string(out.join("events.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let has = |actor: &str, kind: &str| {
        events.iter().any(|e| {
            e["actor"] == actor && e["kind"] == kind && e["end_s"].as_f64() >= e["start_s"].as_f64()
        })
    };
    for (actor, kind) in [
        ("learner", "learn"),
        ("learner", "publish"),
        ("learner", "wait"),
        ("rollout/0", "generate"),
        ("rollout/1", "generate"),
        ("rollout/0", "score"),
    ] {
        assert!(
            has(actor, kind),
            "no {actor} {kind} interval in events.jsonl"
        );
    }
    // The run's pictures: stale batches get a π_old pass, so the ratio fan has data too.
    let files = rlft_train::plot::plot_run(&out, None).unwrap();
    for (stem, exts) in [
        ("ratio_fan", &["png", "svg"][..]),
        ("staleness", &["png", "svg"]),
        ("offpolicy", &["png", "svg"]),
        ("timeline", &["png", "svg"]),
        ("plot_reward_mean", &["png"]),
    ] {
        for ext in exts {
            let f = out.join(format!("{stem}.{ext}"));
            assert!(files.contains(&f), "{} not written", f.display());
            assert!(
                std::fs::metadata(&f).unwrap().len() > 1000,
                "{} is empty",
                f.display()
            );
        }
    }
    std::fs::remove_dir_all(&out).ok();
}

/// The prompt of the evaluation problems the worker-failure test gives the trainer.
const HELD_OUT: &str = "What is 2 + 2? Answer with the number. (held out)";

/// A reward with a bug: it panics on every training sample (and scores the held-out problems,
/// which evaluation scores on the learner before and after training).
struct PanicsOnTraining;

impl rlft_rollout::Reward for PanicsOnTraining {
    fn name(&self) -> &str {
        "panics_on_training"
    }
    fn score(&self, x: &rlft_rollout::RewardInput) -> Result<f64, String> {
        assert!(x.prompt.contains(HELD_OUT), "the reward exploded");
        Ok(0.0)
    }
}

/// A rollout worker that fails (here: a custom reward panics in async mode) stops the run with
/// its own error, naming the worker, and the `rlft` program's own exit status for it (3, not
/// the usage status 2).
#[test]
fn a_failed_rollout_worker_is_its_own_error() {
    let out = tmp("worker-fails");
    let mut o = smoke(&out, None);
    o.extend([
        "async.mode=\"async\"".to_string(),
        "async.rollout_workers=2".into(),
        "sft.steps=0".into(),
    ]);
    let recipe = Recipe::load(&root().join("recipes/quickstart.toml"), &o).unwrap();
    let held_out = rlft_rollout::Example {
        prompt: rlft_rollout::Prompt::Text(HELD_OUT.into()),
        answer: "4".into(),
        alternatives: Vec::new(),
        completion: None,
        metadata: serde_json::Value::Null,
    };
    let ext = rlft_train::Extensions {
        rewards: vec![(
            1.0,
            Arc::new(PanicsOnTraining) as Arc<dyn rlft_rollout::Reward>,
        )],
        eval_set: Some(vec![held_out; 2]),
        ..rlft_train::Extensions::default()
    };
    let err = Trainer::with_extensions(recipe, None, ext)
        .and_then(|mut t| t.run(None))
        .expect_err("the run fails");
    let msg = err.to_string();
    assert!(
        matches!(err, rlft_train::TrainError::Worker { worker: 0 | 1, .. }),
        "{msg}"
    );
    assert!(msg.starts_with("rollout worker "), "{msg}");
    assert!(
        msg.contains(" failed: ") && msg.contains("the reward exploded"),
        "{msg}"
    );
    assert_eq!(err.exit_code(), 3);
    std::fs::remove_dir_all(&out).ok();
}
