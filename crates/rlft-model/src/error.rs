use std::path::PathBuf;

/// Errors from rlft-model. Each names the file or tensor and what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// `config.json` is not a usable model configuration.
    #[error("invalid model config {path}: {msg}")]
    Config {
        /// The config file (or `<memory>`).
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// A weight file is truncated, corrupt or not safetensors.
    #[error("invalid weight file {path}: {msg}")]
    Weights {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// A tensor the model needs is absent.
    #[error("missing tensor '{name}' (expected shape {expected:?}) in {path}")]
    MissingTensor {
        /// Tensor name.
        name: String,
        /// Shape the model expects.
        expected: Vec<usize>,
        /// The weight files searched.
        path: PathBuf,
    },
    /// A tensor has the wrong shape.
    #[error(
        "tensor '{name}' has shape {got:?} but the config implies {expected:?}; does config.json belong to these weights?"
    )]
    TensorShape {
        /// Tensor name.
        name: String,
        /// Shape found in the file.
        got: Vec<usize>,
        /// Shape the model expects.
        expected: Vec<usize>,
    },
    /// Tensors in the file that the model does not use.
    #[error(
        "unexpected tensors in {path}: {names:?}; the checkpoint does not match the config's architecture"
    )]
    UnexpectedTensors {
        /// The weight files.
        path: PathBuf,
        /// The unused names.
        names: Vec<String>,
    },
    /// A tensor's dtype cannot be converted.
    #[error(
        "tensor '{name}' has dtype {dtype}; supported: F32, F16, BF16 (safetensors) and F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K (GGUF)"
    )]
    Dtype {
        /// Tensor name.
        name: String,
        /// The dtype found.
        dtype: String,
    },
    /// A tokenizer file is missing or unusable.
    #[error("tokenizer {path}: {msg}")]
    Tokenizer {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// A chat template does not compile or fails while rendering.
    #[error("chat template: {0}")]
    Template(String),
    /// A LoRA configuration that cannot be applied.
    #[error("LoRA: {0}")]
    Lora(String),
    /// RoPE frequencies that a Hugging Face `config.json` cannot declare, or divisors that are
    /// not Llama 3 scaling.
    #[error("RoPE scaling: {0}")]
    RopeScaling(String),
    /// A model that the requested export format cannot hold (nothing was written).
    #[error("cannot export: {0}")]
    Export(String),
    /// Inputs of the wrong shape.
    #[error("{0}")]
    Input(String),
    /// A device string that cannot be used in this build.
    #[error("{0}")]
    Device(String),
}

/// Result alias for rlft-model.
pub type Result<T, E = ModelError> = std::result::Result<T, E>;
