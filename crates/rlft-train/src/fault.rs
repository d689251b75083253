//! Crash-test hooks. With `RLFT_PAUSE_AT=<point>` in the environment, the trainer announces
//! `rlft: paused at <point>` on stderr when it reaches that point and then waits forever, so a
//! test can kill it there (SIGKILL) and check that `--resume` loses nothing. Without the
//! variable a point costs one comparison.
//!
//! The points, in the order a run passes them:
//! - `warmup:<k>`: after SFT warm-up step `k` (1-based), before its checkpoint;
//! - `rollout:<n>`: after RL step `n`'s rollouts and rewards, before its update;
//! - `update:<n>`: after step `n`'s update, before its metrics line and checkpoint;
//! - `rank<r>:update:<n>`: on MPI learner rank `r` past the first, with step `n`'s rows, before
//!   its share of the update;
//! - `checkpoint:<name>`: inside a checkpoint write (`name` is `warmup-<k>` or `step-<n>`),
//!   with its files written to the temporary folder, before the rename that publishes it.

use std::sync::OnceLock;

/// The environment variable naming the point to pause at.
pub const PAUSE_ENV: &str = "RLFT_PAUSE_AT";

fn target() -> Option<&'static str> {
    static TARGET: OnceLock<Option<String>> = OnceLock::new();
    TARGET
        .get_or_init(|| std::env::var(PAUSE_ENV).ok().filter(|s| !s.is_empty()))
        .as_deref()
}

/// Marks a point; pauses there for good if it is the one `RLFT_PAUSE_AT` names.
pub fn point(name: impl FnOnce() -> String) {
    let Some(target) = target() else {
        return;
    };
    let name = name();
    if name == target {
        eprintln!("rlft: paused at {name}");
        loop {
            std::thread::park();
        }
    }
}
