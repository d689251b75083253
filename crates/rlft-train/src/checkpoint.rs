//! Checkpoints: `step-N.tmp/` is written and synced, renamed to `step-N/`, then `latest` is
//! replaced by rename — a crash at any moment leaves the previous checkpoint intact. The last
//! `keep` checkpoints are kept.

use crate::{Result, TrainError, io_err};
use rlft_rollout::DataCursor;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Everything besides the tensors needed to continue a run exactly.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    /// RL steps completed.
    pub step: usize,
    /// Data position.
    pub cursor: DataCursor,
    /// Steps skipped for NaN/Inf so far.
    pub skipped_steps: usize,
    /// Consecutive skipped steps at the end.
    pub bad_in_row: usize,
    /// The SFT warm-up has run.
    pub sft_done: bool,
    /// The recipe the run uses (TOML).
    pub recipe: String,
    /// The adaptive KL controller's current β (absent without one, or before its first step).
    #[serde(default)]
    pub kl_coef: Option<f64>,
}

/// Names of the files in a checkpoint folder.
pub const POLICY_FILE: &str = "policy.bpk";
/// Policy optimiser state.
pub const OPTIM_FILE: &str = "optimizer.bin";
/// Critic weights.
pub const CRITIC_FILE: &str = "critic.bpk";
/// Critic optimiser state.
pub const CRITIC_OPTIM_FILE: &str = "critic_optimizer.bin";
/// [`TrainerState`] as JSON.
pub const STATE_FILE: &str = "state.json";
/// In a run folder: its checkpoints' names in the order they were written, oldest first.
pub const ORDER_FILE: &str = "checkpoints.txt";

fn sync_dir(dir: &Path) {
    // Directory fsync makes the rename durable on Unix; elsewhere it is a no-op.
    if let Ok(f) = std::fs::File::open(dir) {
        let _ = f.sync_all();
    }
}

/// Writes a checkpoint for `state.step`: `write(dir)` saves the tensors into the temporary folder.
pub fn save(
    output_dir: &Path,
    state: &TrainerState,
    keep: usize,
    write: impl FnOnce(&Path) -> Result<()>,
) -> Result<PathBuf> {
    let name = format!("step-{}", state.step);
    let tmp = output_dir.join(format!("{name}.tmp"));
    let dst = output_dir.join(&name);
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(io_err(&tmp))?;
    }
    std::fs::create_dir_all(&tmp).map_err(io_err(&tmp))?;
    write(&tmp)?;
    let state_path = tmp.join(STATE_FILE);
    std::fs::write(&state_path, serde_json::to_vec_pretty(state)?).map_err(io_err(&state_path))?;
    for entry in std::fs::read_dir(&tmp).map_err(io_err(&tmp))? {
        let p = entry.map_err(io_err(&tmp))?.path();
        std::fs::File::open(&p)
            .and_then(|f| f.sync_all())
            .map_err(io_err(&p))?;
    }
    sync_dir(&tmp);
    if dst.exists() {
        std::fs::remove_dir_all(&dst).map_err(io_err(&dst))?;
    }
    std::fs::rename(&tmp, &dst).map_err(io_err(&dst))?;
    let latest_tmp = output_dir.join("latest.tmp");
    std::fs::write(&latest_tmp, &name).map_err(io_err(&latest_tmp))?;
    std::fs::File::open(&latest_tmp)
        .and_then(|f| f.sync_all())
        .map_err(io_err(&latest_tmp))?;
    std::fs::rename(&latest_tmp, output_dir.join("latest")).map_err(io_err(output_dir))?;
    sync_dir(output_dir);
    let order = record(output_dir, &name)?;
    prune(output_dir, keep, &order, &name)?;
    Ok(dst)
}

/// Appends `name` to the run's write order (moving it last if it was written before), and
/// returns the order. The file is replaced atomically.
fn record(output_dir: &Path, name: &str) -> Result<Vec<String>> {
    let path = output_dir.join(ORDER_FILE);
    let mut order: Vec<String> = std::fs::read_to_string(&path)
        .unwrap_or_default()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && *l != name)
        .map(String::from)
        .collect();
    order.push(name.to_string());
    let tmp = output_dir.join(format!("{ORDER_FILE}.tmp"));
    std::fs::write(&tmp, order.join("\n") + "\n").map_err(io_err(&tmp))?;
    std::fs::File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(io_err(&tmp))?;
    std::fs::rename(&tmp, &path).map_err(io_err(&path))?;
    sync_dir(output_dir);
    Ok(order)
}

fn steps_in(output_dir: &Path) -> Result<Vec<(usize, PathBuf)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(output_dir).map_err(io_err(output_dir))? {
        let p = entry.map_err(io_err(output_dir))?.path();
        if let Some(n) = p
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("step-"))
            .and_then(|n| n.parse::<usize>().ok())
            && p.is_dir()
        {
            out.push((n, p));
        }
    }
    out.sort();
    Ok(out)
}

/// Keeps the newest `keep` checkpoints by write order (`order`; folders it does not list, from
/// before it existed, count as older, by step) and never deletes `latest`.
fn prune(output_dir: &Path, keep: usize, order: &[String], latest: &str) -> Result<()> {
    let on_disk = steps_in(output_dir)?;
    let name = |p: &Path| p.file_name().map(|n| n.to_string_lossy().into_owned());
    let mut oldest_first: Vec<PathBuf> = on_disk
        .iter()
        .filter(|(_, p)| name(p).is_none_or(|n| !order.contains(&n)))
        .map(|(_, p)| p.clone())
        .collect();
    oldest_first.extend(
        order
            .iter()
            .map(|n| output_dir.join(n))
            .filter(|p| p.is_dir()),
    );
    let excess = oldest_first.len().saturating_sub(keep);
    for p in oldest_first.iter().take(excess) {
        if name(p).as_deref() != Some(latest) {
            std::fs::remove_dir_all(p).map_err(io_err(p))?;
        }
    }
    Ok(())
}

/// Resolves `--resume PATH`: a checkpoint folder, or a run's `output_dir` (its `latest`).
pub fn locate(path: &Path) -> Result<PathBuf> {
    let err = |msg: String| TrainError::Checkpoint {
        path: path.into(),
        msg,
    };
    if path.join(STATE_FILE).exists() {
        return Ok(path.into());
    }
    let latest = path.join("latest");
    if latest.exists() {
        let name = std::fs::read_to_string(&latest).map_err(io_err(&latest))?;
        let dir = path.join(name.trim());
        if dir.join(STATE_FILE).exists() {
            return Ok(dir);
        }
        return Err(err(format!(
            "'latest' names {} which has no {STATE_FILE}",
            dir.display()
        )));
    }
    Err(err(format!(
        "neither a checkpoint (no {STATE_FILE}) nor a run folder with a 'latest' checkpoint"
    )))
}

/// Reads a checkpoint's state.
pub fn read_state(dir: &Path) -> Result<TrainerState> {
    let p = dir.join(STATE_FILE);
    let text = std::fs::read_to_string(&p).map_err(io_err(&p))?;
    serde_json::from_str(&text).map_err(|e| TrainError::Checkpoint {
        path: dir.into(),
        msg: format!("{STATE_FILE} is unreadable: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(step: usize) -> TrainerState {
        TrainerState {
            step,
            cursor: DataCursor::default(),
            skipped_steps: 0,
            bad_in_row: 0,
            sft_done: true,
            recipe: String::new(),
            kl_coef: None,
        }
    }

    #[test]
    fn atomic_save_latest_and_pruning() {
        let out = std::env::temp_dir().join(format!("rlft-ckpt-{}", std::process::id()));
        std::fs::create_dir_all(&out).unwrap();
        for step in [2, 4, 6] {
            save(&out, &state(step), 2, |d| {
                std::fs::write(d.join("w"), b"x").map_err(io_err(d))
            })
            .unwrap();
        }
        assert_eq!(locate(&out).unwrap(), out.join("step-6"));
        assert_eq!(read_state(&locate(&out).unwrap()).unwrap().step, 6);
        assert!(!out.join("step-2").exists(), "pruned to the last 2");
        assert!(out.join("step-4").exists());
        // A failed write leaves the previous checkpoint as latest.
        let e = save(&out, &state(8), 2, |_| {
            Err(TrainError::Diverged("disk full".into()))
        });
        assert!(e.is_err());
        assert_eq!(locate(&out).unwrap(), out.join("step-6"));
        assert!(locate(&out.join("nothing")).is_err());
        std::fs::remove_dir_all(&out).ok();
    }

    /// Resuming from an older checkpoint writes lower step numbers after higher ones: pruning
    /// goes by write order, so the checkpoint just written (what `latest` names) survives.
    #[test]
    fn pruning_keeps_the_newest_by_write_order() {
        let out = std::env::temp_dir().join(format!("rlft-ckpt-order-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out);
        std::fs::create_dir_all(&out).unwrap();
        let write = |d: &Path| std::fs::write(d.join("w"), b"x").map_err(io_err(d));
        // A folder from before the order file existed counts as the oldest.
        std::fs::create_dir_all(out.join("step-30")).unwrap();
        for step in [10, 20, 5, 6] {
            save(&out, &state(step), 2, write).unwrap();
            assert_eq!(locate(&out).unwrap(), out.join(format!("step-{step}")));
        }
        let mut left: Vec<String> = std::fs::read_dir(&out)
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with("step-"))
            .collect();
        left.sort();
        assert_eq!(left, vec!["step-5", "step-6"]);
        // keep = 1 never deletes what latest names.
        save(&out, &state(3), 1, write).unwrap();
        assert!(out.join("step-3").exists() && !out.join("step-6").exists());
        std::fs::remove_dir_all(&out).ok();
    }
}
