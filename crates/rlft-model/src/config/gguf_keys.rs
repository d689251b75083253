//! A GGUF file's metadata read through its architecture's prefix, for the families' rules.

use super::MAX_LAYERS;
use crate::gguf::{GgufFile, GgufValue};
use crate::{ModelError, Result};

/// A GGUF file's metadata under its architecture's prefix (`<arch>.embedding_length`, ...),
/// with typed getters whose errors name the file and the key.
pub struct GgufKeys<'a> {
    file: &'a GgufFile,
    arch: &'a str,
}

impl<'a> GgufKeys<'a> {
    pub(crate) fn new(file: &'a GgufFile, arch: &'a str) -> Self {
        Self { file, arch }
    }

    /// The file.
    pub fn file(&self) -> &'a GgufFile {
        self.file
    }

    /// Its `general.architecture`.
    pub fn arch(&self) -> &'a str {
        self.arch
    }

    /// A configuration error naming the file.
    pub fn error(&self, msg: String) -> ModelError {
        ModelError::Config {
            path: self.file.path().into(),
            msg,
        }
    }

    /// The value of `<arch>.<key>`.
    pub fn get(&self, key: &str) -> Option<&'a GgufValue> {
        self.file.get(&format!("{}.{key}", self.arch))
    }

    /// `<arch>.<key>` as a non-negative integer; `None` when missing.
    pub fn int(&self, key: &str) -> Result<Option<u64>> {
        self.get(key)
            .map(|v| {
                v.as_u64().ok_or_else(|| {
                    self.error(format!(
                        "'{}.{key}' is not a non-negative integer",
                        self.arch
                    ))
                })
            })
            .transpose()
    }

    /// `<arch>.<key>` as a non-negative integer that must be there.
    pub fn need(&self, key: &str) -> Result<u64> {
        self.int(key)?.ok_or_else(|| {
            self.error(format!(
                "'{}.{key}' is missing; the file is incomplete",
                self.arch
            ))
        })
    }

    /// `<arch>.<key>` as a number; `None` when missing.
    pub fn float(&self, key: &str) -> Result<Option<f64>> {
        self.get(key)
            .map(|v| {
                v.as_f64()
                    .ok_or_else(|| self.error(format!("'{}.{key}' is not a number", self.arch)))
            })
            .transpose()
    }

    /// Whether the file holds the tensor `name`.
    pub fn has_tensor(&self, name: &str) -> bool {
        self.file.tensors.contains_key(name)
    }

    /// Decoder layers (at most 65 536: a larger count is refused as a corrupt file).
    pub fn layers(&self) -> Result<u64> {
        match self.need("block_count")? {
            n if n > MAX_LAYERS as u64 => Err(self.error(format!(
                "'{}.block_count' is {n}, more than rlft builds ({MAX_LAYERS}); the file is \
                 corrupt",
                self.arch
            ))),
            n => Ok(n),
        }
    }

    /// Model width.
    pub fn hidden(&self) -> Result<u64> {
        self.need("embedding_length")
    }

    /// Query heads (positive).
    pub fn heads(&self) -> Result<u64> {
        match self.need("attention.head_count")? {
            0 => Err(self.error(format!(
                "'{}.attention.head_count' must be positive",
                self.arch
            ))),
            h => Ok(h),
        }
    }

    /// The width of one head: `attention.key_length`, else width / heads.
    pub fn head_dim(&self) -> Result<u64> {
        let fallback = self.hidden()? / self.heads()?;
        Ok(self.int("attention.key_length")?.unwrap_or(fallback))
    }

    /// The sliding window, when the file has a positive one.
    pub fn sliding_window(&self) -> Result<Option<u64>> {
        Ok(self.int("attention.sliding_window")?.filter(|&w| w > 0))
    }

    /// The width of the experts' hidden layer, from the first stacked gate tensor.
    pub fn expert_rows(&self) -> Result<u64> {
        self.file
            .tensors
            .iter()
            .find(|(n, _)| n.ends_with(".ffn_gate_exps.weight"))
            .and_then(|(_, t)| t.shape().get(1).copied())
            .map(|v| v as u64)
            .ok_or_else(|| {
                self.error(
                    "a mixture-of-experts file without expert_feed_forward_length nor any \
                     ffn_gate_exps tensor"
                        .into(),
                )
            })
    }
}
