//! The model behind `rlft export SOURCE`: a run folder (its `final/` export, or its latest
//! checkpoint when it has none), a checkpoint folder, a Hugging Face checkpoint folder or a
//! GGUF file — loaded on the CPU in f32 with any LoRA adapters merged, ready to be written as
//! GGUF ([`Pretrained::save_gguf`]) or as a Hugging Face checkpoint ([`Pretrained::save_hf`]).

use crate::checkpoint::{self, ResumeFrom};
use crate::models::Models;
use crate::{Recipe, Result, TrainError};
use burn::module::Module;
use burn::tensor::{DType, Device};
use rlft_model::Pretrained;
use std::path::Path;

/// Loads the model `source` names (see the module documentation).
///
/// # Errors
/// A path that is none of these, a checkpoint whose recipe or weights do not load (the
/// recipe's model file must still exist for a fine-tuned checkpoint), a model file that does
/// not load.
pub fn load_source(source: &Path) -> Result<Pretrained> {
    let device = Device::flex();
    let is_model =
        |p: &Path| p.join("config.json").is_file() || p.extension().is_some_and(|e| e == "gguf");
    if is_model(source) {
        return Ok(Pretrained::load(source, &device, DType::F32)?);
    }
    let final_dir = source.join("final");
    if is_model(&final_dir) {
        return Ok(Pretrained::load(&final_dir, &device, DType::F32)?);
    }
    let dir = match checkpoint::resume_from(source) {
        Ok(ResumeFrom::Checkpoint(dir)) => dir,
        Ok(ResumeFrom::Start(_)) => {
            return Err(TrainError::Checkpoint {
                path: source.into(),
                msg: "the run has neither a final/ export nor a checkpoint yet; export it after \
                      its first checkpoint"
                    .into(),
            });
        }
        Err(_) => {
            return Err(TrainError::Usage(format!(
                "{} is not a model: export takes a run folder (its final/ or latest \
                 checkpoint), a checkpoint folder, a Hugging Face checkpoint folder or a .gguf \
                 file",
                source.display()
            )));
        }
    };
    from_checkpoint(&dir, &device)
}

/// The policy of checkpoint `dir`, built from the recipe it stores, LoRA merged.
fn from_checkpoint(dir: &Path, device: &Device) -> Result<Pretrained> {
    let state = checkpoint::read_state(dir)?;
    let recipe = Recipe::from_stored(&state.recipe)?;
    let (policy, tokenizer, config) = Models::policy(&recipe, device)?;
    let path = dir.join(checkpoint::POLICY_FILE);
    let policy = policy
        .try_load_file(&path)
        .map_err(|e| TrainError::Checkpoint {
            path: path.clone(),
            msg: format!(
                "the policy weights cannot be read ({e:?}); the checkpoint is damaged or from \
                 another model: export another checkpoint folder of the run"
            ),
        })?;
    Ok(Pretrained {
        model: policy.merged(),
        config,
        tokenizer,
    })
}
