//! Reference parity: runs golden cases (schema `rl-golden/v1`, produced by verl) through rlft's
//! API and compares every output, gradient and shared metric.
//!
//! ```no_run
//! let report = rlft::parity::run_dir("../shared/golden".as_ref(), &rlft::parity::Options::f64()).unwrap();
//! println!("{}", report.summary());
//! ```

use burn::tensor::{DType, Device, Int, Tensor, TensorData};
use rlft_algo::advantage::{AdvantageEstimator, AdvantageInput};
use rlft_algo::aggregation::{GlobalBatchInfo, LossAggregation, aggregate_loss};
use rlft_algo::entropy::entropy_from_logits;
use rlft_algo::kl::{KlEstimator, kl_penalty};
use rlft_algo::logprob::logprobs_from_logits;
use rlft_algo::loss::{LossRegistry, PolicyLossInput};
use rlft_algo::masked::to_host;
use rlft_algo::value::clipped_value_loss;
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
    /// Not mapped to rlft, with the reason.
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

/// Verl features rlft does not implement; cases using them are skipped with this reason.
const SKIPS: &[(&str, &str, &str)] = &[
    (
        "loss_mode",
        "clip_cov",
        "clip_cov (Clip-Cov) is not implemented in rlft",
    ),
    (
        "loss_mode",
        "kl_cov",
        "kl_cov (KL-Cov) is not implemented in rlft",
    ),
    (
        "loss_mode",
        "dppo_tv",
        "dppo_* (DPPO trust-region masks) are not implemented in rlft",
    ),
    (
        "loss_mode",
        "dppo_kl",
        "dppo_* (DPPO trust-region masks) are not implemented in rlft",
    ),
    (
        "estimator",
        "opo",
        "OPO advantages are not implemented in rlft",
    ),
    (
        "estimator",
        "remax",
        "ReMax advantages need a greedy-baseline rollout; not implemented in rlft",
    ),
    (
        "estimator",
        "grpo_passk",
        "pass@k GRPO advantages are not implemented in rlft",
    ),
    (
        "estimator",
        "gpg",
        "GPG advantages are not implemented in rlft (the gpg policy loss is)",
    ),
];

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
    if let Some(why) = c.skip_reason() {
        return Ok(Outcome::Skipped(why.to_string()));
    }
    let mut cmp = Compare::new(opts);
    match c.str(&["kind"])? {
        "policy_loss" => c.policy_loss(&mut cmp)?,
        "advantage" => c.advantage(&mut cmp)?,
        "kl_penalty" => c.kl(&mut cmp)?,
        "entropy" => c.entropy(&mut cmp)?,
        "logprob" => c.logprob(&mut cmp)?,
        "value_loss" => c.value_loss(&mut cmp)?,
        other => return Err(c.err(format!("unknown kind '{other}'"))),
    }
    Ok(if cmp.failures.is_empty() {
        Outcome::Passed
    } else {
        Outcome::Failed(cmp.failures)
    })
}

/// Element-wise comparison that collects failures.
struct Compare {
    rtol: f64,
    atol: f64,
    failures: Vec<String>,
}

impl Compare {
    fn new(o: &Options) -> Self {
        Self {
            rtol: o.rtol,
            atol: o.atol,
            failures: Vec::new(),
        }
    }

    fn close(&self, got: f64, want: f64) -> bool {
        (got - want).abs() <= self.atol + self.rtol * want.abs()
    }

    fn scalar(&mut self, name: &str, got: f64, want: f64) {
        if !self.close(got, want) {
            self.failures
                .push(format!("{name}: rlft {got:e} vs reference {want:e}"));
        }
    }

    /// Compares where `mask` is set; where it is not and `zero_outside`, requires exactly 0.
    fn tensor(
        &mut self,
        name: &str,
        got: &[f64],
        want: &[f64],
        mask: Option<&[f64]>,
        zero_outside: bool,
    ) {
        if got.len() != want.len() {
            self.failures.push(format!(
                "{name}: rlft has {} elements, reference {}",
                got.len(),
                want.len()
            ));
            return;
        }
        let mut bad = 0;
        for (k, (g, w)) in got.iter().zip(want).enumerate() {
            // Gradients over a [B, T, V] tensor use the [B, T] mask of their row.
            let inside = mask.is_none_or(|m| m[k * m.len() / got.len()] > 0.5);
            let ok = if inside {
                self.close(*g, *w)
            } else {
                !zero_outside || *g == 0.0
            };
            if !ok {
                bad += 1;
                if bad <= 3 {
                    let what = if inside {
                        format!("reference {w:e}")
                    } else {
                        "exactly 0 (padding)".into()
                    };
                    self.failures
                        .push(format!("{name}[{k}]: rlft {g:e} vs {what}"));
                }
            }
        }
        if bad > 3 {
            self.failures
                .push(format!("{name}: {bad} elements differ in all"));
        }
    }
}

struct Case<'a> {
    json: &'a Value,
    id: String,
    opts: &'a Options,
    device: Device,
}

impl<'a> Case<'a> {
    fn new(json: &'a Value, opts: &'a Options) -> Result<Self> {
        let id = json
            .get("case_id")
            .and_then(Value::as_str)
            .unwrap_or("<no case_id>")
            .to_string();
        if json.get("schema").and_then(Value::as_str) != Some("rl-golden/v1") {
            return Err(ParityError::Case {
                case: id,
                msg: "schema is not rl-golden/v1".into(),
            });
        }
        Ok(Self {
            json,
            id,
            opts,
            device: opts.device.clone().autodiff(),
        })
    }

    fn err(&self, msg: impl Into<String>) -> ParityError {
        ParityError::Case {
            case: self.id.clone(),
            msg: msg.into(),
        }
    }

    fn algo(&self, e: rlft_algo::AlgoError) -> ParityError {
        ParityError::Algo {
            case: self.id.clone(),
            source: e,
        }
    }

    fn get(&self, path: &[&str]) -> Option<&'a Value> {
        path.iter().try_fold(self.json, |v, k| v.get(*k))
    }

    fn str(&self, path: &[&str]) -> Result<&'a str> {
        self.get(path)
            .and_then(Value::as_str)
            .ok_or_else(|| self.err(format!("missing string {}", path.join("."))))
    }

    fn num(&self, path: &[&str]) -> Result<f64> {
        self.get(path)
            .and_then(Value::as_f64)
            .ok_or_else(|| self.err(format!("missing number {}", path.join("."))))
    }

    fn opt_num(&self, path: &[&str]) -> Option<f64> {
        self.get(path).and_then(Value::as_f64)
    }

    fn skip_reason(&self) -> Option<&'static str> {
        let cfg = self.get(&["config"])?;
        SKIPS
            .iter()
            .find(|(key, name, _)| cfg.get(*key).and_then(Value::as_str) == Some(*name))
            .map(|(_, _, why)| *why)
    }

    /// A stored tensor's shape and values (bool/int as 0/1/integers).
    fn raw(&self, group: &str, name: &str) -> Result<(Vec<usize>, Vec<f64>)> {
        let t = self
            .get(&[group, name])
            .ok_or_else(|| self.err(format!("missing {group}.{name}")))?;
        let shape: Vec<usize> = t
            .get("shape")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_u64)
                    .map(|x| x as usize)
                    .collect()
            })
            .ok_or_else(|| self.err(format!("{group}.{name} has no shape")))?;
        let data: Vec<f64> = t
            .get("data")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_f64().or_else(|| x.as_bool().map(f64::from)))
                    .collect()
            })
            .ok_or_else(|| self.err(format!("{group}.{name} has no data")))?;
        if data.len() != shape.iter().product::<usize>() {
            return Err(self.err(format!(
                "{group}.{name}: {} values for shape {shape:?}",
                data.len()
            )));
        }
        Ok((shape, data))
    }

    fn tensor<const D: usize>(&self, name: &str) -> Result<Tensor<D>> {
        let (shape, data) = self.raw("inputs", name)?;
        let dims: [usize; D] = shape
            .try_into()
            .map_err(|s| self.err(format!("inputs.{name}: rank of {s:?} is not {D}")))?;
        Ok(Tensor::from_data(
            TensorData::new(data, dims),
            (&self.device, self.opts.dtype),
        ))
    }

    fn opt_tensor(&self, name: &str) -> Result<Option<Tensor<2>>> {
        if self.get(&["inputs", name]).is_some() {
            self.tensor(name).map(Some)
        } else {
            Ok(None)
        }
    }

    fn want(&self, path: &[&str]) -> Result<Vec<f64>> {
        let t = self
            .get(path)
            .ok_or_else(|| self.err(format!("missing {}", path.join("."))))?;
        t.get("data")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_f64).collect())
            .ok_or_else(|| self.err(format!("{} has no data", path.join("."))))
    }

    fn agg(&self, path: &[&str]) -> Result<LossAggregation> {
        self.str(path)?.parse().map_err(|e| self.algo(e))
    }

    fn host<const D: usize>(&self, t: &Tensor<D>) -> Result<Vec<f64>> {
        to_host(t).map_err(|e| self.algo(e))
    }

    fn mask(&self) -> Result<(Tensor<2>, Vec<f64>)> {
        let m = self.tensor::<2>("response_mask")?;
        let v = self.host(&m)?;
        Ok((m, v))
    }

    fn global(&self) -> GlobalBatchInfo {
        let g = |k: &str| self.opt_num(&["config", "actor", "global_batch_info", k]);
        GlobalBatchInfo {
            dp_size: g("dp_size").map(|v| v as usize).unwrap_or(1),
            batch_num_tokens: g("batch_num_tokens"),
            global_batch_size: g("global_batch_size"),
            loss_scale_factor: g("loss_scale_factor"),
        }
    }

    fn policy_loss(&self, cmp: &mut Compare) -> Result<()> {
        let mode = self.str(&["config", "loss_mode"])?;
        let name = match mode {
            "vanilla" => "ppo",
            other => other,
        };
        let registry = LossRegistry::with_builtins();
        let mut cfg = registry.resolve(name).map_err(|e| self.algo(e))?.config;
        let actor = |k: &str| self.opt_num(&["config", "actor", k]);
        let clip = actor("clip_ratio").unwrap_or(0.2);
        cfg.clip_ratio_low = actor("clip_ratio_low").unwrap_or(clip);
        cfg.clip_ratio_high = actor("clip_ratio_high").unwrap_or(clip);
        // verl's vanilla loss always applies the dual clip c (default 3).
        cfg.dual_clip = (mode == "vanilla").then(|| actor("clip_ratio_c").unwrap_or(3.0));
        cfg.aggregation = self.agg(&["config", "loss_agg_mode"])?;
        cfg.kl_coef = 0.0;
        if let Some(t) = actor("tau_pos") {
            cfg.sapo_tau_pos = t;
        }
        if let Some(t) = actor("tau_neg") {
            cfg.sapo_tau_neg = t;
        }
        if let Some(b) = self.opt_num(&["config", "policy_loss", "dro_beta"]) {
            cfg.dro_beta = b;
        }
        let log_prob = self.tensor::<2>("log_prob")?.require_grad();
        let (mask, mask_v) = self.mask()?;
        let mut input = PolicyLossInput::new(
            log_prob.clone(),
            self.tensor("old_log_prob")?,
            self.tensor("advantages")?,
            mask,
        )
        .with_global(self.global());
        if let Some(w) = self.opt_tensor("rollout_is_weights")? {
            input = input.with_rollout_is_weights(w);
        }
        let out = registry
            .compute(name, &input, &cfg)
            .map_err(|e| self.algo(e))?;
        let grads = out.loss.backward();
        cmp.scalar(
            "loss",
            self.host(&out.loss)?[0],
            self.num(&["outputs", "loss"])?,
        );
        let grad = log_prob
            .grad(&grads)
            .ok_or_else(|| self.err("no gradient reached log_prob"))?;
        cmp.tensor(
            "grad.log_prob",
            &self.host(&grad)?,
            &self.want(&["outputs", "grad", "log_prob"])?,
            Some(&mask_v),
            true,
        );
        let m = out.metrics.read().map_err(|e| self.algo(e))?;
        // verl's metric names → rlft's metrics. geo_mean splits its clip fraction by the
        // advantage's sign; the clipped surrogates by bound.
        let (clipfrac, lower) = match mode {
            "geo_mean" => (m.clip_frac_high, m.clip_frac_low),
            _ => (m.clip_frac_low + m.clip_frac_high, m.clip_frac_dual),
        };
        let reported = [
            ("actor/pg_clipfrac", clipfrac),
            ("actor/pg_clipfrac_lower", lower),
            ("actor/ppo_kl", m.approx_kl),
        ];
        for (key, got) in reported {
            if let Some(want) = self.opt_num(&["outputs", "metrics", key]) {
                cmp.scalar(key, got, want);
            }
        }
        Ok(())
    }

    fn advantage(&self, cmp: &mut Compare) -> Result<()> {
        let eps = self.opt_num(&["config", "epsilon"]).unwrap_or(1e-6);
        let gamma = self
            .opt_num(&["config", "gamma"])
            .or_else(|| self.opt_num(&["config", "config.gamma"]));
        let est = match self.str(&["config", "estimator"])? {
            "grpo" => {
                let norm = self
                    .get(&["config", "norm_adv_by_std_in_grpo"])
                    .and_then(Value::as_bool)
                    .unwrap_or(true);
                AdvantageEstimator::Grpo {
                    norm_by_std: norm,
                    epsilon: eps,
                }
            }
            "rloo" => AdvantageEstimator::Rloo,
            "reinforce_plus_plus" => AdvantageEstimator::ReinforcePlusPlus {
                gamma: gamma.unwrap_or(1.0),
            },
            "reinforce_plus_plus_baseline" => AdvantageEstimator::ReinforcePlusPlusBaseline,
            "gae" => AdvantageEstimator::Gae {
                gamma: gamma.unwrap_or(1.0),
                lam: self.num(&["config", "lam"])?,
            },
            other => {
                return Err(self.err(format!("advantage estimator '{other}' has no rlft mapping")));
            }
        };
        let (mask, mask_v) = self.mask()?;
        let mut input = AdvantageInput::new(self.tensor("token_level_rewards")?, mask);
        if self.get(&["inputs", "index"]).is_some() {
            let (_, ids) = self.raw("inputs", "index")?;
            input = input.with_groups(ids.iter().map(|v| *v as u64).collect());
        }
        if let Some(v) = self.opt_tensor("values")? {
            input = input.with_values(v);
        }
        let out = est.compute(&input).map_err(|e| self.algo(e))?;
        for (name, got) in [("advantages", &out.advantages), ("returns", &out.returns)] {
            let want = self.want(&["outputs", name])?;
            cmp.tensor(name, &self.host(got)?, &want, Some(&mask_v), false);
        }
        Ok(())
    }

    fn kl(&self, cmp: &mut Compare) -> Result<()> {
        let est: KlEstimator = self
            .str(&["config", "kl_penalty"])?
            .parse()
            .map_err(|e| self.algo(e))?;
        let log_prob = self.tensor::<2>("log_prob")?.require_grad();
        let (mask, mask_v) = self.mask()?;
        let reference = self.tensor("ref_log_prob")?;
        let kl =
            kl_penalty(log_prob.clone(), reference, est, Some(&mask)).map_err(|e| self.algo(e))?;
        self.per_token_term(cmp, "kl", kl, (&mask, &mask_v), &log_prob, "log_prob")
    }

    fn entropy(&self, cmp: &mut Compare) -> Result<()> {
        let logits = self.tensor::<3>("logits")?.require_grad();
        let (mask, mask_v) = self.mask()?;
        let h = entropy_from_logits(logits.clone(), None).map_err(|e| self.algo(e))?;
        self.per_token_term(cmp, "entropy", h, (&mask, &mask_v), &logits, "logits")
    }

    /// Compares a per-token quantity (where masked), its locally aggregated loss and the
    /// gradient of that loss with respect to `leaf`.
    fn per_token_term<const D: usize>(
        &self,
        cmp: &mut Compare,
        name: &str,
        values: Tensor<2>,
        (mask, mask_v): (&Tensor<2>, &[f64]),
        leaf: &Tensor<D>,
        leaf_name: &str,
    ) -> Result<()> {
        let mode = self.agg(&["config", "loss_agg_mode"])?;
        let loss = aggregate_loss(values.clone(), mask, mode, &GlobalBatchInfo::local())
            .map_err(|e| self.algo(e))?;
        let want = self.want(&["outputs", name])?;
        cmp.tensor(name, &self.host(&values)?, &want, Some(mask_v), false);
        self.scalar_and_grad(cmp, loss, leaf, leaf_name, Some(mask_v))
    }

    fn logprob(&self, cmp: &mut Compare) -> Result<()> {
        let logits = self.tensor::<3>("logits")?.require_grad();
        let (shape, labels) = self.raw("inputs", "labels")?;
        let dims: [usize; 2] = shape
            .try_into()
            .map_err(|_| self.err("labels must be [B, T]"))?;
        let labels: Vec<i64> = labels.iter().map(|v| *v as i64).collect();
        let labels = Tensor::<2, Int>::from_data(TensorData::new(labels, dims), &self.device);
        let lp = logprobs_from_logits(logits.clone(), labels, None).map_err(|e| self.algo(e))?;
        let loss = (lp.clone() * self.tensor::<2>("upstream")?).sum();
        cmp.tensor(
            "log_prob",
            &self.host(&lp)?,
            &self.want(&["outputs", "log_prob"])?,
            None,
            false,
        );
        self.scalar_and_grad(cmp, loss, &logits, "logits", None)
    }

    fn value_loss(&self, cmp: &mut Compare) -> Result<()> {
        let mode = self.agg(&["config", "loss_agg_mode"])?;
        let vpreds = self.tensor::<2>("vpreds")?.require_grad();
        let (mask, mask_v) = self.mask()?;
        let (loss, frac) = clipped_value_loss(
            vpreds.clone(),
            self.tensor("values")?,
            self.tensor("returns")?,
            &mask,
            self.num(&["config", "cliprange_value"])?,
            mode,
            &GlobalBatchInfo::local(),
        )
        .map_err(|e| self.algo(e))?;
        if let Some(want) = self.opt_num(&["outputs", "metrics", "vf_clipfrac"]) {
            cmp.scalar("vf_clipfrac", self.host(&frac)?[0], want);
        }
        self.scalar_and_grad(cmp, loss, &vpreds, "vpreds", Some(&mask_v))
    }

    /// Compares the loss against `outputs.loss` and its gradient against `outputs.grad.NAME`:
    /// within tolerance where `mask` is set (everywhere without a mask), exactly 0 elsewhere.
    fn scalar_and_grad<const D: usize>(
        &self,
        cmp: &mut Compare,
        loss: Tensor<1>,
        leaf: &Tensor<D>,
        name: &str,
        mask: Option<&[f64]>,
    ) -> Result<()> {
        cmp.scalar(
            "loss",
            self.host(&loss)?[0],
            self.num(&["outputs", "loss"])?,
        );
        let g = leaf
            .grad(&loss.backward())
            .ok_or_else(|| self.err(format!("no gradient reached {name}")))?;
        let want = self.want(&["outputs", "grad", name])?;
        cmp.tensor(
            &format!("grad.{name}"),
            &self.host(&g)?,
            &want,
            mask,
            mask.is_some(),
        );
        Ok(())
    }
}

/// The golden directory: the argument, else `RLFT_GOLDEN_DIR`, else `../shared/golden`.
pub fn golden_dir(arg: Option<&str>) -> PathBuf {
    arg.map(PathBuf::from)
        .or_else(|| std::env::var_os("RLFT_GOLDEN_DIR").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("../shared/golden"))
}
