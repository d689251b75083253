//! Rollouts on inference servers are exact: the quickstart (shortened) sampled on servers —
//! `rollout.servers = "local:1"` in sync, lagged (lag 2) and async (η = 0) modes, and an `rlft
//! serve` process given by URL — reproduces the in-process run's metrics (all but `time/*`,
//! `tokens_per_s`, `async/*` and `server/*`) and final weights bit for bit. Every server process
//! started here is killed when its test ends, also on failure.

#[path = "support/cli.rs"]
mod cli;
#[path = "support/serve.rs"]
mod serve;

use cli::{Scratch, final_weights, metrics_without_timings, root, train_recipe_ok};
use serve::Serve;
use std::path::{Path, PathBuf};

fn quickstart() -> PathBuf {
    root().join("recipes/quickstart.toml")
}

/// The quickstart cut to seconds: a short warm-up, four RL steps of 8 prompts, evaluation and
/// checkpoints every 2 steps.
const SHORT: [&str; 9] = [
    "device=\"flex\"",
    "sft.steps=6",
    "schedule.steps=4",
    "rollout.prompts_per_step=8",
    "rollout.group_size=4",
    "eval.every=2",
    "eval.size=8",
    "checkpoint.every=2",
    "logging.progress=false",
];

fn run(out: &Path, sets: &[&str]) {
    let all: Vec<&str> = SHORT.iter().copied().chain(sets.iter().copied()).collect();
    train_recipe_ok(&quickstart(), out, &all);
}

/// Runs `sets` in-process and on `"local:1"`; the two must agree bit for bit.
fn same_on_a_local_server(tmp: &Scratch, tag: &str, sets: &[&str]) {
    let here = tmp.path(&format!("{tag}-in-process"));
    let there = tmp.path(&format!("{tag}-local"));
    run(&here, sets);
    let mut on_servers = sets.to_vec();
    on_servers.push("rollout.servers=\"local:1\"");
    run(&there, &on_servers);
    assert_same_run(&here, &there, tag);
    // The local servers stopped with the run and their weight folders went with them.
    assert!(
        !there.join("weights").exists(),
        "{tag}: weights/ left behind"
    );
}

fn assert_same_run(here: &Path, there: &Path, tag: &str) {
    let (a, b) = (
        metrics_without_timings(here),
        metrics_without_timings(there),
    );
    assert_eq!(a.len(), b.len(), "{tag}: metrics lines");
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x, y, "{tag}: step {:?}", x.get("step"));
    }
    assert!(
        final_weights(here) == final_weights(there),
        "{tag}: the final weights differ"
    );
    let raw = std::fs::read_to_string(there.join("metrics.jsonl")).unwrap();
    for line in raw.lines() {
        let m: serde_json::Value = serde_json::from_str(line).unwrap();
        if m.get("reward/mean").is_some() {
            assert!(m["server/requests"].as_f64().unwrap() >= 1.0, "{tag}: {m}");
            assert_eq!(m["server/servers"].as_f64(), Some(1.0), "{tag}");
        }
    }
}

#[test]
fn sync_runs_on_a_local_server_and_on_rlft_serve_equal_the_in_process_run() {
    let tmp = Scratch::new();
    same_on_a_local_server(&tmp, "sync", &[]);
    // An `rlft serve` process holding other weights of the architecture: the run pushes its
    // own before the first request, then every new version through `weights/`.
    let server = Serve::start(&tmp.path("sync-in-process"), &[]);
    let there = tmp.path("sync-url");
    let servers = format!("rollout.servers=[\"{}\"]", server.url);
    run(&there, &[&servers, "rollout.server_timeout_s=120"]);
    assert_same_run(&tmp.path("sync-in-process"), &there, "sync on rlft serve");
    // What the server serves is the run's last version, kept in the run's weights folder.
    let (status, models) = server.get("/v1/models");
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_str(&models).unwrap();
    assert_eq!(v["data"][0]["weight_version"].as_u64(), Some(4));
    let kept: Vec<String> = std::fs::read_dir(there.join("weights"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(kept, ["v4"]);
}

#[test]
fn a_lagged_run_on_a_local_server_equals_the_in_process_run() {
    let tmp = Scratch::new();
    same_on_a_local_server(&tmp, "lagged", &["async.mode=\"lagged\"", "async.lag=2"]);
}

#[test]
fn an_async_run_at_eta_0_on_a_local_server_equals_the_in_process_run() {
    let tmp = Scratch::new();
    same_on_a_local_server(
        &tmp,
        "async",
        &["async.mode=\"async\"", "async.max_staleness=0"],
    );
}

/// Server settings that cannot work are refused before anything is written, naming the key;
/// a server nobody answers at stops the run with exit status 4 and its address, leaving no
/// half-written weight folder.
#[test]
fn bad_server_settings_are_refused_and_an_unreachable_server_stops_the_run() {
    let tmp = Scratch::new();
    let mut cases = Vec::new();
    for (name, sets, expect) in [
        (
            "no local servers",
            &["rollout.servers=\"local:0\""][..],
            &["rollout.servers", "1 to 64"][..],
        ),
        (
            "a URL without its scheme",
            &["rollout.servers=[\"10.0.0.2:8000\"]"],
            &["rollout.servers", "http://host:port"],
        ),
        (
            "local mixed with URLs",
            &["rollout.servers=[\"local:1\", \"http://127.0.0.1:1\"]"],
            &["rollout.servers", "alone"],
        ),
        (
            "weights_dir without servers",
            &["rollout.weights_dir=\"w\""],
            &["rollout.weights_dir", "rollout.servers"],
        ),
        (
            "server_timeout_s without servers",
            &["rollout.server_timeout_s=5.0"],
            &["rollout.server_timeout_s", "rollout.servers"],
        ),
        (
            "server_timeout_s zero",
            &[
                "rollout.servers=\"local:1\"",
                "rollout.server_timeout_s=0.0",
            ],
            &["rollout.server_timeout_s", "> 0"],
        ),
        (
            "server_model on local servers",
            &["rollout.servers=\"local:1\"", "rollout.server_model=\"m\""],
            &["rollout.server_model", "local servers"],
        ),
        (
            "interruptible generation on servers",
            &[
                "rollout.servers=\"local:1\"",
                "async.mode=\"async\"",
                "async.interruptible=true",
            ],
            &["async.interruptible", "rollout.servers"],
        ),
        (
            "server_protocol without servers",
            &["rollout.server_protocol=\"vllm\""],
            &["rollout.server_protocol", "rollout.servers"],
        ),
        (
            "vllm on local servers",
            &[
                "rollout.servers=\"local:1\"",
                "rollout.server_protocol=\"vllm\"",
            ],
            &["rollout.server_protocol", "local:N"],
        ),
        (
            "vllm's raw log-probs as μ",
            &[
                "rollout.servers=[\"http://127.0.0.1:1\"]",
                "rollout.server_protocol=\"vllm\"",
                "rollout.temperature=0.7",
            ],
            &[
                "algorithm.correction.mode",
                "rollout.server_protocol",
                "decoupled",
            ],
        ),
        (
            "sglang's unfiltered log-probs as μ",
            &[
                "rollout.servers=[\"http://127.0.0.1:1\"]",
                "rollout.server_protocol=\"sglang\"",
                "rollout.top_k=20",
                "algorithm.correction.mode=\"bypass\"",
            ],
            &[
                "algorithm.correction.mode",
                "rollout.server_protocol",
                "top-k",
            ],
        ),
        (
            "kept sets from vllm",
            &[
                "rollout.servers=[\"http://127.0.0.1:1\"]",
                "rollout.server_protocol=\"vllm\"",
                "rollout.top_k=20",
                "algorithm.sampling_mask=\"replay\"",
                "algorithm.correction.mode=\"recompute\"",
            ],
            &["algorithm.sampling_mask", "rollout.server_protocol"],
        ),
    ] {
        cli::with_set(&mut cases, &tmp, name, sets, expect);
    }
    let failed = cli::run_cases(&cases);
    cli::check_all(cases.len(), &failed);

    // A port nothing listens on: the first request is refused at once.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = tmp.path("unreachable");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_rlft"))
        .args(["train", &cli::recipe(), "--set"])
        .arg(format!("output_dir=\"{}\"", out.display()))
        .arg("--set")
        .arg(format!("rollout.servers=[\"http://127.0.0.1:{port}\"]"))
        .args(["--set", "rollout.server_timeout_s=10.0"])
        .env_remove("RLFT_DEVICE")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(4), "{err}");
    assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
    assert!(err.contains("rollout servers"), "{err}");
    assert!(
        !out.join("weights")
            .read_dir()
            .unwrap()
            .any(|e| { e.unwrap().file_name().to_string_lossy().starts_with(".v") })
    );
}
