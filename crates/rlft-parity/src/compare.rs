//! Element-wise comparison with tolerances, collecting failures and uncompared metrics.

use crate::{Options, Outcome};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// Relative tolerance for metrics the reference computes in float32 (means of `.float()` masks).
const F32_METRIC_RTOL: f64 = 1e-6;

/// Compares rlft's values against the reference and records what differs.
pub(crate) struct Compare {
    rtol: f64,
    atol: f64,
    /// The case's own `tolerance`: `(rtol, atol, output path prefixes)`.
    case_tol: Option<(f64, f64, Vec<String>)>,
    failures: Vec<String>,
    uncompared: Vec<String>,
    /// Every output of the reference (`loss`, `grad.log_prob`, `metrics.kl`, ...).
    expected: BTreeSet<String>,
    /// The outputs compared so far.
    seen: BTreeSet<String>,
}

/// The leaves under a case's `outputs`: tensors and numbers, and each entry of an object of
/// them (`grad`, `metrics`, `sample_metrics`).
fn output_paths(outputs: Option<&Value>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let Some(obj) = outputs.and_then(Value::as_object) else {
        return out;
    };
    for (k, v) in obj {
        match v.as_object() {
            Some(inner) if !inner.contains_key("data") => {
                out.extend(inner.keys().map(|s| format!("{k}.{s}")));
            }
            _ => {
                out.insert(k.clone());
            }
        }
    }
    out
}

impl Compare {
    pub(crate) fn new(o: &Options, case: &Value) -> Self {
        let case_tol = case.get("tolerance").and_then(|t| {
            let paths = t
                .get("paths")?
                .as_array()?
                .iter()
                .filter_map(Value::as_str)
                .map(|p| p.strip_prefix("outputs.").unwrap_or(p).to_string())
                .collect();
            Some((
                t.get("rtol").and_then(Value::as_f64).unwrap_or(0.0),
                t.get("atol").and_then(Value::as_f64).unwrap_or(0.0),
                paths,
            ))
        });
        Self {
            rtol: o.rtol,
            atol: o.atol,
            case_tol,
            failures: Vec::new(),
            uncompared: Vec::new(),
            expected: output_paths(case.get("outputs")),
            seen: BTreeSet::new(),
        }
    }

    /// Failed if anything differed; otherwise skipped if a reference output went uncompared.
    pub(crate) fn outcome(mut self) -> Outcome {
        for p in self.expected.difference(&self.seen) {
            if !self.uncompared.contains(p) {
                self.uncompared.push(p.clone());
            }
        }
        if !self.failures.is_empty() {
            Outcome::Failed(self.failures)
        } else if !self.uncompared.is_empty() {
            Outcome::Skipped(format!(
                "outputs rlft does not report: {}",
                self.uncompared.join(", ")
            ))
        } else {
            Outcome::Passed
        }
    }

    /// `(rtol, atol)` for an output path: the run's, widened by the case's own where one of its
    /// path prefixes matches.
    fn tol_for(&self, path: &str) -> (f64, f64) {
        match &self.case_tol {
            Some((r, a, paths))
                if paths
                    .iter()
                    .any(|p| path == p || path.starts_with(&format!("{p}."))) =>
            {
                (self.rtol.max(*r), self.atol.max(*a))
            }
            _ => (self.rtol, self.atol),
        }
    }

    fn close_at(got: f64, want: f64, (rtol, atol): (f64, f64)) -> bool {
        (got - want).abs() <= atol + rtol * want.abs() || (got.is_nan() && want.is_nan())
    }

    pub(crate) fn scalar(&mut self, name: &str, got: f64, want: f64) {
        self.seen.insert(name.to_string());
        let tol = self.tol_for(name);
        self.scalar_at(name, got, want, tol);
    }

    fn scalar_at(&mut self, name: &str, got: f64, want: f64, tol: (f64, f64)) {
        if !Self::close_at(got, want, tol) {
            self.failures
                .push(format!("{name}: rlft {got:e} vs reference {want:e}"));
        }
    }

    /// Compares every metric of the reference (`outputs.metrics`) with rlft's value of the same
    /// name; a reference metric that rlft does not report is recorded as uncompared.
    pub(crate) fn metrics(&mut self, want: Option<&Value>, got: &BTreeMap<String, f64>) {
        let Some(want) = want.and_then(Value::as_object) else {
            return;
        };
        for (key, w) in want {
            let Some(w) = w.as_f64() else {
                self.failures
                    .push(format!("metric {key}: reference value {w} is not a number"));
                continue;
            };
            let path = format!("metrics.{key}");
            match got.get(key) {
                Some(g) => {
                    self.seen.insert(path.clone());
                    let (mut rtol, atol) = self.tol_for(&path);
                    if computed_in_f32(key) {
                        rtol = rtol.max(F32_METRIC_RTOL);
                    }
                    self.scalar_at(key, *g, w, (rtol, atol));
                }
                None => self.uncompared.push(path),
            }
        }
    }

    /// Compares every `[batch]` vector of the reference's `sample_metrics` with rlft's of the
    /// same name.
    pub(crate) fn sample_metrics(
        &mut self,
        want: Option<&Value>,
        got: &BTreeMap<String, Vec<f64>>,
    ) {
        let Some(want) = want.and_then(Value::as_object) else {
            return;
        };
        for (key, w) in want {
            let path = format!("sample_metrics.{key}");
            let data: Option<Vec<f64>> = w
                .get("data")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_f64).collect());
            match (got.get(key), data) {
                (Some(g), Some(d)) => self.tensor(&path, g, &d, None, false),
                (None, _) => self.uncompared.push(path),
                (_, None) => self
                    .failures
                    .push(format!("{path}: reference value is not a tensor")),
            }
        }
    }

    /// Compares where `mask` is set; where it is not and `zero_outside`, requires exactly 0.
    pub(crate) fn tensor(
        &mut self,
        name: &str,
        got: &[f64],
        want: &[f64],
        mask: Option<&[f64]>,
        zero_outside: bool,
    ) {
        self.seen.insert(name.to_string());
        let tol = self.tol_for(name);
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
                Self::close_at(*g, *w, tol)
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

/// Metrics the references compute as means of `.float()` (float32) masks: fractions, rates and
/// ROLL's sample ratios.
fn computed_in_f32(key: &str) -> bool {
    key.contains("fraction")
        || key.ends_with("oob_ratio")
        || key.ends_with("_ratio")
        || key.ends_with("clipfrac")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn case() -> Value {
        json!({
            "outputs": {
                "loss": 1.0,
                "grad": {"log_prob": {"shape": [1], "data": [2.0]}},
                "mask": {"shape": [1], "data": [1.0]},
                "metrics": {"kl": 0.5}
            },
            "tolerance": {"rtol": 1e-3, "atol": 0.0, "paths": ["outputs.grad.log_prob"]}
        })
    }

    #[test]
    fn case_tolerance_widens_only_its_paths() {
        let mut cmp = Compare::new(&Options::f64(), &case());
        cmp.scalar("loss", 1.0 + 1e-6, 1.0);
        cmp.tensor("grad.log_prob", &[2.0 + 1e-4], &[2.0], None, false);
        cmp.tensor("mask", &[1.0], &[1.0], None, false);
        cmp.metrics(
            case().pointer("/outputs/metrics"),
            &BTreeMap::from([("kl".to_string(), 0.5)]),
        );
        match cmp.outcome() {
            Outcome::Failed(lines) => {
                assert_eq!(lines.len(), 1, "{lines:?}");
                assert!(lines[0].starts_with("loss"), "{lines:?}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_uncompared_output_skips_the_case() {
        let mut cmp = Compare::new(&Options::f64(), &case());
        cmp.scalar("loss", 1.0, 1.0);
        cmp.tensor("grad.log_prob", &[2.0], &[2.0], None, false);
        cmp.metrics(
            case().pointer("/outputs/metrics"),
            &BTreeMap::from([("kl".to_string(), 0.5)]),
        );
        match cmp.outcome() {
            Outcome::Skipped(why) => assert!(why.contains("mask"), "{why}"),
            other => panic!("{other:?}"),
        }
    }
}
