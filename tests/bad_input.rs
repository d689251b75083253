//! Bad input through the real program: every case runs the `rlft` binary on a broken recipe,
//! override, environment, dataset, model file or checkpoint and requires a non-zero exit, a
//! message naming the file or key and what to do, and no panic. Recipe errors must not leave
//! an output folder behind.

#[path = "support/cli.rs"]
mod cli;

use cli::*;
use std::path::{Path, PathBuf};
use std::process::Command;

#[test]
fn bad_input_is_a_clear_error_never_a_panic() {
    let tmp = Scratch::new();
    let mut cases: Vec<Case> = Vec::new();
    // --- Recipe values: every range and enum the schema checks.
    with_set(
        &mut cases,
        &tmp,
        "neg clip_low",
        &["algorithm.clip_low=-0.1"],
        &["algorithm.clip_low"],
    );
    with_set(
        &mut cases,
        &tmp,
        "unknown dtype",
        &["model.dtype=\"bf32\""],
        &["bf32", "bf16"],
    );
    with_set(
        &mut cases,
        &tmp,
        "unknown rank device",
        &["distributed.devices=[\"flex\", \"tpu\"]"],
        &["distributed.devices", "tpu"],
    );
    with_set(
        &mut cases,
        &tmp,
        "device is not the first rank",
        &["distributed.devices=[\"ndarray\", \"flex\"]"],
        &["distributed.devices", "ndarray"],
    );
    with_set(
        &mut cases,
        &tmp,
        "bf16 on ndarray",
        &["device=\"ndarray\"", "model.dtype=\"bf16\""],
        &["model.dtype", "ndarray", "f32"],
    );
    with_set(
        &mut cases,
        &tmp,
        "unknown sample_on",
        &["rollout.sample_on=\"gpu\""],
        &["sample_on", "device"],
    );
    with_set(
        &mut cases,
        &tmp,
        "sft batch 0",
        &["sft.batch_size=0"],
        &["sft.batch_size", "at least 1"],
    );
    with_set(
        &mut cases,
        &tmp,
        "max_prompt_len 0",
        &["rollout.max_prompt_len=0"],
        &["rollout.max_prompt_len"],
    );
    with_set(
        &mut cases,
        &tmp,
        "group_size 0",
        &["rollout.group_size=0"],
        &["rollout.group_size"],
    );
    with_set(
        &mut cases,
        &tmp,
        "prompts 0",
        &["rollout.prompts_per_step=0"],
        &["rollout.prompts_per_step"],
    );
    with_set(
        &mut cases,
        &tmp,
        "neg temperature",
        &["rollout.temperature=-1.0"],
        &["rollout.temperature"],
    );
    with_set(
        &mut cases,
        &tmp,
        "top_p > 1",
        &["rollout.top_p=1.5"],
        &["rollout.top_p"],
    );
    with_set(
        &mut cases,
        &tmp,
        "max_new_tokens 0",
        &["rollout.max_new_tokens=0"],
        &["rollout.max_new_tokens"],
    );
    with_set(
        &mut cases,
        &tmp,
        "neg lr",
        &["optimizer.lr=-1.0"],
        &["optimizer.lr"],
    );
    with_set(
        &mut cases,
        &tmp,
        "nan lr",
        &["optimizer.lr=nan"],
        &["optimizer.lr"],
    );
    with_set(
        &mut cases,
        &tmp,
        "neg grad_clip",
        &["optimizer.grad_clip=-1.0"],
        &["optimizer.grad_clip"],
    );
    with_set(
        &mut cases,
        &tmp,
        "beta2 = 1",
        &["optimizer.beta2=1.0"],
        &["optimizer.beta2"],
    );
    with_set(
        &mut cases,
        &tmp,
        "neg kl",
        &["algorithm.kl_coef=-0.1"],
        &["algorithm.kl_coef"],
    );
    with_set(
        &mut cases,
        &tmp,
        "micro batch 0",
        &["algorithm.micro_batch_size=0"],
        &["algorithm.micro_batch_size"],
    );
    with_set(
        &mut cases,
        &tmp,
        "ppo_epochs 0",
        &["algorithm.ppo_epochs=0"],
        &["algorithm.ppo_epochs"],
    );
    with_set(
        &mut cases,
        &tmp,
        "keep 0",
        &["checkpoint.keep=0"],
        &["checkpoint.keep", "at least 1"],
    );
    with_set(
        &mut cases,
        &tmp,
        "loss typo",
        &["algorithm.loss=\"grpoo\""],
        &["grpoo", "grpo"],
    );
    with_set(
        &mut cases,
        &tmp,
        "advantage typo",
        &["algorithm.advantage=\"gae2\""],
        &["gae2"],
    );
    with_set(
        &mut cases,
        &tmp,
        "schedule kind",
        &["schedule.kind=\"exp\""],
        &["schedule.kind", "cosine"],
    );
    with_set(
        &mut cases,
        &tmp,
        "kl estimator",
        &["algorithm.kl_estimator=\"k9\""],
        &["k9"],
    );
    with_set(
        &mut cases,
        &tmp,
        "correction mode",
        &["algorithm.correction.mode=\"sometimes\""],
        &["algorithm.correction.mode", "sometimes"],
    );
    with_set(
        &mut cases,
        &tmp,
        "is threshold",
        &["algorithm.correction.is_threshold=\"lots\""],
        &["is_threshold"],
    );
    with_set(
        &mut cases,
        &tmp,
        "task name",
        &["task.name=\"chess\""],
        &["chess", "arithmetic"],
    );
    with_set(
        &mut cases,
        &tmp,
        "unknown key",
        &["algorithm.kl_coeff=0.1"],
        &["algorithm.kl_coef", "did you mean"],
    );
    with_set(
        &mut cases,
        &tmp,
        "unknown section",
        &["algorythm.loss=\"grpo\""],
        &["algorythm", "algorithm"],
    );
    with_set(
        &mut cases,
        &tmp,
        "wrong type",
        &["schedule.steps=\"ten\""],
        &["schedule.steps"],
    );
    with_set(
        &mut cases,
        &tmp,
        "unknown device",
        &["device=\"tpu\""],
        &["tpu", "flex"],
    );
    with_set(
        &mut cases,
        &tmp,
        "device not built",
        &["device=\"cuda\""],
        &["cuda", "--features cuda"],
    );
    with_set(
        &mut cases,
        &tmp,
        "bad device index",
        &["device=\"cuda:x\""],
        &["cuda:x", "index"],
    );
    with_set(
        &mut cases,
        &tmp,
        "no equals",
        &["algorithm.kl_coef"],
        &["KEY=VALUE"],
    );
    with_set(
        &mut cases,
        &tmp,
        "dataset missing",
        &[
            "data.train=\"/nonexistent/train.jsonl\"",
            "reward=[{kind = \"exact\"}]",
        ],
        &["/nonexistent/train.jsonl"],
    );
    with_set(
        &mut cases,
        &tmp,
        "by_source with an unknown scorer",
        &["reward=[{kind = \"by_source\", sources = { mine = \"gsm9k\" }}]"],
        &["reward", "gsm9k", "math_dapo"],
    );
    with_set(
        &mut cases,
        &tmp,
        "task.dataset removed",
        &["task.dataset=\"train.jsonl\""],
        &["task.dataset", "[data] train"],
    );
    with_set(
        &mut cases,
        &tmp,
        "reward option of another kind",
        &["reward=[{kind = \"math_dapo\", pattern = \"x\"}]"],
        &["reward[0] (math_dapo)", "`pattern` is not an option"],
    );
    with_set(
        &mut cases,
        &tmp,
        "reward names collide",
        &["reward=[{kind = \"exact\"}, {kind = \"exact\"}]"],
        &["reward[1] (exact)", "another term is named"],
    );
    with_set(
        &mut cases,
        &tmp,
        "reward without correctness",
        &["reward=[{kind = \"format\"}]"],
        &["no term defines accuracy"],
    );
    with_set(
        &mut cases,
        &tmp,
        "reward command missing",
        &["reward=[{kind = \"exact\"}, {kind = \"command\", command = [\"/nonexistent/scorer\"]}]"],
        &["reward[1] (command)", "cannot start", "/nonexistent/scorer"],
    );
    with_set(
        &mut cases,
        &tmp,
        "tool command without a name",
        &["tool=[{kind = \"command\", command = [\"sh\"]}]"],
        &["tool[0]", "needs a name"],
    );
    with_set(
        &mut cases,
        &tmp,
        "tool command missing",
        &["tool=[{kind = \"command\", name = \"look\", command = [\"/nonexistent/tool\"]}]"],
        &["tool[0] (look)", "/nonexistent/tool"],
    );
    with_set(
        &mut cases,
        &tmp,
        "reward bad regex",
        &["reward=[{kind = \"exact\"}, {kind = \"regex\", pattern = \"(\"}]"],
        &["reward[1] (regex)", "not a valid regular expression"],
    );
    with_set(
        &mut cases,
        &tmp,
        "model missing",
        &["model.path=\"/nonexistent/model\""],
        &["/nonexistent/model"],
    );
    with_set(
        &mut cases,
        &tmp,
        "lora target typo",
        &["model.lora.target_modules=[\"q_prj\"]", "model.lora.rank=4"],
        &["q_prj"],
    );
    with_set(&mut cases, &tmp, "eval k 0", &["eval.k=0"], &["eval.k"]);
    with_set(
        &mut cases,
        &tmp,
        "lag outside lagged",
        &["async.lag=2"],
        &["async.lag", "lagged"],
    );
    with_set(
        &mut cases,
        &tmp,
        "lagged without lag",
        &["async.mode=\"lagged\""],
        &["async.lag"],
    );
    with_set(
        &mut cases,
        &tmp,
        "async mode typo",
        &["async.mode=\"lag\""],
        &["async.mode", "lagged"],
    );
    for (name, sets, expect) in [
        (
            "negative max_staleness",
            &["async.mode=\"async\"", "async.max_staleness=-1"][..],
            &["async.max_staleness"][..],
        ),
        (
            "max_staleness outside async",
            &["async.max_staleness=2"],
            &["async.max_staleness", "mode = \"async\""],
        ),
        (
            "on_stale typo",
            &["async.mode=\"async\"", "async.on_stale=\"skip\""],
            &["on_stale", "requeue"],
        ),
        (
            "zero rollout workers",
            &["async.mode=\"async\"", "async.rollout_workers=0"],
            &["async.rollout_workers"],
        ),
        (
            "worker device not compiled",
            &["async.mode=\"async\"", "rollout.device=\"cuda:1\""],
            &["rollout.device", "cuda"],
        ),
        (
            "kv_on_update without interruptible",
            &["async.mode=\"async\"", "async.kv_on_update=\"recompute\""],
            &["async.kv_on_update", "interruptible"],
        ),
        (
            "kv_on_update typo",
            &[
                "async.mode=\"async\"",
                "async.interruptible=true",
                "async.kv_on_update=\"reuse\"",
            ],
            &["kv_on_update", "recompute"],
        ),
        (
            "worker device outside async",
            &["rollout.device=\"flex\""],
            &["rollout.device", "async"],
        ),
    ] {
        with_set(&mut cases, &tmp, name, sets, expect);
    }
    with_set(
        &mut cases,
        &tmp,
        "huge batch",
        &["sft.batch_size=100000000000000000"],
        &["sft.batch_size", "at most"],
    );
    with_set(
        &mut cases,
        &tmp,
        "set index",
        &["task.ops[9223372036854775807]=\"+\""],
        &["dotted name"],
    );
    with_set(
        &mut cases,
        &tmp,
        "odd head width",
        &[
            "model.scratch.hidden_size=6",
            "model.scratch.heads=2",
            "model.scratch.kv_heads=1",
        ],
        &["model.scratch", "even"],
    );
    with_set(
        &mut cases,
        &tmp,
        "zero layers",
        &["model.scratch.layers=0"],
        &["model.scratch.layers"],
    );

    // --- Recipe files.
    let file_case = |name: &str, text: &str, expect: &[&str], cases: &mut Vec<Case>| {
        let path = tmp.file(&format!("{}.toml", name.replace(' ', "-")), text);
        cases.push(Case {
            name: name.into(),
            args: vec![s("train"), path.clone()],
            env: vec![],
            expect: expect.iter().map(|e| e.replace("{path}", &path)).collect(),
            cwd: None,
            not_created: None,
        });
    };
    file_case("not toml", "seed = = 3\n[model", &["{path}"], &mut cases);
    file_case(
        "unknown top key",
        "lerning_rate = 1\n",
        &["lerning_rate", "did you mean"],
        &mut cases,
    );
    file_case(
        "binary junk",
        "\u{0}\u{1}\u{2}\u{fffd}",
        &["{path}"],
        &mut cases,
    );
    cases.push(Case {
        name: "recipe missing".into(),
        args: vec![s("train"), s("/nonexistent/recipe.toml")],
        env: vec![],
        expect: vec![s("/nonexistent/recipe.toml"), s("no such file")],
        cwd: None,
        not_created: None,
    });

    // --- Command line.
    for (name, args, expect) in [
        (
            "no recipe",
            vec![s("train")],
            vec![s("no recipe given"), s("usage")],
        ),
        (
            "unknown option",
            vec![s("train"), recipe(), s("--sett"), s("a=1")],
            vec![s("--sett"), s("did you mean --set")],
        ),
        (
            "two recipes",
            vec![s("train"), recipe(), recipe()],
            vec![s("one recipe file")],
        ),
        (
            "unknown command",
            vec![s("trian")],
            vec![s("trian"), s("train")],
        ),
    ] {
        cases.push(Case {
            name: name.into(),
            args,
            env: vec![],
            expect,
            cwd: None,
            not_created: None,
        });
    }

    // --- Environment.
    for (name, var, value, expect) in [
        (
            "env override bad",
            "RLFT__ROLLOUT__GROUP_SIZE",
            "0",
            vec![s("rollout.group_size")],
        ),
        (
            "env unknown key",
            "RLFT__ROLLOUT__GROUPSIZE",
            "4",
            vec![s("rollout.group_size")],
        ),
        (
            "BURN_DEVICE unknown",
            "BURN_DEVICE",
            "tpu",
            vec![s("BURN_DEVICE"), s("flex")],
        ),
        (
            "BURN_DEVICE index",
            "BURN_DEVICE",
            "flex:0",
            vec![s("BURN_DEVICE"), s("RLFT_DEVICE")],
        ),
        (
            "BURN_DEVICE not built",
            "BURN_DEVICE",
            "cuda",
            vec![s("--features cuda")],
        ),
        ("RLFT_DEVICE bad", "RLFT_DEVICE", "gpu9", vec![s("gpu9")]),
    ] {
        let dir = tmp.path(&format!("out-{}", name.replace(' ', "-")));
        let auto = var.ends_with("DEVICE");
        let mut args = vec![s("train"), recipe()];
        for o in [
            format!("output_dir=\"{}\"", dir.display()),
            if auto {
                s("device=\"auto\"")
            } else {
                s("seed=3")
            },
        ] {
            args.push(s("--set"));
            args.push(o);
        }
        cases.push(Case {
            name: name.into(),
            args,
            env: vec![(var, value.into())],
            expect,
            cwd: None,
            not_created: Some(dir),
        });
    }

    // --- Datasets.
    for (name, text, expect) in [
        (
            "dataset not json",
            "this is not json\n",
            vec![s(".jsonl:1:"), s("expected one JSON object per line")],
        ),
        (
            "dataset no prompt",
            "{\"answer\": \"3\"}\n",
            vec![s(".jsonl:1:"), s("prompt")],
        ),
        (
            "dataset wrong type",
            "{\"prompt\": 7, \"answer\": \"3\"}\n",
            vec![s(".jsonl:1:"), s("column \"prompt\"")],
        ),
        ("dataset empty", "", vec![s("no examples")]),
        (
            "dataset bad 2nd line",
            "{\"prompt\": \"1+1\", \"answer\": \"2\"}\n{\"prompt\": \n",
            vec![s(".jsonl:2:")],
        ),
        (
            "dataset empty answer list",
            "{\"prompt\": \"1+1\", \"answer\": []}\n",
            vec![s(".jsonl:1:"), s("empty list")],
        ),
        // Without [[reward]] terms own data is scored by verl's table of data sources.
        (
            "dataset without reward terms or data_source",
            "{\"prompt\": \"1+1\", \"answer\": \"2\"}\n",
            vec![s(".jsonl:1:"), s("no data_source"), s("[[reward]]")],
        ),
        (
            "dataset data_source without scorer",
            "{\"prompt\": \"q\", \"answer\": \"2\", \"data_source\": \"numina_olympiads\"}\n",
            vec![s(".jsonl:1:"), s("\"numina_olympiads\""), s("sources = {")],
        ),
    ] {
        let path = tmp.file(&format!("{}.jsonl", name.replace(' ', "-")), text);
        let mut expect = expect;
        expect.push(path.clone());
        let train = format!("data.train=\"{path}\"");
        let mut sets = vec![train.as_str()];
        if !name.contains("reward terms") && !name.contains("data_source") {
            sets.push("reward=[{kind = \"exact\"}]");
        }
        with_set(&mut cases, &tmp, name, &sets, &[]);
        let last = cases.last_mut().unwrap();
        last.expect = expect;
    }

    // --- Model files (an HF folder copied from the tiny fixture, then broken).
    let model_case =
        |name: &str, break_it: &dyn Fn(&Path), expect: &[&str], cases: &mut Vec<Case>| {
            let dir = tmp.copy_dir(&tiny_llama(), &format!("model-{}", name.replace(' ', "-")));
            break_it(&dir);
            let out_dir = tmp.path(&format!("out-model-{}", name.replace(' ', "-")));
            cases.push(Case {
                name: name.into(),
                args: vec![
                    s("train"),
                    recipe(),
                    s("--set"),
                    format!("model.path=\"{}\"", dir.display()),
                    s("--set"),
                    format!("output_dir=\"{}\"", out_dir.display()),
                ],
                env: vec![],
                expect: expect
                    .iter()
                    .map(|e| e.replace("{dir}", &dir.to_string_lossy()))
                    .collect(),
                cwd: None,
                not_created: None,
            });
        };
    model_case(
        "weights truncated",
        &|d| truncate(&d.join("model.safetensors"), 3000),
        &["model.safetensors"],
        &mut cases,
    );
    model_case(
        "weights header junk",
        &|d| {
            std::fs::write(
                d.join("model.safetensors"),
                b"\xff\xff\xff\xff\xff\xff\xff\x7fjunk",
            )
            .unwrap()
        },
        &["model.safetensors"],
        &mut cases,
    );
    model_case(
        "weights missing",
        &|d| std::fs::remove_file(d.join("model.safetensors")).unwrap(),
        &["{dir}", "safetensors"],
        &mut cases,
    );
    model_case(
        "config not json",
        &|d| std::fs::write(d.join("config.json"), "{ nope").unwrap(),
        &["config.json"],
        &mut cases,
    );
    model_case(
        "config missing",
        &|d| std::fs::remove_file(d.join("config.json")).unwrap(),
        &["config.json"],
        &mut cases,
    );
    model_case(
        "config other size",
        &|d| {
            edit_config(d, |v| {
                let h = v["hidden_size"].as_u64().unwrap();
                v["hidden_size"] = (h * 2).into();
            })
        },
        &["config.json", "shape"],
        &mut cases,
    );
    model_case(
        "config unsupported arch",
        &|d| edit_config(d, |v| v["model_type"] = "gpt2".into()),
        &["config.json", "gpt2"],
        &mut cases,
    );
    model_case(
        "tokenizer not json",
        &|d| std::fs::write(d.join("tokenizer.json"), "][").unwrap(),
        &["tokenizer.json"],
        &mut cases,
    );
    model_case(
        "vocab past the embedding",
        &|d| edit_config(d, |v| v["vocab_size"] = 8.into()),
        &["tokenizer", "embedding"],
        &mut cases,
    );
    let gguf = tmp.file(
        "junk.gguf",
        b"GGUF\x03\x00\x00\x00\xff\xff\xff\xff\xff\xff\xff\xff",
    );
    cases.push(Case {
        name: "gguf junk".into(),
        args: vec![
            s("train"),
            recipe(),
            s("--set"),
            format!("model.path=\"{gguf}\""),
            s("--set"),
            format!("output_dir=\"{}\"", tmp.path("out-gguf").display()),
        ],
        env: vec![],
        expect: vec![gguf.clone()],
        cwd: None,
        not_created: None,
    });

    // --- Checkpoints: a real run, then copies of it broken.
    let run = tmp.path("run");
    train_ok(&run, &["schedule.steps=2", "sft.steps=2"]);
    let ckpt_case = |name: &str,
                     break_it: &dyn Fn(&Path),
                     extra: &[&str],
                     expect: &[&str],
                     cases: &mut Vec<Case>| {
        let dir = tmp.path(&format!("run-{}", name.replace(' ', "-")));
        copy_tree(&run, &dir);
        break_it(&dir);
        let mut args = vec![s("train"), s("--resume"), dir.to_string_lossy().into()];
        args.extend(extra.iter().map(|e| e.to_string()));
        cases.push(Case {
            name: name.into(),
            args,
            env: vec![],
            expect: expect
                .iter()
                .map(|e| e.replace("{dir}", &dir.to_string_lossy()))
                .collect(),
            cwd: None,
            not_created: None,
        });
    };
    ckpt_case(
        "state not json",
        &|d| std::fs::write(d.join("step-2/state.json"), "{").unwrap(),
        &[],
        &["state.json", "older"],
        &mut cases,
    );
    ckpt_case(
        "policy truncated",
        &|d| truncate(&d.join("step-2/policy.bpk"), 100),
        &[],
        &["step-2", "policy"],
        &mut cases,
    );
    ckpt_case(
        "optimizer truncated",
        &|d| truncate(&d.join("step-2/optimizer.bin"), 10),
        &[],
        &["step-2", "optimizer"],
        &mut cases,
    );
    ckpt_case(
        "latest dangling",
        &|d| {
            for e in std::fs::read_dir(d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() && p.file_name().unwrap() != "final" {
                    std::fs::remove_dir_all(p).unwrap();
                }
            }
            std::fs::write(d.join("latest"), "step-9").unwrap();
        },
        &[],
        &["step-9", "new output_dir"],
        &mut cases,
    );
    ckpt_case(
        "policy of another size",
        &|d| {
            // The stored recipe says hidden 32; weights of a 64-wide model cannot load.
            let other = tmp.path("run-other-size");
            train_ok(
                &other,
                &[
                    "schedule.steps=1",
                    "sft.steps=0",
                    "model.scratch.hidden_size=64",
                ],
            );
            std::fs::copy(other.join("step-1/policy.bpk"), d.join("step-2/policy.bpk")).unwrap();
        },
        &[],
        &["step-2", "policy", "another model"],
        &mut cases,
    );
    ckpt_case(
        "changed setting at resume",
        &|_| {},
        &["--set", "algorithm.loss=\"dapo\""],
        &["algorithm.loss", "resumed run"],
        &mut cases,
    );
    ckpt_case(
        "no recipe stored",
        &|d| {
            for e in std::fs::read_dir(d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    std::fs::remove_dir_all(p).unwrap();
                }
            }
            std::fs::remove_file(d.join("latest")).unwrap();
            std::fs::write(d.join("recipe.toml"), "").unwrap();
        },
        &[],
        &["recipe.toml", "pass the recipe file"],
        &mut cases,
    );
    cases.push(Case {
        name: "resume nothing".into(),
        args: vec![s("train"), s("--resume"), s("/nonexistent/run")],
        env: vec![],
        expect: vec![s("/nonexistent/run"), s("output_dir")],
        cwd: None,
        not_created: None,
    });
    let empty = tmp.path("empty-run");
    std::fs::create_dir_all(&empty).unwrap();
    cases.push(Case {
        name: "resume not a run".into(),
        args: vec![s("train"), s("--resume"), empty.to_string_lossy().into()],
        env: vec![],
        expect: vec![empty.to_string_lossy().into(), s("neither a checkpoint")],
        cwd: None,
        not_created: None,
    });
    cases.push(Case {
        name: "output_dir taken".into(),
        args: vec![
            s("train"),
            recipe(),
            s("--set"),
            format!("output_dir=\"{}\"", run.display()),
        ],
        env: vec![],
        expect: vec![run.to_string_lossy().into(), s("--resume")],
        cwd: None,
        not_created: None,
    });

    eprintln!("{} bad-input cases", cases.len());
    assert!(cases.len() >= 40, "only {} cases", cases.len());
    check_all(cases.len(), &run_cases(&cases));
}

/// Inputs that were once accepted with a silent fallback: non-finite numbers (an optional key
/// fell back to its default), an empty `output_dir` (the run wrote into the working folder), a
/// run folder's `recipe.toml` edited before `--resume` (the edit was overwritten), and a
/// lagged-mode checkpoint missing a snapshot (the run sampled with a policy one version too new).
#[test]
fn silent_fallbacks_are_refused() {
    let tmp = Scratch::new();
    let mut cases: Vec<Case> = Vec::new();
    // --- Non-finite numbers, in optional and plain keys, from --set and the environment.
    let command_tool = "{name = \"echo\", kind = \"command\", command = [\"cat\"], timeout_s = X}";
    let command_reward = "{kind = \"command\", command = [\"cat\"], timeout_s = X}";
    for (name, set, key) in [
        (
            "kl_target nan",
            "algorithm.kl_target=nan".to_string(),
            "algorithm.kl_target",
        ),
        (
            "kl_coef nan",
            "algorithm.kl_coef=nan".into(),
            "algorithm.kl_coef",
        ),
        (
            "clip_high inf",
            "algorithm.clip_high=inf".into(),
            "algorithm.clip_high",
        ),
        ("lr -inf", "optimizer.lr=-inf".into(), "optimizer.lr"),
        (
            "reward timeout nan",
            format!("reward=[{}]", command_reward.replace('X', "nan")),
            "reward[0].timeout_s",
        ),
        (
            "tool timeout nan",
            format!("tool=[{}]", command_tool.replace('X', "nan")),
            "tool[0].timeout_s",
        ),
    ] {
        with_set(&mut cases, &tmp, name, &[set.as_str()], &[key, "finite"]);
    }
    for (var, value, key) in [
        ("RLFT__ALGORITHM__KL_TARGET", "nan", "algorithm.kl_target"),
        ("RLFT__SFT__LR", "inf", "sft.lr"),
    ] {
        with_set(
            &mut cases,
            &tmp,
            &format!("env {var}"),
            &[],
            &[key, "finite"],
        );
        cases.last_mut().unwrap().env = vec![(var, value.into())];
    }
    // --- An empty output_dir: refused before anything is written, here or anywhere.
    for (name, value) in [
        ("output_dir empty", "\"\""),
        ("output_dir blank", "\"  \""),
        ("output_dir empty env", ""),
    ] {
        let cwd = tmp.path(&format!("cwd-{}", name.replace(' ', "-")));
        let mut case = Case {
            name: name.into(),
            args: vec![s("train"), recipe()],
            env: vec![],
            expect: vec![s("output_dir")],
            not_created: None,
            cwd: Some(cwd),
        };
        if name.ends_with("env") {
            case.env = vec![("RLFT__OUTPUT_DIR", value.into())];
        } else {
            case.args
                .extend([s("--set"), format!("output_dir={value}")]);
        }
        cases.push(case);
    }
    // --- A run to resume, in lagged mode so its checkpoints hold snapshots.
    let run = tmp.path("lagged-run");
    train_ok(
        &run,
        &[
            "schedule.steps=4",
            "sft.steps=2",
            "async.mode=\"lagged\"",
            "async.lag=2",
        ],
    );
    let latest = std::fs::read_to_string(run.join("latest")).unwrap();
    let latest = latest.trim().to_string();
    let resume_case = |name: &str, break_it: &dyn Fn(&Path), expect: &[&str]| {
        let dir = tmp.path(&format!("run-{}", name.replace(' ', "-")));
        copy_tree(&run, &dir);
        break_it(&dir);
        Case {
            name: name.into(),
            args: vec![
                s("train"),
                s("--resume"),
                dir.to_string_lossy().into(),
                s("--set"),
                s("schedule.steps=6"),
            ],
            env: vec![],
            expect: expect
                .iter()
                .map(|e| e.replace("{dir}", &dir.to_string_lossy()))
                .collect(),
            not_created: None,
            cwd: None,
        }
    };
    let edit_loss = |path: &Path| {
        let text = std::fs::read_to_string(path).unwrap();
        assert!(text.contains("loss = \"grpo\""), "{}", path.display());
        std::fs::write(path, text.replace("loss = \"grpo\"", "loss = \"dapo\"")).unwrap();
    };
    let edited = ["recipe.toml", "algorithm.loss", "\"dapo\"", "\"grpo\""];
    cases.push(resume_case(
        "run folder recipe edited",
        &|d| edit_loss(&d.join("recipe.toml")),
        &edited,
    ));
    cases.push(resume_case(
        "every recipe copy edited",
        &|d| {
            for e in std::fs::read_dir(d).unwrap() {
                let p = e.unwrap().path();
                if p.join("recipe.toml").exists() {
                    edit_loss(&p.join("recipe.toml"));
                }
            }
            edit_loss(&d.join("recipe.toml"));
        },
        &edited,
    ));
    let snapshots = |d: &Path| -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(d.join(&latest))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("snapshot-")
            })
            .collect();
        v.sort();
        v
    };
    assert!(snapshots(&run).len() >= 2, "{:?}", snapshots(&run));
    for (name, pick) in [("oldest", 0usize), ("middle", 1), ("newest", usize::MAX)] {
        cases.push(resume_case(
            &format!("lagged snapshot missing {name}"),
            &|d| {
                let all = snapshots(d);
                std::fs::remove_file(&all[pick.min(all.len() - 1)]).unwrap();
            },
            &["snapshot-", "missing"],
        ));
    }
    check_all(cases.len(), &run_cases(&cases));
}

/// A prompt far longer than `rollout.max_prompt_len` is skipped (and counted in
/// `prompts/skipped`) without being tokenised: memory stays bounded by the settings, not by the
/// longest line of the data.
#[test]
fn a_huge_prompt_is_skipped_without_tokenising_it() {
    let tmp = Scratch::new();
    let mut lines = String::new();
    for i in 0..6 {
        lines.push_str(&format!(
            "{{\"prompt\": \"{i}+1\", \"answer\": \"{}\"}}\n",
            i + 1
        ));
    }
    let huge = "9".repeat(24 << 20);
    lines.push_str(&format!("{{\"prompt\": \"{huge}\", \"answer\": \"1\"}}\n"));
    let data = tmp.file("huge.jsonl", lines);
    let out = tmp.path("out-huge");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rlft"));
    cmd.args(["train", &recipe(), "--set"])
        .arg(format!("output_dir=\"{}\"", out.display()))
        .arg("--set")
        .arg(format!("data.train=\"{data}\""))
        .args(["--set", "reward=[{kind = \"exact\"}]"])
        .args(["--set", "schedule.steps=2", "--set", "sft.steps=0"])
        .args([
            "--set",
            "eval.size=2",
            "--set",
            "rollout.prompts_per_step=7",
        ]);
    let (exit, err, peak_kb) = run_measured(cmd);
    assert!(exit.success(), "{err}");
    let metrics = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    let skipped: f64 = metrics
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|m| m["prompts/skipped"].as_f64())
        .sum();
    assert!(skipped >= 1.0, "the huge prompt was not skipped: {metrics}");
    // Tokenising 24 MB costs ≈ 4 GB; the prompt's text itself a few copies of 24 MB.
    assert!(peak_kb < 1 << 20, "peak memory {} MB", peak_kb >> 10);
}
