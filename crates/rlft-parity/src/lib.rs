//! # rlft-parity
//!
//! The reference-parity harness: runs golden cases (schema `rl-golden/v1`) through rlft's API and
//! compares every output tensor, every gradient and **every** metric the reference reported.
//! A test tool, not part of the library users link: `tests/parity.rs` and
//! `examples/parity.rs` use it.
//!
//! Case kinds: `policy_loss` (verl's losses, its `bypass_mode`, the CTPO authors'
//! `cum-token-*` losses, and the namespaced `trl/*`, `slime/*`, `areal/*`, `roll/*` and
//! `prime_rl/*` modes), `advantage` (verl's estimators and `prime_rl/max_rl`), `kl_penalty`,
//! `entropy`, `logprob`, `value_loss` and `rollout_correction`. Routing is by `kind` and
//! `config.loss_mode` / `config.estimator` only; a namespaced mode without a mapping is an
//! error, never verl's. Every key under `outputs` must be compared, or the case is skipped;
//! a case's own `tolerance` widens the run's for the output paths it lists.
//!
//! ```no_run
//! let dir = rlft_parity::golden_dir("verl");
//! let report = rlft_parity::run_dir(&dir, &rlft_parity::Options::f64()).unwrap();
//! println!("{}", report.summary());
//! ```

#![warn(missing_docs)]

mod anchors;
mod areal;
mod case;
mod compare;
mod ctpo;
mod offpolicy;
mod slime;
mod trl;
mod verl;

use burn::tensor::{DType, Device};
use case::Case;
use compare::Compare;
use serde_json::Value;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Errors of the parity runner (unreadable directories or files, malformed cases).
#[derive(Debug, thiserror::Error)]
pub enum ParityError {
    /// The golden directory cannot be read.
    #[error(
        "cannot read golden directory {path}: {source}; pass a directory of rl-golden/v1 case files"
    )]
    Dir {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A case file is unreadable or malformed.
    #[error("case {case}: {msg}")]
    Case {
        /// File or case id.
        case: String,
        /// What is wrong.
        msg: String,
    },
    /// rlft rejected the case's inputs.
    #[error("case {case}: rlft error: {source}")]
    Algo {
        /// Case id.
        case: String,
        /// The error.
        source: rlft_algo::AlgoError,
    },
}

type Result<T> = std::result::Result<T, ParityError>;

/// Precision, tolerances and device.
#[derive(Debug, Clone)]
pub struct Options {
    /// Float dtype the cases are run in.
    pub dtype: DType,
    /// Relative tolerance.
    pub rtol: f64,
    /// Absolute tolerance.
    pub atol: f64,
    /// Device (autodiff is enabled on it).
    pub device: Device,
}

impl Options {
    /// f64 on flex, rtol 1e-9, atol 1e-12 (the required mode).
    pub fn f64() -> Self {
        Self {
            dtype: DType::F64,
            rtol: 1e-9,
            atol: 1e-12,
            device: Device::flex(),
        }
    }

    /// f32 on flex, rtol 1e-5, atol 1e-6.
    pub fn f32() -> Self {
        Self {
            dtype: DType::F32,
            rtol: 1e-5,
            atol: 1e-6,
            device: Device::flex(),
        }
    }
}

/// Outcome of one case.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Every compared element is within tolerance.
    Passed,
    /// Mismatches, one line each.
    Failed(Vec<String>),
    /// Not (fully) compared, with the reason: a feature rlft does not have, or reference
    /// metrics rlft does not report.
    Skipped(String),
}

/// All outcomes of a directory.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// `(case_id, outcome)` in file-name order.
    pub cases: Vec<(String, Outcome)>,
}

impl Report {
    /// Number of passed, failed and skipped cases.
    pub fn counts(&self) -> (usize, usize, usize) {
        let mut c = (0, 0, 0);
        for (_, o) in &self.cases {
            match o {
                Outcome::Passed => c.0 += 1,
                Outcome::Failed(_) => c.1 += 1,
                Outcome::Skipped(_) => c.2 += 1,
            }
        }
        c
    }

    /// `N passed, M failed, K skipped`.
    pub fn summary(&self) -> String {
        let (p, f, s) = self.counts();
        format!("{p} passed, {f} failed, {s} skipped")
    }

    /// Every failure and skip, one line each, then the summary.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for (id, o) in &self.cases {
            match o {
                Outcome::Failed(lines) => {
                    for l in lines {
                        let _ = writeln!(out, "FAIL {id}: {l}");
                    }
                }
                Outcome::Skipped(why) => {
                    let _ = writeln!(out, "skip {id}: {why}");
                }
                Outcome::Passed => {}
            }
        }
        out.push_str(&self.summary());
        out
    }
}

/// Runs every `*.json` case in `dir` (except `index.json`), in file-name order.
pub fn run_dir(dir: &Path, opts: &Options) -> Result<Report> {
    let rd = std::fs::read_dir(dir).map_err(|source| ParityError::Dir {
        path: dir.into(),
        source,
    })?;
    let mut files: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension().is_some_and(|e| e == "json")
                && p.file_name().is_some_and(|n| n != "index.json")
        })
        .collect();
    files.sort();
    let mut report = Report::default();
    for f in files {
        let id = f
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let outcome = match run_file(&f, opts) {
            Ok(o) => o,
            Err(e) => Outcome::Failed(vec![e.to_string()]),
        };
        report.cases.push((id, outcome));
    }
    Ok(report)
}

/// Runs one case file.
pub fn run_file(path: &Path, opts: &Options) -> Result<Outcome> {
    let case = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| ParityError::Case {
        case: case.clone(),
        msg: e.to_string(),
    })?;
    let json: Value = serde_json::from_str(&text).map_err(|e| ParityError::Case {
        case,
        msg: format!("not JSON: {e}"),
    })?;
    run_case(&json, opts)
}

/// Runs one parsed case.
pub fn run_case(case: &Value, opts: &Options) -> Result<Outcome> {
    let c = Case::new(case, opts)?;
    let mut cmp = Compare::new(opts, case);
    match c.str(&["kind"])? {
        "policy_loss" => match c.str(&["config", "loss_mode"])? {
            "bypass_mode" => offpolicy::bypass_loss(&c, &mut cmp)?,
            m if ctpo::is_ctpo(m) => ctpo::policy_loss(&c, &mut cmp)?,
            m => match m.split_once('/') {
                Some(("trl", _)) => trl::policy_loss(&c, &mut cmp)?,
                Some(("slime", _)) => slime::policy_loss(&c, &mut cmp)?,
                Some(("areal", _)) => areal::policy_loss(&c, &mut cmp)?,
                Some(("roll", _)) => anchors::roll_topr(&c, &mut cmp)?,
                Some(("prime_rl", _)) => anchors::prime_rl(&c, &mut cmp)?,
                Some((anchor, _)) => {
                    return Err(c.err(format!("no rlft mapping for anchor '{anchor}' ({m})")));
                }
                None => verl::policy_loss(&c, &mut cmp)?,
            },
        },
        "rollout_correction" => offpolicy::correction_case(&c, &mut cmp)?,
        "advantage" => match c.str(&["config", "estimator"])? {
            "prime_rl/max_rl" => anchors::max_rl(&c, &mut cmp)?,
            e if e.contains('/') => {
                return Err(c.err(format!("no rlft mapping for advantage estimator '{e}'")));
            }
            _ => verl::advantage(&c, &mut cmp)?,
        },
        "kl_penalty" => verl::kl(&c, &mut cmp)?,
        "entropy" => verl::entropy(&c, &mut cmp)?,
        "logprob" => verl::logprob(&c, &mut cmp)?,
        "value_loss" => verl::value_loss(&c, &mut cmp)?,
        other => return Err(c.err(format!("unknown kind '{other}'"))),
    }
    Ok(cmp.outcome())
}

/// The copy of a golden set kept in this repository: `tests/golden/<set>` with `set` one of
/// `verl` (368 verl 0.9.1 cases), `offpolicy` (64 verl rollout-correction and bypass cases),
/// `ctpo` (34 cases from the CTPO authors' loss code) or `frontier` (83 cases from TRL 1.16,
/// slime, AReaL, ROLL and prime-rl at the commits in its `SCHEMA.md`).
pub fn golden_dir(set: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/golden")
        .join(set)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A namespaced mode without a mapping is an error, never verl's loss of the same name.
    #[test]
    fn unknown_namespaced_modes_do_not_fall_through_to_verl() {
        let case = |kind: &str, key: &str, mode: &str| json!({"schema": "rl-golden/v1", "case_id": "x", "kind": kind, "config": {key: mode}});
        for (kind, key, mode) in [
            ("policy_loss", "loss_mode", "someone/vanilla"),
            ("advantage", "estimator", "someone/grpo"),
        ] {
            let err = run_case(&case(kind, key, mode), &Options::f64()).unwrap_err();
            assert!(err.to_string().contains("no rlft mapping"), "{err}");
        }
    }
}
