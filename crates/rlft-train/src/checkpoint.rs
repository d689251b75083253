//! Checkpoints: `<name>.tmp/` is written and synced, renamed to `<name>/`, then `latest` is
//! replaced by rename — a crash at any moment leaves the previous checkpoint intact. The newest
//! `keep` checkpoints by write order are kept, never the one `latest` names. A checkpoint is
//! `warmup-<k>` during the SFT warm-up and `step-<n>` after RL step `n` (`step-0`: the warm-up
//! is over, no RL step taken yet). Each holds the run's effective recipe (`recipe.toml`).

use crate::{Result, TrainError, io_err, write_atomic};
use rlft_model::sync_dir;
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
    /// SFT warm-up steps completed (while `sft_done` is false).
    #[serde(default)]
    pub sft_step: usize,
    /// The recipe the run uses (TOML).
    pub recipe: String,
    /// The adaptive KL controller's current β (absent without one, or before its first step).
    #[serde(default)]
    pub kl_coef: Option<f64>,
    /// Prompts issued to batches not yet consumed, and staleness counters
    /// ([`crate::rollout_side::admission`]).
    #[serde(default)]
    pub pipeline: crate::rollout_side::admission::PipelineState,
    /// Lagged mode: the versions whose policies the checkpoint holds ([`snapshot_file`]),
    /// oldest first; a resumed run needs every one of them.
    #[serde(default)]
    pub snapshots: Vec<u64>,
}

impl TrainerState {
    /// A run at its start, with the effective recipe `recipe` (TOML).
    pub fn new(recipe: String) -> Self {
        Self {
            step: 0,
            cursor: DataCursor::default(),
            skipped_steps: 0,
            bad_in_row: 0,
            sft_done: false,
            sft_step: 0,
            recipe,
            kl_coef: None,
            pipeline: Default::default(),
            snapshots: Vec::new(),
        }
    }

    /// The name of the checkpoint of this state: `warmup-<k>` or `step-<n>`.
    pub fn checkpoint_name(&self) -> String {
        if self.sft_done {
            format!("step-{}", self.step)
        } else {
            format!("warmup-{}", self.sft_step)
        }
    }
}

/// Names of the files in a checkpoint folder.
pub const POLICY_FILE: &str = "policy.bpk";
/// Policy optimiser state (the warm-up's optimiser in a `warmup-<k>` checkpoint).
pub const OPTIM_FILE: &str = "optimizer.bin";
/// Critic weights.
pub const CRITIC_FILE: &str = "critic.bpk";
/// Critic optimiser state.
pub const CRITIC_OPTIM_FILE: &str = "critic_optimizer.bin";
/// [`TrainerState`] as JSON.
pub const STATE_FILE: &str = "state.json";
/// The effective recipe (after file, environment and `--set`), in a checkpoint and in the run
/// folder (written when the run starts, so a run killed before its first checkpoint can be
/// resumed from its start).
pub const RECIPE_FILE: &str = "recipe.toml";
/// Lagged mode: the file of the policy of version `v` (kept for the steps it still samples).
pub fn snapshot_file(v: u64) -> String {
    format!("snapshot-{v}.bpk")
}

/// The versions of the lagged-mode snapshots in a checkpoint folder, oldest first.
pub fn snapshot_versions(dir: &Path) -> Result<Vec<u64>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io_err(dir))? {
        let name = entry.map_err(io_err(dir))?.file_name();
        if let Some(v) = name
            .to_str()
            .and_then(|n| n.strip_prefix("snapshot-")?.strip_suffix(".bpk"))
            .and_then(|v| v.parse().ok())
        {
            out.push(v);
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// In a run folder: its checkpoints' names in the order they were written, oldest first.
pub const ORDER_FILE: &str = "checkpoints.txt";

/// Writes the checkpoint of `state` ([`TrainerState::checkpoint_name`]) into `output_dir`:
/// `write(dir)` saves the tensors into the temporary folder.
pub fn save(
    output_dir: &Path,
    state: &TrainerState,
    keep: usize,
    write: impl FnOnce(&Path) -> Result<()>,
) -> Result<PathBuf> {
    let name = state.checkpoint_name();
    let tmp = output_dir.join(format!("{name}.tmp"));
    let dst = output_dir.join(&name);
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(io_err(&tmp))?;
    }
    let written = (|| {
        std::fs::create_dir_all(&tmp).map_err(io_err(&tmp))?;
        write(&tmp)?;
        let state_path = tmp.join(STATE_FILE);
        std::fs::write(&state_path, serde_json::to_vec_pretty(state)?)
            .map_err(io_err(&state_path))?;
        let recipe_path = tmp.join(RECIPE_FILE);
        std::fs::write(&recipe_path, &state.recipe).map_err(io_err(&recipe_path))?;
        for entry in std::fs::read_dir(&tmp).map_err(io_err(&tmp))? {
            let p = entry.map_err(io_err(&tmp))?.path();
            std::fs::File::open(&p)
                .and_then(|f| f.sync_all())
                .map_err(io_err(&p))?;
        }
        sync_dir(&tmp);
        Ok(())
    })();
    if let Err(e) = written {
        // A failed write (a full disk) leaves no half checkpoint behind.
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    crate::fault::point(|| format!("checkpoint:{name}"));
    // Saving a name again (a run resumed from an older checkpoint reaches it again): the old
    // folder is moved aside, not deleted, until the new one is in place.
    let old = output_dir.join(format!("{name}.old"));
    if dst.exists() {
        if old.exists() {
            std::fs::remove_dir_all(&old).map_err(io_err(&old))?;
        }
        std::fs::rename(&dst, &old).map_err(io_err(&dst))?;
    }
    std::fs::rename(&tmp, &dst).map_err(io_err(&dst))?;
    sync_dir(output_dir);
    write_atomic(&output_dir.join("latest"), name.as_bytes())?;
    if old.exists() {
        std::fs::remove_dir_all(&old).map_err(io_err(&old))?;
    }
    let order = record(output_dir, &name)?;
    prune(output_dir, keep, &order, &name)?;
    Ok(dst)
}

/// Makes `dir` (a checkpoint of the run in `output_dir`) the run's latest, as a resume from it
/// does: the run goes on from there, so a crash before its next checkpoint resumes there again,
/// not at a later checkpoint of the abandoned branch.
pub fn adopt(output_dir: &Path, dir: &Path) -> Result<()> {
    let Some(name) = dir.file_name().and_then(|n| n.to_str()) else {
        return Ok(());
    };
    if dir.parent() != Some(output_dir) && !output_dir.join(name).join(STATE_FILE).exists() {
        return Ok(());
    }
    write_atomic(&output_dir.join("latest"), name.as_bytes())?;
    record(output_dir, name)?;
    Ok(())
}

/// Appends `name` to the run's write order (moving it last if it was written before), and
/// returns the order. The file is replaced atomically.
fn record(output_dir: &Path, name: &str) -> Result<Vec<String>> {
    let mut order: Vec<String> = read_order(output_dir)?
        .into_iter()
        .filter(|l| l != name)
        .collect();
    order.push(name.to_string());
    write_atomic(
        &output_dir.join(ORDER_FILE),
        (order.join("\n") + "\n").as_bytes(),
    )?;
    Ok(order)
}

/// The run's checkpoint names in write order (none before the first checkpoint).
fn read_order(output_dir: &Path) -> Result<Vec<String>> {
    let path = output_dir.join(ORDER_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(TrainError::Checkpoint {
            path,
            msg: format!(
                "cannot read the run's checkpoint order ({e}); pruning would go by step, not \
                 by write order: fix the file's permissions or delete it"
            ),
        }),
    }
}

/// The checkpoint folders in `output_dir`, oldest first by (warm-up before RL, step).
fn checkpoints_in(output_dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(output_dir).map_err(io_err(output_dir))? {
        let p = entry.map_err(io_err(output_dir))?.path();
        let Some(name) = p.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let key = [("warmup-", 0), ("step-", 1)]
            .iter()
            .find_map(|(prefix, phase)| {
                let n = name.strip_prefix(prefix)?.parse::<usize>().ok()?;
                Some((*phase, n))
            });
        if let Some(key) = key
            && p.is_dir()
        {
            out.push((key, p));
        }
    }
    out.sort();
    Ok(out.into_iter().map(|(_, p)| p).collect())
}

/// Keeps the newest `keep` checkpoints by write order (`order`; folders it does not list, from
/// before it existed, count as older) and never deletes `latest`.
fn prune(output_dir: &Path, keep: usize, order: &[String], latest: &str) -> Result<()> {
    let name = |p: &Path| p.file_name().map(|n| n.to_string_lossy().into_owned());
    let mut oldest_first: Vec<PathBuf> = checkpoints_in(output_dir)?
        .into_iter()
        .filter(|p| name(p).is_none_or(|n| !order.contains(&n)))
        .collect();
    oldest_first.extend(
        order
            .iter()
            .map(|n| output_dir.join(n))
            .filter(|p| p.is_dir()),
    );
    // Temporary folders of checkpoints a crash cut short hold whole weights: swept here.
    for entry in std::fs::read_dir(output_dir).map_err(io_err(output_dir))? {
        let p = entry.map_err(io_err(output_dir))?.path();
        if p.is_dir() && p.extension().is_some_and(|e| e == "tmp" || e == "old") {
            std::fs::remove_dir_all(&p).map_err(io_err(&p))?;
        }
    }
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
    match resume_from(path)? {
        ResumeFrom::Checkpoint(dir) => Ok(dir),
        ResumeFrom::Start(_) => Err(TrainError::Checkpoint {
            path: path.into(),
            msg: "the run has no checkpoint yet".into(),
        }),
    }
}

/// Where `--resume PATH` continues a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResumeFrom {
    /// A checkpoint folder (given, or the one a run folder's `latest` names).
    Checkpoint(PathBuf),
    /// A run folder without a checkpoint (killed before its first): the run starts again from
    /// the beginning, with the recipe stored in its [`RECIPE_FILE`].
    Start(PathBuf),
}

impl ResumeFrom {
    /// The run folder: where the run goes on writing.
    pub fn run_dir(&self) -> PathBuf {
        match self {
            Self::Checkpoint(dir) => dir
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .map_or_else(|| PathBuf::from("."), Path::to_path_buf),
            Self::Start(dir) => dir.clone(),
        }
    }

    /// The run's effective recipe as stored (TOML): a checkpoint's `state.json` holds the recipe
    /// it was written with, and the `recipe.toml` copies beside it (in the checkpoint and the run
    /// folder) must agree with it in every key a resumed run cannot change.
    ///
    /// # Errors
    /// When neither the checkpoint nor the run folder holds one, or a `recipe.toml` copy was
    /// edited (naming each changed key with both values).
    pub fn stored_recipe(&self) -> Result<String> {
        let from_state = match self {
            Self::Checkpoint(dir) => read_state(dir)?.recipe,
            Self::Start(_) => String::new(),
        };
        if let Self::Checkpoint(dir) = self
            && !from_state.trim().is_empty()
        {
            // The `recipe.toml` copies must still say what the checkpoint was written with.
            let stored = crate::Recipe::from_stored(&from_state)?;
            for copy in [dir.join(RECIPE_FILE), self.run_dir().join(RECIPE_FILE)] {
                match std::fs::read_to_string(&copy) {
                    Ok(text) => crate::recipe::check_stored_copy(&copy, &text, &stored)?,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io_err(&copy)(e)),
                }
            }
            return Ok(from_state);
        }
        let p = self.run_dir().join(RECIPE_FILE);
        match std::fs::read_to_string(&p) {
            Ok(text) if !text.trim().is_empty() => Ok(text),
            _ => Err(TrainError::Checkpoint {
                path: p,
                msg: "the run stores no recipe (missing or empty); pass the recipe file too: \
                      rlft train RECIPE.toml --resume DIR"
                    .into(),
            }),
        }
    }
}

/// Resolves `--resume PATH`: a checkpoint folder; a run folder's `latest` checkpoint; or a run
/// folder with no checkpoint yet but its stored recipe (a run killed early), started again.
pub fn resume_from(path: &Path) -> Result<ResumeFrom> {
    let err = |msg: String| TrainError::Checkpoint {
        path: path.into(),
        msg,
    };
    if !path.is_dir() {
        return Err(err(
            "no such folder; --resume takes a run's output_dir or one of its checkpoint folders"
                .into(),
        ));
    }
    if path.join(STATE_FILE).exists() {
        return Ok(ResumeFrom::Checkpoint(path.into()));
    }
    let latest = path.join("latest");
    if latest.exists() {
        let name = std::fs::read_to_string(&latest).map_err(io_err(&latest))?;
        let dir = path.join(name.trim());
        if dir.join(STATE_FILE).exists() {
            return Ok(ResumeFrom::Checkpoint(dir));
        }
        if let Some(newest) = newest_complete(path)? {
            eprintln!(
                "note: 'latest' names {}, which is missing or incomplete; resuming from {}, the \
                 newest complete checkpoint",
                dir.display(),
                newest.display()
            );
            return Ok(ResumeFrom::Checkpoint(newest));
        }
        return Err(err(format!(
            "'latest' names {} which has no {STATE_FILE}, and no other checkpoint is complete; \
             resume from another copy of the run, or start it again in a new output_dir",
            dir.display()
        )));
    }
    if let Some(newest) = newest_complete(path)? {
        return Ok(ResumeFrom::Checkpoint(newest));
    }
    if path.join(RECIPE_FILE).exists() {
        return Ok(ResumeFrom::Start(path.into()));
    }
    Err(err(format!(
        "neither a checkpoint (no {STATE_FILE}) nor a run folder (no 'latest' checkpoint, no \
         {RECIPE_FILE}); --resume takes a run's output_dir or one of its checkpoint folders"
    )))
}

/// The newest checkpoint of a run folder with a `state.json`: the last in write order, else
/// by (warm-up before RL, step).
fn newest_complete(output_dir: &Path) -> Result<Option<PathBuf>> {
    let complete = |p: &PathBuf| p.join(STATE_FILE).exists();
    let by_order = read_order(output_dir)?
        .into_iter()
        .rev()
        .map(|n| output_dir.join(n))
        .find(complete);
    if by_order.is_some() {
        return Ok(by_order);
    }
    Ok(checkpoints_in(output_dir)?.into_iter().rev().find(complete))
}

/// Reads a checkpoint's state.
pub fn read_state(dir: &Path) -> Result<TrainerState> {
    let p = dir.join(STATE_FILE);
    let text = std::fs::read_to_string(&p).map_err(io_err(&p))?;
    serde_json::from_str(&text).map_err(|e| TrainError::Checkpoint {
        path: dir.into(),
        msg: format!(
            "{STATE_FILE} is unreadable ({e}); the checkpoint is damaged: resume from an \
             older one (--resume {}/step-N)",
            dir.parent().unwrap_or(dir).display()
        ),
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
            sft_step: 0,
            recipe: String::new(),
            kl_coef: None,
            pipeline: Default::default(),
            snapshots: Vec::new(),
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

    /// Resuming from an older checkpoint makes it `latest`; a broken `latest` falls back to the
    /// newest complete checkpoint; a failed write leaves no temporary folder; saving a name
    /// again replaces it.
    #[test]
    fn adopt_fallback_and_failed_writes() {
        let out = std::env::temp_dir().join(format!("rlft-ckpt-adopt-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out);
        std::fs::create_dir_all(&out).unwrap();
        let write = |d: &Path| std::fs::write(d.join("w"), b"x").map_err(io_err(d));
        for step in [1, 2, 3] {
            save(&out, &state(step), 3, write).unwrap();
        }
        adopt(&out, &out.join("step-1")).unwrap();
        assert_eq!(locate(&out).unwrap(), out.join("step-1"));
        // A crash that left `latest` naming a missing folder resumes from the newest in order.
        std::fs::write(out.join("latest"), "step-9").unwrap();
        assert_eq!(locate(&out).unwrap(), out.join("step-1"));
        std::fs::remove_file(out.join("latest")).unwrap();
        assert_eq!(locate(&out).unwrap(), out.join("step-1"));
        let e = save(&out, &state(4), 3, |_| {
            Err(TrainError::Diverged("disk full".into()))
        });
        assert!(e.is_err() && !out.join("step-4.tmp").exists());
        save(&out, &state(2), 3, |d| {
            std::fs::write(d.join("w"), b"y").map_err(io_err(d))
        })
        .unwrap();
        assert_eq!(std::fs::read(out.join("step-2/w")).unwrap(), b"y");
        assert!(!out.join("step-2.old").exists());
        std::fs::remove_dir_all(&out).ok();
    }
}
