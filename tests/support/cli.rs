//! Helpers of the tests that run the `rlft` binary (`bad_input.rs`, `bad_input_bounds.rs`,
//! `crash.rs`, `serve.rs`, `rollout_servers.rs`, `server_faults.rs`): scratch folders, cases
//! that must fail with a clear message and the runner that checks them, training runs and
//! their logs without timings. Each test file uses a part of them.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn recipe() -> String {
    root()
        .join("tests/data/recipes/crash.toml")
        .to_string_lossy()
        .into()
}

pub fn tiny_llama() -> PathBuf {
    root().join("tests/data/fixtures/tiny-llama")
}

/// A scratch folder for this test process.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new() -> Self {
        // One folder per test: tests of this file run side by side in one process.
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let d = std::env::temp_dir().join(format!("rlft-bad-input-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Self(d)
    }
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
    pub fn file(&self, name: &str, bytes: impl AsRef<[u8]>) -> String {
        let p = self.path(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, bytes).unwrap();
        p.to_string_lossy().into()
    }
    /// A copy of `src` (a folder, one level of files) at `name`.
    pub fn copy_dir(&self, src: &Path, name: &str) -> PathBuf {
        let dst = self.path(name);
        std::fs::create_dir_all(&dst).unwrap();
        for e in std::fs::read_dir(src).unwrap() {
            let p = e.unwrap().path();
            if p.is_file() {
                std::fs::copy(&p, dst.join(p.file_name().unwrap())).unwrap();
            }
        }
        dst
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub struct Case {
    pub name: String,
    pub args: Vec<String>,
    pub env: Vec<(&'static str, String)>,
    /// Every one must appear in stderr.
    pub expect: Vec<String>,
    /// Must not exist afterwards (a recipe error leaves nothing behind).
    pub not_created: Option<PathBuf>,
    /// Run in this folder, which must still be empty afterwards.
    pub cwd: Option<PathBuf>,
}

pub fn s(x: &str) -> String {
    x.to_string()
}

/// A recipe run with `--set` overrides; the output folder must not be created.
pub fn with_set(cases: &mut Vec<Case>, tmp: &Scratch, name: &str, sets: &[&str], expect: &[&str]) {
    let dir = tmp.path(&format!("out-{}", name.replace(' ', "-")));
    let mut args = vec![s("train"), recipe()];
    for o in sets
        .iter()
        .map(|o| o.to_string())
        .chain([format!("output_dir=\"{}\"", dir.display())])
    {
        args.push(s("--set"));
        args.push(o);
    }
    cases.push(Case {
        name: name.into(),
        args,
        env: vec![],
        expect: expect.iter().map(|e| e.to_string()).collect(),
        cwd: None,
        not_created: Some(dir),
    });
}

/// Rewrites the `config.json` of model folder `dir` through `edit`.
pub fn edit_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&path, v.to_string()).unwrap();
}

pub fn truncate(path: &Path, keep: usize) {
    let bytes = std::fs::read(path).unwrap();
    std::fs::write(path, &bytes[..keep.min(bytes.len())]).unwrap();
}

/// Runs `cmd` (stdout discarded, without `RLFT_DEVICE`) to its end; returns its exit status,
/// its stderr and its peak resident memory in kB, read from `/proc` while it runs.
pub fn run_measured(mut cmd: Command) -> (std::process::ExitStatus, String, u64) {
    let mut child = cmd
        .env_remove("RLFT_DEVICE")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // stderr is drained on its own thread: a child blocked on a full pipe would never end.
    let mut pipe = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut err = String::new();
        std::io::Read::read_to_string(&mut pipe, &mut err).unwrap();
        err
    });
    let status = format!("/proc/{}/status", child.id());
    let mut peak_kb = 0u64;
    let exit = loop {
        if let Ok(text) = std::fs::read_to_string(&status)
            && let Some(kb) = text
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        {
            peak_kb = peak_kb.max(kb);
        }
        if let Some(exit) = child.try_wait().unwrap() {
            break exit;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let err = reader.join().unwrap();
    assert!(peak_kb > 0, "no memory reading from {status}");
    (exit, err, peak_kb)
}

/// Trains the crash recipe into `out` with `sets` overrides; it must succeed.
pub fn train_ok(out: &Path, sets: &[&str]) {
    train_recipe_ok(Path::new(&recipe()), out, sets);
}

/// Trains `recipe` into `out` with `sets` overrides; it must succeed.
/// The API key the tests' `rlft serve` processes start with (`support/serve.rs`) and the
/// trainers they start send (`RLFT_API_KEY`).
pub const TEST_KEY: &str = "rlft-test-key";

pub fn train_recipe_ok(recipe: &Path, out: &Path, sets: &[&str]) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rlft"));
    cmd.arg("train")
        .arg(recipe)
        .arg("--set")
        .arg(format!("output_dir=\"{}\"", out.display()))
        .env_remove("RLFT_DEVICE")
        .env("RLFT_API_KEY", TEST_KEY);
    for set in sets {
        cmd.args(["--set", set]);
    }
    let ok = cmd.output().unwrap();
    assert!(
        ok.status.success(),
        "rlft train {} {sets:?}: {}",
        recipe.display(),
        String::from_utf8_lossy(&ok.stderr)
    );
}

/// A run's `metrics.jsonl` lines without the keys that measure time or the servers
/// (`time/*`, `tokens_per_s`, `async/*`, `server/*`).
pub fn metrics_without_timings(run: &Path) -> Vec<serde_json::Map<String, serde_json::Value>> {
    log_without_timings(&run.join("metrics.jsonl"))
}

/// A JSONL log's lines (`metrics.jsonl`, `sft_metrics.jsonl`) without the keys that measure
/// time or the servers.
pub fn log_without_timings(path: &Path) -> Vec<serde_json::Map<String, serde_json::Value>> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| {
            let mut m: serde_json::Map<String, serde_json::Value> =
                serde_json::from_str(l).unwrap();
            m.retain(|k, _| {
                k != "tokens_per_s"
                    && !["time/", "async/", "server/"]
                        .iter()
                        .any(|p| k.starts_with(p))
            });
            m
        })
        .collect()
}

/// A run's final weights, as written.
pub fn final_weights(run: &Path) -> Vec<u8> {
    let p = run.join("final/model.safetensors");
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Prints `N passed, M failed` for `total` cases, and fails the test with a line for each
/// failure when any failed.
pub fn check_all(total: usize, failed: &[String]) {
    println!("{} passed, {} failed", total - failed.len(), failed.len());
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// Runs every case; returns a line for each that did not end as it must.
pub fn run_cases(cases: &[Case]) -> Vec<String> {
    let mut failed = Vec::new();
    for c in cases {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_rlft"));
        if let Some(d) = &c.cwd {
            std::fs::create_dir_all(d).unwrap();
            cmd.current_dir(d);
        }
        cmd.args(&c.args)
            .env_remove("BURN_DEVICE")
            .env_remove("RLFT_DEVICE")
            .env_remove(rlft::train::fault::PAUSE_ENV);
        for (k, v) in &c.env {
            cmd.env(k, v);
        }
        let o = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        let mut why = Vec::new();
        if o.status.success() {
            why.push("exited 0".to_string());
        }
        if err.contains("panicked") {
            why.push("panicked".into());
        }
        for e in &c.expect {
            if !err.contains(e.as_str()) {
                why.push(format!("no {e:?}"));
            }
        }
        if let Some(d) = &c.not_created
            && d.exists()
        {
            why.push(format!("left {} behind", d.display()));
        }
        if let Some(d) = &c.cwd
            && std::fs::read_dir(d).is_ok_and(|mut e| e.next().is_some())
        {
            why.push(format!("wrote into the working folder {}", d.display()));
        }
        println!("{}: {}", c.name, err.trim());
        if !why.is_empty() {
            failed.push(format!(
                "{}: {} — stderr: {}",
                c.name,
                why.join(", "),
                err.trim()
            ));
        }
    }
    failed
}

pub fn copy_tree(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let p = e.unwrap().path();
        let to = dst.join(p.file_name().unwrap());
        if p.is_dir() {
            copy_tree(&p, &to);
        } else {
            std::fs::copy(&p, &to).unwrap();
        }
    }
}
