//! A small command-line parser for the examples: `--name value` options, `--flag` switches and
//! positional arguments, with an error (and the nearest valid name) for anything unknown.

use std::collections::BTreeMap;
use std::str::FromStr;

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
    };
    // A bad command line or recipe is rejected before the Ctrl-C handler is installed.
    let recipe = cmd.recipe()?;
    let stop = launch::stop_on_ctrl_c()?;
    let (summary, out) = cmd.run(recipe, Some(stop))?;
    Ok(launch::report(&summary, &out))
}

/// Usage of the `export` command.
pub const EXPORT_USAGE: &str =
    "usage: rlft export SOURCE (--gguf OUT.gguf [--type f32|f16|q8_0] | --hf DIR)
  SOURCE: a run folder (its final/, else its latest checkpoint), a checkpoint folder, a Hugging
  Face checkpoint folder or a .gguf file";

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
    let args =
        Args::from_iter(args, &[("gguf", true), ("type", true), ("hf", true)]).map_err(usage)?;
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
    let model = rlft_train::export::load_source(std::path::Path::new(source))?;
    let out = std::path::Path::new(out);
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
