//! Learner ranks as MPI processes (`[distributed] backend = "mpi"`): the `rlft` binary under
//! `mpirun` against thread ranks, the sharded optimizer state, resume with another world size,
//! and a rank stopped mid-step.
//!
//! They need OpenMPI (Debian: `openmpi-bin libopenmpi-dev libclang-dev`) and a build with the
//! `mpi` feature, so they are ignored by default; `.ci/run` runs them with
//! `cargo test --workspace --features ndarray,mpi --test mpi -- --ignored --test-threads 1`.

#[path = "support/cli.rs"]
mod cli;

use cli::{Scratch, copy_tree, final_weights, log_without_timings};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn quickstart() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("recipes/quickstart.toml")
        .to_string_lossy()
        .into()
}

/// The quickstart, shortened: a 40-step warm-up, `steps` GRPO steps of 256 rows (3 ranks: 86,
/// 85 and 85 rows), the final weights exported.
fn sets(out: &Path, steps: usize, extra: &[&str]) -> Vec<String> {
    let mut v = vec![
        format!("output_dir=\"{}\"", out.display()),
        format!("schedule.steps={steps}"),
        "sft.steps=40".into(),
        "eval.every=0".into(),
        "logging.progress=false".into(),
        "checkpoint.export_final=true".into(),
        "checkpoint.every=2".into(),
        "checkpoint.keep=10".into(),
    ];
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

/// `rlft train` under `mpirun -np ranks` (`args` after `train`).
fn mpirun(ranks: usize, args: &[String]) -> Command {
    let mut cmd = Command::new("mpirun");
    cmd.args(["--allow-run-as-root", "--oversubscribe", "-np"])
        .arg(ranks.to_string())
        .arg(env!("CARGO_BIN_EXE_rlft"))
        .arg("train")
        .args(args)
        .env_remove("RLFT_DEVICE")
        .env_remove(rlft::train::fault::PAUSE_ENV);
    cmd
}

/// `rlft train` in this process's way: one process, thread ranks.
fn rlft(args: &[String]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rlft"));
    cmd.arg("train")
        .args(args)
        .env_remove("RLFT_DEVICE")
        .env_remove(rlft::train::fault::PAUSE_ENV);
    cmd
}

fn ok(mut cmd: Command, what: &str) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A fresh quickstart run of `steps` steps: `ranks` thread ranks (`mpi: None`), or MPI ranks
/// (`Some(shard_optimizer)`).
fn train(out: &Path, ranks: usize, mpi: Option<bool>, steps: usize) -> Output {
    let mut args = vec![quickstart()];
    match mpi {
        None => {
            let devices = vec!["\"flex\""; ranks].join(", ");
            let extra = format!("distributed.devices=[{devices}]");
            args.push("--set".into());
            args.push(extra);
            with_args(&mut args, out, steps, &[]);
            ok(rlft(&args), &format!("{ranks} thread ranks"))
        }
        Some(shard) => {
            let shard = format!("distributed.shard_optimizer={shard}");
            let extra = ["distributed.backend=\"mpi\"", "device=\"flex\"", &shard];
            with_args(&mut args, out, steps, &extra);
            ok(
                mpirun(ranks, &args),
                &format!("{ranks} MPI ranks ({shard})"),
            )
        }
    }
}

fn with_args(args: &mut Vec<String>, out: &Path, steps: usize, extra: &[&str]) {
    for s in sets(out, steps, extra) {
        args.push("--set".into());
        args.push(s);
    }
}

/// 2 and 3 MPI ranks give the weights and metrics of 2 and 3 thread ranks bit for bit, with
/// and without the optimizer state sharded; sharded, each rank holds a share of the state.
#[test]
#[ignore = "needs OpenMPI: cargo test --workspace --features ndarray,mpi --test mpi -- --ignored --test-threads 1"]
fn mpi_ranks_equal_thread_ranks() {
    let tmp = Scratch::new();
    for ranks in [2, 3] {
        let threads = tmp.path(&format!("threads{ranks}"));
        train(&threads, ranks, None, 3);
        let whole = tmp.path(&format!("mpi{ranks}"));
        let unsharded = train(&whole, ranks, Some(false), 3);
        let sharded_dir = tmp.path(&format!("mpi{ranks}-sharded"));
        let sharded = train(&sharded_dir, ranks, Some(true), 3);
        let want = final_weights(&threads);
        assert!(
            want == final_weights(&whole),
            "{ranks} MPI ranks: other weights"
        );
        assert!(
            want == final_weights(&sharded_dir),
            "{ranks} sharded MPI ranks: other weights"
        );
        let log = |d: &Path| log_without_timings(&d.join("metrics.jsonl"));
        assert_eq!(
            log(&threads),
            log(&whole),
            "{ranks} MPI ranks: other metrics"
        );
        assert_eq!(log(&threads), log(&sharded_dir));
        let whole_bytes = state_bytes(&unsharded);
        let shares = state_bytes(&sharded);
        assert_eq!(whole_bytes.len(), ranks);
        assert_eq!(shares.len(), ranks);
        // Unsharded every rank holds the whole state; sharded, the shares add up to it (up to
        // each record's few hundred bytes of framing), none above 2/N of it.
        let total = whole_bytes[0] as f64;
        assert!(whole_bytes.iter().all(|&b| b == whole_bytes[0]));
        let sum: usize = shares.iter().sum();
        assert!(
            (sum as f64 - total).abs() < 0.02 * total,
            "{shares:?} of {total}"
        );
        for s in &shares {
            assert!(
                (*s as f64) < 2.0 * total / ranks as f64,
                "{shares:?} of {total}"
            );
        }
        println!("{ranks} ranks: optimizer state {whole_bytes:?} unsharded, {shares:?} sharded");
    }
}

/// The bytes of each rank's optimizer state that rank 0 reports at the end.
fn state_bytes(out: &Output) -> Vec<usize> {
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err
        .lines()
        .find_map(|l| l.strip_prefix("optimizer state per learner rank: "))
        .unwrap_or_else(|| panic!("no optimizer state line in\n{err}"));
    let list = line.trim_end_matches(" bytes");
    serde_json::from_str(list).unwrap_or_else(|e| panic!("{line}: {e}"))
}

/// A checkpoint of a sharded 2-rank run holds the whole optimizer state: resuming it with 2
/// ranks gives the uninterrupted run's weights bit for bit, and with 1 (threads) or 3 ranks
/// it trains on to the end.
#[test]
#[ignore = "needs OpenMPI: cargo test --workspace --features ndarray,mpi --test mpi -- --ignored --test-threads 1"]
fn sharded_checkpoints_resume_with_other_world_sizes() {
    let tmp = Scratch::new();
    let full = tmp.path("full");
    train(&full, 2, Some(true), 4);
    let want = final_weights(&full);
    for (ranks, mpi) in [(2, true), (3, true), (1, false)] {
        let dir = tmp.path(&format!("resume{ranks}"));
        copy_tree(&full, &dir);
        let _ = std::fs::remove_dir_all(dir.join("final"));
        let mut args = vec!["--resume".into(), dir.join("step-2").display().to_string()];
        let cmd = if mpi {
            mpirun(ranks, &args)
        } else {
            args.extend(["--set".into(), "distributed.backend=\"threads\"".into()]);
            args.extend(["--set".into(), "distributed.shard_optimizer=false".into()]);
            rlft(&args)
        };
        ok(cmd, &format!("resume with {ranks} ranks"));
        let got = final_weights(&dir);
        let log = log_without_timings(&dir.join("metrics.jsonl"));
        assert_eq!(log.len(), 5, "{ranks} ranks: steps 0..=4");
        if ranks == 2 {
            assert!(got == want, "resumed with 2 ranks: other weights");
            assert_eq!(log, log_without_timings(&full.join("metrics.jsonl")));
        } else {
            // Another world size sums the shards' gradients in another grouping: the same
            // update up to rounding.
            let diff = max_weight_diff(&got, &want);
            assert!(
                diff < 1e-3,
                "resumed with {ranks} ranks: weights off by {diff}"
            );
        }
    }
}

/// Largest difference between two safetensors files' f32 values (their headers equal).
fn max_weight_diff(a: &[u8], b: &[u8]) -> f32 {
    assert_eq!(a.len(), b.len());
    let header = 8 + u64::from_le_bytes(a[..8].try_into().unwrap()) as usize;
    let f = |x: &[u8]| {
        x[header..]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect::<Vec<_>>()
    };
    f(a).iter()
        .zip(f(b))
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Stops every process it holds when dropped, also when the test fails.
struct Job {
    mpirun: Child,
    stopped: Vec<u32>,
}

impl Drop for Job {
    fn drop(&mut self) {
        for pid in &self.stopped {
            signal(*pid, "CONT");
            signal(*pid, "KILL");
        }
        let _ = self.mpirun.kill();
        let _ = self.mpirun.wait();
    }
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stderr(Stdio::null())
        .status();
}

/// The pid of the `rlft` process that is MPI rank `rank` of the job `mpirun` runs.
fn rank_pid(rank: usize) -> Option<u32> {
    let want = format!("OMPI_COMM_WORLD_RANK={rank}");
    std::fs::read_dir("/proc").ok()?.find_map(|e| {
        let pid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
        let ours = exe.ends_with("rlft") || exe.to_string_lossy().contains("/rlft");
        let of_rank = env.split(|b| *b == 0).any(|kv| kv == want.as_bytes());
        let in_test = env
            .split(|b| *b == 0)
            .any(|kv| kv == b"RLFT_MPI_TEST=stop".as_slice());
        (ours && of_rank && in_test).then_some(pid)
    })
}

/// A rank stopped (SIGSTOP) in the middle of a step makes every other rank stop within
/// `distributed.timeout_s`, with an error naming it and exit status 5; the run folder's last
/// checkpoint is whole, and resuming it gives the uninterrupted run's weights.
#[test]
#[ignore = "needs OpenMPI: cargo test --workspace --features ndarray,mpi --test mpi -- --ignored --test-threads 1"]
fn a_stopped_rank_stops_every_rank() {
    let tmp = Scratch::new();
    let out = tmp.path("stopped");
    let mut args = vec![quickstart()];
    let extra = [
        "distributed.backend=\"mpi\"",
        "device=\"flex\"",
        "distributed.timeout_s=5",
    ];
    with_args(&mut args, &out, 4, &extra);
    let mut cmd = mpirun(2, &args);
    // Rank 1 announces that it has the rows of step 3 and waits there; then it is stopped.
    cmd.env(rlft::train::fault::PAUSE_ENV, "rank1:update:3")
        .env("RLFT_MPI_TEST", "stop")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("mpirun");
    let stderr = child.stderr.take().expect("stderr");
    let mut job = Job {
        mpirun: child,
        stopped: Vec::new(),
    };
    let mut lines = BufReader::new(stderr).lines();
    let mut seen = String::new();
    for line in lines.by_ref() {
        let line = line.expect("stderr line");
        seen += &line;
        seen.push('\n');
        if line.contains("rlft: paused at rank1:update:3") {
            break;
        }
    }
    assert!(seen.contains("paused at"), "rank 1 never paused:\n{seen}");
    let pid = rank_pid(1).expect("rank 1's process");
    signal(pid, "STOP");
    job.stopped.push(pid);
    let stopped_at = Instant::now();
    for line in lines {
        seen += &line.expect("stderr line");
        seen.push('\n');
    }
    let status = job.mpirun.wait().expect("mpirun's status");
    let took = stopped_at.elapsed();
    assert!(!status.success(), "the job went on:\n{seen}");
    assert_eq!(status.code(), Some(5), "{seen}");
    assert!(took < Duration::from_secs(60), "stopped after {took:?}");
    assert!(seen.contains("learner rank(s) [1]"), "{seen}");
    // Nothing torn: no half-written checkpoint is published, and the last one resumes.
    let latest = std::fs::read_to_string(out.join("latest")).expect("latest");
    assert_eq!(latest.trim(), "step-2");
    let dir = tmp.path("resumed");
    copy_tree(&out, &dir);
    let resume = vec!["--resume".into(), dir.display().to_string()];
    ok(mpirun(2, &resume), "resume after the stop");
    let whole = tmp.path("whole");
    train(&whole, 2, Some(false), 4);
    assert!(final_weights(&dir) == final_weights(&whole));
}

/// `mpi` outside an MPI launcher (or in a build without the feature) is refused with the
/// command to use, before anything is written.
#[test]
fn mpi_without_a_launcher_is_refused() {
    let tmp = Scratch::new();
    let out = tmp.path("never");
    let mut args = vec![quickstart()];
    with_args(&mut args, &out, 1, &["distributed.backend=\"mpi\""]);
    let run = rlft(&args)
        .env_remove("OMPI_COMM_WORLD_SIZE")
        .env_remove("PMIX_RANK")
        .env_remove("PMI_RANK")
        .env_remove("PMI_SIZE")
        .output()
        .expect("rlft");
    let err = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(2), "{err}");
    assert!(err.contains("mpirun -np N"), "{err}");
    assert!(!out.exists());
    // Sharding is for process ranks.
    let mut args = vec![quickstart()];
    with_args(&mut args, &out, 1, &["distributed.shard_optimizer=true"]);
    let run = rlft(&args).output().expect("rlft");
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success());
    assert!(err.contains("distributed.shard_optimizer"), "{err}");
}
