//! A small command-line parser for the examples: `--name value` options, `--flag` switches and
//! positional arguments, with an error (and the nearest valid name) for anything unknown.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// One accepted option: its name (without `--`) and whether it takes a value.
pub type Spec = (&'static str, bool);

/// Parsed arguments.
#[derive(Debug, Default)]
pub struct Args {
    values: BTreeMap<String, Vec<String>>,
    /// Arguments not starting with `--`.
    pub positional: Vec<String>,
}

impl Args {
    /// Parses `std::env::args()` (skipping the program name) against `spec`.
    pub fn parse(spec: &[Spec]) -> Result<Self, String> {
        Self::from_iter(std::env::args().skip(1), spec)
    }

    /// Parses `args` against `spec`. `--name=value` and `--name value` are both accepted.
    pub fn from_iter(
        args: impl IntoIterator<Item = String>,
        spec: &[Spec],
    ) -> Result<Self, String> {
        let mut out = Self::default();
        let mut it = args.into_iter();
        while let Some(a) = it.next() {
            let Some(name) = a.strip_prefix("--") else {
                out.positional.push(a);
                continue;
            };
            let (name, inline) = match name.split_once('=') {
                Some((n, v)) => (n.to_string(), Some(v.to_string())),
                None => (name.to_string(), None),
            };
            let Some(&(_, takes)) = spec.iter().find(|(n, _)| *n == name) else {
                let nearest = spec
                    .iter()
                    .map(|(n, _)| (strsim::levenshtein(n, &name), *n))
                    .min()
                    .map(|(_, n)| format!(" (did you mean --{n}?)"))
                    .unwrap_or_default();
                return Err(format!("unknown option --{name}{nearest}"));
            };
            let value = match (takes, inline) {
                (true, Some(v)) => v,
                (true, None) => it.next().ok_or_else(|| format!("--{name} needs a value"))?,
                (false, None) => String::new(),
                (false, Some(_)) => return Err(format!("--{name} takes no value")),
            };
            out.values.entry(name).or_default().push(value);
        }
        Ok(out)
    }

    /// The last value of `--name`, if given.
    pub fn value(&self, name: &str) -> Option<&str> {
        self.values
            .get(name)
            .and_then(|v| v.last())
            .map(String::as_str)
    }

    /// Every value of a repeatable `--name`.
    pub fn values(&self, name: &str) -> &[String] {
        self.values.get(name).map_or(&[], Vec::as_slice)
    }

    /// Whether the switch `--name` was given.
    pub fn flag(&self, name: &str) -> bool {
        self.values.contains_key(name)
    }

    /// `--name` parsed as `T`, or `default` when absent.
    pub fn get<T: FromStr>(&self, name: &str, default: T) -> Result<T, String>
    where
        T::Err: std::fmt::Display,
    {
        match self.value(name) {
            None => Ok(default),
            Some(v) => v.parse().map_err(|e| format!("--{name} {v:?}: {e}")),
        }
    }

    /// `--name`'s value, or an error saying it is required.
    pub fn require(&self, name: &str) -> Result<&str, String> {
        self.value(name)
            .ok_or_else(|| format!("--{name} is required"))
    }
}

/// The `train` command: `train RECIPE.toml [--set KEY=VALUE]... [--device D] [--resume DIR]`
/// (`args` without the program and command names). Runs the recipe, stopping cleanly on Ctrl-C,
/// and returns the report to print.
///
/// # Errors
/// A bad command line, recipe, model, dataset or checkpoint; a failed run. The message says
/// what was wrong and how to fix it.
pub fn train(args: impl IntoIterator<Item = String>) -> Result<String, rlft_train::TrainError> {
    use rlft_train::TrainError;
    use rlft_train::launch::{self, TrainCommand};
    let usage = |e: String| TrainError::Usage(format!("{e}\n{}", launch::USAGE));
    let args = Args::from_iter(args, &[("set", true), ("device", true), ("resume", true)])
        .map_err(usage)?;
    if args.positional.len() > 1 {
        return Err(usage(format!(
            "one recipe file expected, got {:?}",
            args.positional
        )));
    }
    let mut overrides = args.values("set").to_vec();
    if let Some(d) = args.value("device") {
        overrides.push(format!("device=\"{d}\""));
    }
    let cmd = TrainCommand {
        recipe: args.positional.first().map(Into::into),
        overrides,
        resume: args.value("resume").map(Into::into),
        ..TrainCommand::default()
    };
    // A bad command line or recipe is rejected before the Ctrl-C handler is installed.
    let recipe = cmd.recipe()?;
    let stop = stop_on_ctrl_c()?;
    // A learner rank past the first (`[distributed] backend = "mpi"`) has nothing to report.
    Ok(match cmd.run(recipe, Some(stop))? {
        Some((summary, out)) => launch::report(&summary, &out),
        None => String::new(),
    })
}

/// Installs a Ctrl-C handler: the first Ctrl-C sets the returned flag (the run stops after the
/// current step, with a checkpoint), the second exits at once with status 130. The library
/// takes the flag ([`rlft_train::Trainer::run`]); the process's signals are the program's.
///
/// # Errors
/// When a handler is already installed in this process.
fn stop_on_ctrl_c() -> Result<Arc<AtomicBool>, rlft_train::TrainError> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    ctrlc::set_handler(move || {
        if flag.swap(true, Ordering::SeqCst) {
            std::process::exit(130);
        }
        eprintln!(
            "\nstopping after this step (a checkpoint will be written); Ctrl-C again to abort"
        );
    })
    .map_err(|e| {
        rlft_train::TrainError::Usage(format!("cannot install the Ctrl-C handler: {e}"))
    })?;
    Ok(stop)
}

/// Usage of the `export` command.
pub const EXPORT_USAGE: &str =
    "usage: rlft export SOURCE (--gguf OUT.gguf [--type f32|f16|q8_0] | --hf DIR) [--force]
  SOURCE: a run folder (its final/, else its latest checkpoint), a checkpoint folder, a Hugging
  Face checkpoint folder or a .gguf file
  --hf DIR: a new or empty folder; --gguf OUT.gguf: a new file
  --force: replace an existing OUT.gguf, or write into a non-empty DIR (files of the same names
  are replaced, others kept); the source's own files are never overwritten";

/// The `export` command: `export SOURCE (--gguf OUT.gguf [--type f32|f16|q8_0] | --hf DIR)`
/// (`args` without the program and command names). Writes the model (LoRA merged) and returns
/// the line to print.
///
/// # Errors
/// A bad command line; a source that does not load; a model the format cannot hold (GGUF
/// exports llama, qwen2 and qwen3); I/O errors. Nothing is written on error.
pub fn export(args: impl IntoIterator<Item = String>) -> Result<String, rlft_train::TrainError> {
    use rlft_model::GgufFileType;
    use rlft_train::TrainError;
    let usage = |e: String| TrainError::Usage(format!("{e}\n{EXPORT_USAGE}"));
    let args = Args::from_iter(
        args,
        &[
            ("gguf", true),
            ("type", true),
            ("hf", true),
            ("force", false),
            ("help", false),
        ],
    )
    .map_err(usage)?;
    if args.flag("help") {
        return Ok(EXPORT_USAGE.to_string());
    }
    let [source] = args.positional.as_slice() else {
        return Err(usage(format!(
            "one SOURCE expected, got {:?}",
            args.positional
        )));
    };
    let ty = || -> Result<GgufFileType, TrainError> {
        match args.value("type") {
            None => Ok(GgufFileType::default()),
            Some(t) => t
                .parse()
                .map_err(|e: rlft_model::ModelError| usage(e.to_string())),
        }
    };
    let (out, ty) = match (args.value("gguf"), args.value("hf")) {
        (Some(g), None) => (g, Some(ty()?)),
        (None, Some(_)) if args.value("type").is_some() => {
            return Err(usage("--type applies to --gguf only".into()));
        }
        (None, Some(h)) => (h, None),
        _ => {
            return Err(usage(
                "give exactly one of --gguf OUT.gguf and --hf DIR".into(),
            ));
        }
    };
    let out = std::path::Path::new(out);
    let source = std::path::Path::new(source);
    let target = match ty {
        Some(_) => rlft_train::export::Target::Gguf(out),
        None => rlft_train::export::Target::Hf(out),
    };
    rlft_train::export::check_target(source, target, args.flag("force"))?;
    let model = rlft_train::export::load_source(source)?;
    let what = match ty {
        Some(ty) => {
            model.save_gguf(out, ty)?;
            ty.to_string()
        }
        None => {
            model.save_hf(out)?;
            "Hugging Face checkpoint".to_string()
        }
    };
    Ok(format!(
        "wrote {} ({what}, {})",
        out.display(),
        model.config.model_type
    ))
}

/// Usage of the `serve` command.
pub const SERVE_USAGE: &str =
    "usage: rlft serve MODEL [--host 127.0.0.1] [--port 8000] [--device D] [--dtype f32|bf16|f16]
                  [--served-model-name policy] [--api-key KEY | --api-key-file PATH]
                  [--insecure-no-key] [--allowed-hosts NAME,...] [--weight-version K]
                  [--max-concurrent 1] [--max-queue 64] [--max-n 256] [--max-rows 4096]
                  [--max-tokens N] [--max-batch-tokens 262144] [--max-body-bytes 67108864]
                  [--header-timeout 10] [--body-timeout 10]
  MODEL: anything `rlft export` takes (a run folder, a checkpoint, a Hugging Face folder, a .gguf)
  --api-key (or --api-key-file, its content trimmed, or RLFT_API_KEY): every route but /health
    needs Authorization: Bearer KEY. Without a key weight updates are refused (403), and a
    non-loopback --host is refused unless --insecure-no-key is given
  --allowed-hosts: Host names accepted besides localhost, 127.0.0.1 and [::1] (* for any)
  --header-timeout / --body-timeout: seconds a client may take to send its headers / may leave
    between two pieces of its body before the connection is closed
  --port 0 takes any free port; the first line printed names the address";

/// Why `rlft serve` stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeCommandError {
    /// A bad command line or a model that does not load.
    #[error(transparent)]
    Train(#[from] rlft_train::TrainError),
    /// The server could not start, or failed.
    #[error(transparent)]
    Serve(#[from] rlft_serve::ServeError),
}

impl ServeCommandError {
    /// The process exit status: 2 for a command line that cannot be run, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Train(e) => e.exit_code(),
            Self::Serve(rlft_serve::ServeError::Config(_)) => 2,
            Self::Serve(_) => 1,
        }
    }
}

/// The `serve` command (`args` without the program and command names): loads MODEL and serves
/// it ([`rlft_serve`]) until Ctrl-C. `on_ready` gets the first line to print, naming the
/// address.
///
/// # Errors
/// A bad command line, a model that does not load, an address that cannot be bound.
pub fn serve(
    args: impl IntoIterator<Item = String>,
    on_ready: impl FnOnce(&str),
) -> Result<(), ServeCommandError> {
    use rlft_train::TrainError;
    let usage = |e: String| TrainError::Usage(format!("{e}\n{SERVE_USAGE}"));
    let spec = [
        ("host", true),
        ("port", true),
        ("device", true),
        ("dtype", true),
        ("served-model-name", true),
        ("api-key", true),
        ("api-key-file", true),
        ("insecure-no-key", false),
        ("allowed-hosts", true),
        ("header-timeout", true),
        ("body-timeout", true),
        ("weight-version", true),
        ("max-concurrent", true),
        ("max-queue", true),
        ("max-n", true),
        ("max-rows", true),
        ("max-tokens", true),
        ("max-batch-tokens", true),
        ("max-body-bytes", true),
        ("help", false),
    ];
    let args = Args::from_iter(args, &spec).map_err(usage)?;
    if args.flag("help") {
        on_ready(SERVE_USAGE);
        return Ok(());
    }
    let [model] = args.positional.as_slice() else {
        return Err(usage(format!("one MODEL expected, got {:?}", args.positional)).into());
    };
    let defaults = rlft_serve::ServerConfig::new();
    let api_key = match (args.value("api-key"), args.value("api-key-file")) {
        (Some(_), Some(_)) => {
            return Err(usage("give --api-key or --api-key-file, not both".into()).into());
        }
        (Some(k), None) => Some(k.to_string()),
        (None, Some(path)) => Some(
            std::fs::read_to_string(path)
                .map_err(|e| usage(format!("--api-key-file {path:?}: {e}")))?
                .trim()
                .to_string(),
        ),
        (None, None) => std::env::var("RLFT_API_KEY").ok(),
    };
    let allowed_hosts = args
        .values("allowed-hosts")
        .iter()
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(String::from)
        .collect();
    let config = rlft_serve::ServerConfig {
        insecure_no_key: args.flag("insecure-no-key"),
        allowed_hosts,
        header_timeout_s: args
            .get("header-timeout", defaults.header_timeout_s)
            .map_err(usage)?,
        body_timeout_s: args
            .get("body-timeout", defaults.body_timeout_s)
            .map_err(usage)?,
        shutdown_grace_s: defaults.shutdown_grace_s,
        host: args.value("host").unwrap_or(&defaults.host).to_string(),
        port: args.get("port", defaults.port).map_err(usage)?,
        served_model_name: args
            .value("served-model-name")
            .unwrap_or(&defaults.served_model_name)
            .to_string(),
        api_key,
        log_updates: true,
        max_concurrent: args
            .get("max-concurrent", defaults.max_concurrent)
            .map_err(usage)?,
        max_queue: args.get("max-queue", defaults.max_queue).map_err(usage)?,
        max_n: args.get("max-n", defaults.max_n).map_err(usage)?,
        max_rows: args.get("max-rows", defaults.max_rows).map_err(usage)?,
        max_tokens: args
            .value("max-tokens")
            .map(|v| {
                v.parse()
                    .map_err(|e| usage(format!("--max-tokens {v:?}: {e}")))
            })
            .transpose()?,
        max_batch_tokens: args
            .get("max-batch-tokens", defaults.max_batch_tokens)
            .map_err(usage)?,
        max_body_bytes: args
            .get("max-body-bytes", defaults.max_body_bytes)
            .map_err(usage)?,
    };
    if config.served_model_name.trim().is_empty() {
        return Err(usage("--served-model-name is empty".into()).into());
    }
    let device: rlft_model::device::DeviceSpec = args
        .get("device", rlft_model::device::DeviceSpec::Auto)
        .map_err(usage)?;
    let device = device.device().map_err(|e| usage(e.to_string()))?;
    use rlft_train::recipe::ModelDtype;
    let dtype = match args.value("dtype").unwrap_or("f32") {
        "f32" => ModelDtype::F32,
        "bf16" => ModelDtype::Bf16,
        "f16" => ModelDtype::F16,
        other => return Err(usage(format!("--dtype {other:?}: use f32, bf16 or f16")).into()),
    };
    let version = args.get("weight-version", 0u64).map_err(usage)?;
    let source = std::path::Path::new(model);
    let loaded = rlft_train::export::load_source(source)?;
    let policy = rlft_serve::Policy {
        model: burn::module::Module::to_device(loaded.model, &device)
            .with_compute_dtype(dtype.float_dtype()),
        tokenizer: loaded.tokenizer,
        version,
        config: loaded.config,
    };
    let context = policy.context();
    let kind = policy.config.model_type.clone();
    let server = config.start(policy)?;
    on_ready(&format!(
        "rlft serve: {model} as `{}` (weight version {version}, {kind}, context {context}) on {}",
        config.served_model_name,
        server.url()
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst))
        .map_err(|e| TrainError::Usage(format!("cannot install the Ctrl-C handler: {e}")))?;
    Ok(server.wait(&stop)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_suggests() {
        let spec = [("model", true), ("json", false), ("set", true)];
        let a = Args::from_iter(
            [
                "r.toml",
                "--model",
                "m",
                "--json",
                "--set=a=1",
                "--set",
                "b=2",
            ]
            .map(String::from),
            &spec,
        )
        .unwrap();
        assert_eq!(a.value("model"), Some("m"));
        assert!(a.flag("json"));
        assert_eq!(a.values("set"), ["a=1", "b=2"]);
        assert_eq!(a.positional, ["r.toml"]);
        assert_eq!(a.get("missing", 3usize).unwrap(), 3);
        let e = Args::from_iter(["--modle".to_string()], &spec).unwrap_err();
        assert!(e.contains("did you mean --model"), "{e}");
        assert!(Args::from_iter(["--model".to_string()], &spec).is_err());
    }
}
