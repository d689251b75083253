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

/// Where `rlft export` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target<'a> {
    /// A GGUF file.
    Gguf(&'a Path),
    /// A Hugging Face checkpoint folder.
    Hf(&'a Path),
}

/// Checks, before anything is read or written, that exporting `source` to `target` loses
/// nothing: the output path is not blank, is not the source and overwrites none of the
/// source's files; without `force` it is not an existing file (GGUF) or a non-empty folder
/// (Hugging Face: an existing empty folder is fine). With `force` the files the export writes
/// replace those of the same name; other files of the folder stay.
///
/// # Errors
/// [`TrainError::Usage`] naming the path and what to do.
pub fn check_target(source: &Path, target: Target<'_>, force: bool) -> Result<()> {
    let (flag, out) = match target {
        Target::Gguf(p) => ("--gguf", p),
        Target::Hf(p) => ("--hf", p),
    };
    let refuse = |msg: String| {
        Err(TrainError::Usage(format!(
            "{flag} {}: {msg}",
            out.display()
        )))
    };
    if out.to_string_lossy().trim().is_empty() {
        return refuse(
            match target {
                Target::Gguf(_) => {
                    "the output path is empty; name the file, e.g. --gguf model.gguf"
                }
                Target::Hf(_) => "the output path is empty; name a folder, e.g. --hf exported",
            }
            .into(),
        );
    }
    let src = std::fs::canonicalize(source).map_err(|e| not_a_model(source, &format!(" ({e})")))?;
    let dest = resolved(out);
    if dest == src {
        return refuse("is the source itself; write the export somewhere else".into());
    }
    let written: Vec<std::path::PathBuf> = match target {
        Target::Gguf(_) => vec![dest.clone()],
        Target::Hf(_) => rlft_model::HF_EXPORT_FILES
            .iter()
            .map(|f| dest.join(f))
            .collect(),
    };
    if let Some(f) = written.iter().find(|f| f.starts_with(&src) && f.exists()) {
        return refuse(format!(
            "would overwrite {}, a file of the source {}; write the export somewhere else",
            f.display(),
            source.display()
        ));
    }
    match target {
        Target::Gguf(_) if dest.is_dir() => refuse("is a folder; name a .gguf file".into()),
        Target::Gguf(_) if dest.exists() && !force => {
            refuse("exists; choose another file, or pass --force to replace it".into())
        }
        Target::Hf(_) if dest.exists() && !dest.is_dir() => {
            refuse("is a file; name a folder (new or empty)".into())
        }
        Target::Hf(_) if dest.is_dir() => {
            let names: Vec<String> = std::fs::read_dir(&dest)
                .map_err(|e| TrainError::Usage(format!("{flag} {}: {e}", out.display())))?
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            // Weights the export would not replace but a loader would read beside its own.
            let stale: Vec<&String> = names
                .iter()
                .filter(|n| {
                    n.ends_with(".safetensors.index.json")
                        || (n.ends_with(".safetensors") && *n != "model.safetensors")
                        || n.starts_with("pytorch_model")
                })
                .collect();
            if !names.is_empty() && !force {
                refuse(
                    "is a folder that is not empty; choose a new or empty folder, or pass \
                     --force to write the checkpoint's files into it (files of the same names \
                     are replaced)"
                        .into(),
                )
            } else if !stale.is_empty() {
                refuse(format!(
                    "holds weights the export would not replace and a loader would read beside \
                     it ({}); choose a new or empty folder",
                    stale
                        .iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            } else {
                Ok(())
            }
        }
        _ => Ok(()),
    }
}

/// `path` made absolute: its longest existing head with links resolved, the rest (which holds
/// no links) with `.` and `..` taken lexically, as `create_dir_all` takes them.
fn resolved(path: &Path) -> std::path::PathBuf {
    use std::path::Component;
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let parts: Vec<Component<'_>> = abs.components().collect();
    for k in (1..=parts.len()).rev() {
        let head: std::path::PathBuf = parts[..k].iter().collect();
        if let Ok(mut p) = std::fs::canonicalize(&head) {
            for c in &parts[k..] {
                match c {
                    Component::ParentDir => {
                        p.pop();
                    }
                    Component::CurDir => {}
                    other => p.push(other),
                }
            }
            return p;
        }
    }
    abs
}

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
        Err(_) => return Err(not_a_model(source, "")),
    };
    from_checkpoint(&dir, &device)
}

/// A SOURCE that is none of the things export takes (`why`: a note after the path).
fn not_a_model(source: &Path, why: &str) -> TrainError {
    TrainError::Usage(format!(
        "{}{why} is not a model: export takes a run folder (its final/ or latest checkpoint), a \
         checkpoint folder, a Hugging Face checkpoint folder or a .gguf file",
        source.display()
    ))
}

/// The policy of checkpoint `dir`, built from the recipe it stores, LoRA merged.
fn from_checkpoint(dir: &Path, device: &Device) -> Result<Pretrained> {
    let state = checkpoint::read_state(dir)?;
    let recipe = Recipe::from_stored(&state.recipe)?;
    let (policy, tokenizer, config) = Models::load_policy(&recipe, device)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_targets_that_would_lose_data_are_refused() {
        let tmp = std::env::temp_dir().join(format!("rlft-export-target-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let src = tmp.join("model");
        std::fs::create_dir_all(&src).unwrap();
        std::fs::write(src.join("config.json"), "{}").unwrap();
        let gguf = tmp.join("m.gguf");
        std::fs::write(&gguf, "GGUF").unwrap();
        let empty = tmp.join("empty");
        std::fs::create_dir_all(&empty).unwrap();
        let full = tmp.join("full");
        std::fs::create_dir_all(&full).unwrap();
        std::fs::write(full.join("notes.txt"), "keep").unwrap();
        fn refused(src: &Path, t: Target<'_>, force: bool) -> String {
            check_target(src, t, force).unwrap_err().to_string()
        }
        let err = |t: Target<'_>, force| refused(&src, t, force);
        assert!(err(Target::Hf(Path::new("")), true).contains("empty"));
        assert!(err(Target::Hf(Path::new("  ")), true).contains("empty"));
        assert!(err(Target::Gguf(Path::new("")), true).contains("empty"));
        assert!(err(Target::Hf(&src), true).contains("source itself"));
        assert!(err(Target::Hf(&src.join("../model/")), true).contains("source itself"));
        assert!(err(Target::Gguf(&src.join("config.json")), true).contains("would overwrite"));
        assert!(
            check_target(&gguf, Target::Gguf(&gguf), true)
                .unwrap_err()
                .to_string()
                .contains("source itself")
        );
        assert!(err(Target::Gguf(&gguf), false).contains("--force"));
        assert!(err(Target::Gguf(&empty), true).contains("is a folder"));
        assert!(err(Target::Hf(&gguf), true).contains("is a file"));
        assert!(err(Target::Hf(&full), false).contains("--force"));
        // `..` past a folder that does not exist yet still reaches the source.
        let around = tmp.join("new-dir/../model");
        assert!(err(Target::Hf(&around), false).contains("source itself"));
        let around = tmp.join("new-dir/x/../../model/config.json");
        assert!(err(Target::Gguf(&around), true).contains("would overwrite"));
        // Old shards a loader would read beside the new weights.
        let sharded = tmp.join("sharded");
        std::fs::create_dir_all(&sharded).unwrap();
        std::fs::write(sharded.join("model.safetensors.index.json"), "{}").unwrap();
        assert!(err(Target::Hf(&sharded), true).contains("model.safetensors.index.json"));
        // Allowed: a new path, an empty folder, an existing target with --force, a new file
        // inside the source's folder.
        check_target(&src, Target::Hf(&tmp.join("new/sub")), false).unwrap();
        check_target(&src, Target::Hf(&empty), false).unwrap();
        check_target(&src, Target::Hf(&full), true).unwrap();
        check_target(&src, Target::Gguf(&gguf), true).unwrap();
        check_target(&src, Target::Gguf(&src.join("model.gguf")), false).unwrap();
        check_target(&src, Target::Hf(&src.join("hf")), false).unwrap();
        assert!(
            check_target(&tmp.join("missing"), Target::Hf(&empty), false)
                .unwrap_err()
                .to_string()
                .contains("is not a model")
        );
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}
