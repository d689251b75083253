//! `metrics.jsonl`: one JSON object per RL step; the end-of-run summary table.

use crate::{Result, io_err};
use serde_json::{Map, Value};
use std::io::Write;
use std::path::{Path, PathBuf};

/// One step's metrics, in insertion order.
pub type StepMetrics = Map<String, Value>;

/// Appends metric lines to a JSONL file.
#[derive(Debug)]
pub struct MetricsLog {
    path: PathBuf,
    /// Every line written or kept, for the summary.
    pub history: Vec<StepMetrics>,
}

impl MetricsLog {
    /// Opens `path`; with `keep_until = Some(step)` (a resumed run), existing lines after `step`
    /// are dropped (they are recomputed), otherwise the file is started afresh.
    pub fn open(path: &Path, keep_until: Option<usize>) -> Result<Self> {
        let mut history = Vec::new();
        if let Some(last) = keep_until
            && path.exists()
        {
            let text = std::fs::read_to_string(path).map_err(io_err(path))?;
            for line in text.lines().filter(|l| !l.trim().is_empty()) {
                let v: Value = serde_json::from_str(line)?;
                if v["step"].as_u64().is_some_and(|s| s as usize <= last)
                    && let Value::Object(m) = v
                {
                    history.push(m);
                }
            }
        }
        let mut text = String::new();
        for m in &history {
            text.push_str(&serde_json::to_string(m)?);
            text.push('\n');
        }
        std::fs::write(path, text).map_err(io_err(path))?;
        Ok(Self {
            path: path.into(),
            history,
        })
    }

    /// Appends one line (flushed).
    pub fn write(&mut self, m: StepMetrics) -> Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.path)
            .map_err(io_err(&self.path))?;
        writeln!(f, "{}", serde_json::to_string(&m)?).map_err(io_err(&self.path))?;
        self.history.push(m);
        Ok(())
    }

    /// A table of the main metrics: first value, last value, best.
    pub fn summary(&self) -> String {
        let keys = [
            "eval/accuracy",
            "eval/mean_at_k",
            "reward/mean",
            "accuracy",
            "kl",
            "entropy",
            "response_len/mean",
            "clip_frac/high",
            "tokens_per_s",
        ];
        let mut out = format!(
            "{:<20} {:>10} {:>10} {:>10}\n",
            "metric", "first", "last", "max"
        );
        for k in keys {
            let vals: Vec<f64> = self
                .history
                .iter()
                .filter_map(|m| m.get(k)?.as_f64())
                .collect();
            if let (Some(first), Some(last)) = (vals.first(), vals.last()) {
                let max = vals.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                out.push_str(&format!("{k:<20} {first:>10.4} {last:>10.4} {max:>10.4}\n"));
            }
        }
        out
    }
}

/// Reads a metrics file into `(step, metrics)` pairs.
pub fn read_metrics(path: &Path) -> Result<Vec<StepMetrics>> {
    let text = std::fs::read_to_string(path).map_err(io_err(path))?;
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        if let Value::Object(m) = serde_json::from_str(line)? {
            out.push(m);
        }
    }
    Ok(out)
}
