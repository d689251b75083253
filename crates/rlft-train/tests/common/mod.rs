//! Shared by the report and TensorBoard tests: the repository root and a tiny lagged
//! quickstart run.

use std::path::{Path, PathBuf};

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `--set` overrides that make `recipes/quickstart.toml` a tiny run of `steps` steps into
/// `run`: no warm-up, 2 prompts × 2 samples of 4 tokens, lagged by one version (so the
/// staleness figures and histograms have data).
pub fn tiny_lagged_run(run: &Path, steps: usize) -> Vec<String> {
    vec![
        format!("output_dir=\"{}\"", run.display()),
        "device=\"flex\"".into(),
        format!("schedule.steps={steps}"),
        "sft.steps=0".into(),
        "rollout.prompts_per_step=2".into(),
        "rollout.group_size=2".into(),
        "rollout.max_new_tokens=4".into(),
        "rollout.max_total_tokens=4".into(),
        "algorithm.micro_batch_size=4".into(),
        "eval.size=2".into(),
        "eval.k=1".into(),
        "checkpoint.export_final=false".into(),
        "logging.progress=false".into(),
        "async.mode=\"lagged\"".into(),
        "async.lag=1".into(),
    ]
}
