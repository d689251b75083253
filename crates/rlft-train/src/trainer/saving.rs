//! A trainer's checkpoint: writing the run as it stands, and loading one back into a trainer
//! built from the same recipe.

use super::Trainer;
use crate::checkpoint::{self, TrainerState};
use crate::optim::adamw;
use crate::step::collect::admission;
use crate::{Result, TrainError};
use burn::module::Module;
use std::path::{Path, PathBuf};

pub(crate) fn load_checkpoint(t: &mut Trainer, dir: &Path, state: TrainerState) -> Result<()> {
    let err = |what: &str, e: String| TrainError::Checkpoint {
        path: dir.into(),
        msg: format!(
            "{what} cannot be read ({e}); the checkpoint is damaged or from another model: \
             resume from another checkpoint folder of the run (--resume {}/step-N)",
            dir.parent().unwrap_or(dir).display()
        ),
    };
    let policy = t
        .policy()
        .clone()
        .try_load_file(dir.join(checkpoint::POLICY_FILE))
        .map_err(|e| err("the policy weights", format!("{e:?}")))?;
    t.models.policy = Some(policy);
    // A warm-up checkpoint holds the warm-up's optimiser; RL's starts fresh after it.
    let optim = if state.sft_done {
        adamw(&t.recipe.optimizer)
    } else {
        super::warmup::sft_adamw(t)
    }
    .load(dir.join(checkpoint::OPTIM_FILE))
    .map_err(|e| err("the optimizer state", format!("{e:?}")))?;
    if state.sft_done {
        t.learner.optim = optim;
    } else {
        t.learner.sft_optim = Some(optim);
    }
    if let Some(c) = t.models.critic.take() {
        t.models.critic = Some(
            c.try_load_file(dir.join(checkpoint::CRITIC_FILE))
                .map_err(|e| err("the critic weights", format!("{e:?}")))?,
        );
        t.learner.critic_optim = Some(
            adamw(&t.recipe.optimizer)
                .load(dir.join(checkpoint::CRITIC_OPTIM_FILE))
                .map_err(|e| err("the critic optimizer state", format!("{e:?}")))?,
        );
    }
    if t.feed.snapshots().is_some() {
        // Lagged mode: the policies of the kept versions, oldest first. Every version the
        // checkpoint lists must be there: without one, the run would sample with a policy
        // one version too new and say nothing.
        let found = checkpoint::snapshot_versions(dir)?;
        let listed: Vec<u64> = if state.snapshots.is_empty() {
            // Written before checkpoints listed their snapshots: the versions kept are
            // consecutive, so a gap is a missing file.
            let first = found.first().copied().unwrap_or(0);
            (first..first + found.len() as u64).collect()
        } else {
            state.snapshots.clone()
        };
        if let Some(v) = listed.iter().find(|v| !found.contains(v)) {
            return Err(err(
                "a lagged-mode snapshot",
                format!(
                    "{} is missing (the checkpoint holds versions {listed:?})",
                    checkpoint::snapshot_file(*v)
                ),
            ));
        }
        for v in listed {
            let m = t
                .models
                .policy
                .as_ref()
                .map(|p| p.valid())
                .ok_or_else(|| err("the policy", "moved out".into()))?
                .try_load_file(dir.join(checkpoint::snapshot_file(v)))
                .map_err(|e| err("a lagged-mode snapshot", format!("{e:?}")))?;
            if let Some(snapshots) = t.feed.snapshots_mut() {
                snapshots.restore(v, m);
            }
        }
    }
    let admission = admission(
        &t.recipe,
        t.train_set.len(),
        state.cursor,
        state.step,
        state.pipeline.clone(),
    )?;
    t.feed.set_admission(admission)?;
    t.state = state;
    t.resumed = true;
    Ok(())
}

/// Writes a checkpoint of the run as it stands (policy, optimizer, critic, lagged-mode
/// snapshots, the data cursor and the trainer state) into `output_dir`, keeping the newest
/// `checkpoint.keep`; returns its folder. [`Trainer::run`] calls it every `checkpoint.every`
/// steps; a trainer that drives [`Trainer::train_step`] itself calls it when it likes, and
/// `--resume` continues from it.
///
/// # Errors
/// A file that cannot be written (nothing of the checkpoint is then adopted).
pub(crate) fn save_checkpoint(t: &mut Trainer) -> Result<PathBuf> {
    (t.state.pipeline, t.state.cursor) = t.feed.checkpoint_state();
    t.state.snapshots = t
        .feed
        .snapshots()
        .iter()
        .flat_map(|s| s.iter().map(|(v, _)| *v))
        .collect();
    let policy = t.models.policy().clone();
    // With the optimizer state sharded across process ranks, the whole of it, gathered.
    let whole = crate::follower::whole_states(&t.recipe, &t.learner)?;
    let optim = match (&t.learner.sft_optim, t.state.sft_done, &whole) {
        (Some(o), false, _) => o,
        (_, _, Some((o, _))) => o,
        _ => &t.learner.optim,
    };
    let critic = t.models.critic.clone();
    let critic_optim = match &whole {
        Some((_, c)) => c,
        None => &t.learner.critic_optim,
    };
    let snapshots: Vec<(u64, rlft_model::Transformer)> = t
        .feed
        .snapshots()
        .iter()
        .flat_map(|s| s.iter().cloned())
        .collect();
    checkpoint::save(
        &t.recipe.output_dir,
        &t.state,
        t.recipe.checkpoint.keep,
        |dir| {
            let e = |what: &str, m: String| TrainError::Checkpoint {
                path: dir.into(),
                msg: format!("cannot write {what}: {m}; check the disk's free space"),
            };
            policy
                .save_file(dir.join(checkpoint::POLICY_FILE))
                .map_err(|x| e("policy", format!("{x:?}")))?;
            optim
                .save(dir.join(checkpoint::OPTIM_FILE))
                .map_err(|x| e("optimizer", format!("{x:?}")))?;
            if let (Some(c), Some(o)) = (critic, critic_optim) {
                c.save_file(dir.join(checkpoint::CRITIC_FILE))
                    .map_err(|x| e("critic", format!("{x:?}")))?;
                o.save(dir.join(checkpoint::CRITIC_OPTIM_FILE))
                    .map_err(|x| e("critic optimizer", format!("{x:?}")))?;
            }
            for (v, m) in snapshots {
                m.save_file(dir.join(checkpoint::snapshot_file(v)))
                    .map_err(|x| e("lagged-mode snapshot", format!("{x:?}")))?;
            }
            Ok(())
        },
    )
}
