//! Rollout servers that fail cost time, never data. Two `rlft serve` processes sample a run;
//! one is killed (SIGKILL) or hung (SIGSTOP) while it holds a request: the request goes to the
//! other server, `server/requeued` counts it, and the run ends as a fault-free run does, bit for
//! bit, every group consumed once (`events.jsonl`). When every server is gone the run stops
//! with exit status 4, and `--resume` on new servers finishes it, again bit for bit. Every
//! process started here is killed when its test ends, also on failure.

#[path = "support/cli.rs"]
mod cli;
#[path = "support/serve.rs"]
mod serve;

use cli::{Scratch, final_weights, metrics_without_timings, train_ok};
use serde_json::Value;
use serve::Serve;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The crash recipe, longer and with longer samples, so requests are in flight long enough
/// to be caught.
const LONG: [&str; 4] = [
    "schedule.steps=8",
    "rollout.max_new_tokens=48",
    "rollout.max_total_tokens=48",
    "eval.every=4",
];

/// A run of the crash recipe on `servers`, in the background.
fn start_run(out: &Path, servers: &[&Serve], extra: &[&str]) -> Child {
    let urls: Vec<String> = servers.iter().map(|s| format!("\"{}\"", s.url)).collect();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rlft"));
    cmd.args(["train", &cli::recipe(), "--set"])
        .arg(format!("output_dir=\"{}\"", out.display()))
        .arg("--set")
        .arg(format!("rollout.servers=[{}]", urls.join(", ")))
        .env_remove("RLFT_DEVICE")
        .env("RLFT_API_KEY", cli::TEST_KEY)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for s in LONG.iter().chain(extra) {
        cmd.args(["--set", s]);
    }
    cmd.spawn().unwrap()
}

/// Waits until `server` holds a request (at most 120 s).
fn wait_in_flight(server: &Serve) {
    let t0 = Instant::now();
    while server.in_flight() == 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "no request reached the server"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The run's exit status and stderr.
fn finish(child: Child) -> (std::process::ExitStatus, String) {
    let o = child.wait_with_output().unwrap();
    (o.status, String::from_utf8_lossy(&o.stderr).into_owned())
}

fn events(run: &Path) -> Vec<Value> {
    std::fs::read_to_string(run.join("events.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// From `events.jsonl`: every batch consumed once, and each group of each batch's rounds
/// answered by exactly one request; returns the requests requeued.
fn check_events(run: &Path) -> usize {
    let ev = events(run);
    let mut consumed = BTreeMap::new();
    let mut answered: BTreeMap<(u64, usize, usize), usize> = BTreeMap::new();
    let mut requeued = 0;
    for e in &ev {
        let batch = e["batch"].as_u64();
        match e["kind"].as_str() {
            Some("consume") => *consumed.entry(batch.unwrap()).or_insert(0) += 1,
            Some("request") => {
                let g: Vec<usize> = e["groups"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_u64().unwrap() as usize)
                    .collect();
                if e["outcome"] == "ok" {
                    for &group in &g[1..] {
                        *answered.entry((batch.unwrap(), g[0], group)).or_insert(0) += 1;
                    }
                } else {
                    assert!(e["outcome"].as_str().unwrap().starts_with("requeued"));
                    requeued += 1;
                }
            }
            _ => {}
        }
    }
    assert!(!consumed.is_empty(), "no consumption recorded");
    for (b, n) in &consumed {
        assert_eq!(*n, 1, "batch {b} consumed {n} times");
    }
    for (k, n) in &answered {
        assert_eq!(*n, 1, "batch, round, group {k:?} answered {n} times");
    }
    requeued
}

fn requeued_metric(run: &Path) -> f64 {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter_map(|m| m["server/requeued"].as_f64())
        .sum()
}

fn assert_same_run(reference: &Path, run: &Path, what: &str) {
    assert_eq!(
        metrics_without_timings(reference),
        metrics_without_timings(run),
        "{what}: metrics"
    );
    assert!(
        final_weights(reference) == final_weights(run),
        "{what}: final weights"
    );
}

#[test]
fn a_server_killed_or_hung_mid_request_costs_time_not_data() {
    let tmp = Scratch::new();
    let reference = tmp.path("reference");
    let sets: Vec<&str> = LONG.to_vec();
    train_ok(&reference, &sets);
    for fault in ["KILL", "STOP"] {
        let mut a = Serve::start(&reference, &[]);
        let mut b = Serve::start(&reference, &[]);
        let out = tmp.path(&format!("fault-{fault}"));
        let run = start_run(&out, &[&a, &b], &["rollout.server_timeout_s=4.0"]);
        wait_in_flight(&b);
        match fault {
            "KILL" => b.kill(),
            _ => b.signal("STOP"),
        }
        let (status, err) = finish(run);
        assert!(status.success(), "{fault}: {err}");
        assert!(err.contains("rollout server down"), "{fault}: {err}");
        assert_same_run(&reference, &out, fault);
        let requeued = check_events(&out);
        assert!(requeued >= 1, "{fault}: no request requeued");
        assert_eq!(requeued_metric(&out), requeued as f64, "{fault}");
        a.kill();
        b.kill();
    }
}

/// A killed server restarted at its address gets work again, once it serves the run's version:
/// the run ends bit for bit as a fault-free one, with requests answered by the new process.
#[test]
fn a_server_restarted_at_its_address_rejoins_on_the_current_version() {
    let tmp = Scratch::new();
    let longer: Vec<&str> = LONG.iter().copied().chain(["schedule.steps=12"]).collect();
    let reference = tmp.path("reference");
    train_ok(&reference, &longer);
    let a = Serve::start(&reference, &[]);
    let mut b = Serve::start(&reference, &[]);
    let out = tmp.path("restarted");
    let run = start_run(
        &out,
        &[&a, &b],
        &["rollout.server_timeout_s=4.0", "schedule.steps=12"],
    );
    wait_in_flight(&b);
    b.kill();
    let port = b.url.rsplit(':').next().unwrap().to_string();
    let b2 = Serve::start(&reference, &["--port", &port]);
    assert_eq!(b2.url, b.url);
    let (status, err) = finish(run);
    assert!(status.success(), "{err}");
    assert!(err.contains("is back"), "{err}");
    assert_same_run(&reference, &out, "restarted");
    assert!(check_events(&out) >= 1);
    // The new process answered requests, on the version the run had reached.
    let after_restart = events(&out)
        .iter()
        .filter(|e| e["kind"] == "request" && e["server"] == b.url.as_str())
        .skip_while(|e| e["outcome"] == "ok")
        .skip_while(|e| e["outcome"] != "ok")
        .count();
    assert!(after_restart >= 1, "the restarted server got no request");
    let (_, models) = b2.get("/v1/models");
    let v: Value = serde_json::from_str(&models).unwrap();
    assert_eq!(v["data"][0]["weight_version"].as_u64(), Some(12));
}

/// Async mode at η = 2 with two workers: a server killed mid-request loses no group, and no
/// consumed group is older than η.
#[test]
fn an_async_run_keeps_its_staleness_bound_when_a_server_dies() {
    let tmp = Scratch::new();
    let model = tmp.path("model");
    train_ok(&model, &["schedule.steps=1"]);
    let a = Serve::start(&model, &[]);
    let mut b = Serve::start(&model, &[]);
    let out = tmp.path("async");
    let run = start_run(
        &out,
        &[&a, &b],
        &[
            "rollout.server_timeout_s=4.0",
            "async.mode=\"async\"",
            "async.max_staleness=2",
            "async.rollout_workers=2",
        ],
    );
    wait_in_flight(&b);
    b.kill();
    let (status, err) = finish(run);
    assert!(status.success(), "{err}");
    assert!(check_events(&out) >= 1, "no request requeued");
    let lines = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    let steps: Vec<Value> = lines
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|m| m.get("reward/mean").is_some())
        .collect();
    assert_eq!(steps.len(), 8);
    for m in &steps {
        assert!(m["staleness/max"].as_f64().unwrap() <= 2.0, "{m}");
    }
}

#[test]
fn with_every_server_gone_the_run_stops_with_status_4_and_resumes_on_new_ones() {
    let tmp = Scratch::new();
    let reference = tmp.path("reference");
    train_ok(&reference, &LONG);
    let mut a = Serve::start(&reference, &[]);
    let mut b = Serve::start(&reference, &[]);
    let out = tmp.path("gone");
    let run = start_run(&out, &[&a, &b], &["rollout.server_timeout_s=2.0"]);
    // Both die once the first RL step is logged.
    let t0 = Instant::now();
    while std::fs::read_to_string(out.join("metrics.jsonl")).map_or(0, |m| m.lines().count()) < 1 {
        assert!(t0.elapsed() < Duration::from_secs(120), "no step logged");
        std::thread::sleep(Duration::from_millis(5));
    }
    a.kill();
    b.kill();
    let (status, err) = finish(run);
    assert_eq!(status.code(), Some(4), "{err}");
    assert!(err.contains("rollout servers"), "{err}");
    assert!(err.contains(&a.url) && err.contains(&b.url), "{err}");
    // New servers at new addresses: the run goes on from its last checkpoint.
    let c = Serve::start(&reference, &[]);
    let d = Serve::start(&reference, &[]);
    let o = Command::new(env!("CARGO_BIN_EXE_rlft"))
        .args(["train", "--resume"])
        .arg(&out)
        .arg("--set")
        .arg(format!("rollout.servers=[\"{}\", \"{}\"]", c.url, d.url))
        .env_remove("RLFT_DEVICE")
        .env("RLFT_API_KEY", cli::TEST_KEY)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_same_run(&reference, &out, "resumed on new servers");
}
