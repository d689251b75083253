//! Element-wise comparison with tolerances, collecting failures and uncompared metrics.

use crate::{Options, Outcome};
use serde_json::Value;
use std::collections::BTreeMap;

/// Relative tolerance for metrics the reference computes in float32 (means of `.float()` masks).
const F32_METRIC_RTOL: f64 = 1e-6;

/// Compares rlft's values against the reference and records what differs.
pub(crate) struct Compare {
    rtol: f64,
    atol: f64,
    failures: Vec<String>,
    uncompared: Vec<String>,
}

impl Compare {
    pub(crate) fn new(o: &Options) -> Self {
        Self {
            rtol: o.rtol,
            atol: o.atol,
            failures: Vec::new(),
            uncompared: Vec::new(),
        }
    }

    /// Failed if anything differed; otherwise skipped if a reference metric went uncompared.
    pub(crate) fn outcome(self) -> Outcome {
        if !self.failures.is_empty() {
            Outcome::Failed(self.failures)
        } else if !self.uncompared.is_empty() {
            Outcome::Skipped(format!(
                "metrics rlft does not report: {}",
                self.uncompared.join(", ")
            ))
        } else {
            Outcome::Passed
        }
    }

    fn close(&self, got: f64, want: f64, rtol: f64) -> bool {
        (got - want).abs() <= self.atol + rtol * want.abs()
    }

    pub(crate) fn scalar(&mut self, name: &str, got: f64, want: f64) {
        self.scalar_at(name, got, want, self.rtol);
    }

    fn scalar_at(&mut self, name: &str, got: f64, want: f64, rtol: f64) {
        if !self.close(got, want, rtol) {
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
            match got.get(key) {
                Some(g) => {
                    let rtol = if computed_in_f32(key) {
                        self.rtol.max(F32_METRIC_RTOL)
                    } else {
                        self.rtol
                    };
                    self.scalar_at(key, *g, w, rtol);
                }
                None => self.uncompared.push(key.clone()),
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
                self.close(*g, *w, self.rtol)
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

/// Metrics verl computes as means of `.float()` (float32) masks: fractions and rates.
fn computed_in_f32(key: &str) -> bool {
    key.contains("fraction") || key.ends_with("oob_ratio")
}
