//! `metrics.jsonl`: one JSON object per RL step; the end-of-run summary table. Other
//! destinations for the same lines (TensorBoard event files, [`crate::tensorboard`]) are
//! [`MetricSink`]s that [`MetricsLog`] also writes to.

use crate::{Result, TrainError, io_err};
use serde_json::{Map, Value};
use std::io::Write;
use std::path::{Path, PathBuf};

/// One step's metrics, in insertion order.
pub type StepMetrics = Map<String, Value>;

/// Somewhere a run's step metrics go, one step at a time.
pub trait MetricSink: std::fmt::Debug + Send {
    /// Records one step's metrics.
    fn write(&mut self, m: &StepMetrics) -> Result<()>;
}

/// Appends each step's metrics as one JSON line to a file (flushed).
#[derive(Debug)]
pub struct JsonlWriter {
    path: PathBuf,
}

impl JsonlWriter {
    /// Appends to `path`, which must exist (it is opened for each line).
    pub fn new(path: &Path) -> Self {
        Self { path: path.into() }
    }

    /// The file written.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl MetricSink for JsonlWriter {
    fn write(&mut self, m: &StepMetrics) -> Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.path)
            .map_err(io_err(&self.path))?;
        writeln!(f, "{}", serde_json::to_string(m)?).map_err(io_err(&self.path))
    }
}

/// Appends metric lines to a JSONL file, and to any further [`MetricSink`]s.
#[derive(Debug)]
pub struct MetricsLog {
    jsonl: JsonlWriter,
    /// Every line written or kept, for the summary.
    pub history: Vec<StepMetrics>,
    /// Torn last lines dropped when the file was reopened (0 or 1).
    pub torn_lines: usize,
    /// Where every line also goes, in order, after the JSONL file.
    sinks: Vec<Box<dyn MetricSink>>,
}

impl MetricsLog {
    /// Opens `path`; with `keep_until = Some(step)` (a resumed run), existing lines after `step`
    /// are dropped (they are recomputed), otherwise the file is started afresh. A torn last
    /// line (a crash during an append) is dropped and counted in [`MetricsLog::torn_lines`]; a
    /// malformed line before the last is an error naming it. The kept lines are written to a
    /// temporary file, synced and renamed over `path`.
    pub fn open(path: &Path, keep_until: Option<usize>) -> Result<Self> {
        let mut history = Vec::new();
        let mut torn_lines = 0;
        let mut kept = String::new();
        if let Some(last) = keep_until
            && path.exists()
        {
            let text = std::fs::read_to_string(path).map_err(io_err(path))?;
            let lines: Vec<(usize, &str)> = text
                .lines()
                .enumerate()
                .filter(|(_, l)| !l.trim().is_empty())
                .collect();
            for (k, &(number, line)) in lines.iter().enumerate() {
                let v: Value = match serde_json::from_str(line) {
                    Ok(v) => v,
                    Err(_) if k + 1 == lines.len() => {
                        torn_lines += 1;
                        continue;
                    }
                    Err(e) => {
                        return Err(TrainError::Checkpoint {
                            path: path.into(),
                            msg: format!(
                                "line {} is not a JSON object ({e}); fix or delete that line and \
                                 resume again",
                                number + 1
                            ),
                        });
                    }
                };
                if v["step"].as_u64().is_some_and(|s| s as usize <= last)
                    && let Value::Object(m) = v
                {
                    history.push(m);
                    // Kept verbatim: a parse and re-print can move a float by an ulp.
                    kept.push_str(line);
                    kept.push('\n');
                }
            }
        }
        let text = kept;
        crate::write_atomic(path, text.as_bytes())?;
        Ok(Self {
            jsonl: JsonlWriter::new(path),
            history,
            torn_lines,
            sinks: Vec::new(),
        })
    }

    /// From now on every line also goes to `sink` (after the sinks added before it).
    pub fn with_sink(mut self, sink: impl MetricSink + 'static) -> Self {
        self.sinks.push(Box::new(sink));
        self
    }

    /// Appends one line (flushed) to the JSONL file, then to each sink.
    pub fn write(&mut self, m: StepMetrics) -> Result<()> {
        self.jsonl.write(&m)?;
        for sink in &mut self.sinks {
            sink.write(&m)?;
        }
        self.history.push(m);
        Ok(())
    }

    /// A table of the main metrics: first value, last value, best.
    pub fn summary(&self) -> String {
        let mut out = format!(
            "{:<20} {:>10} {:>10} {:>10}\n",
            "metric", "first", "last", "max"
        );
        for (k, first, last, max) in summary_rows(&self.history) {
            out.push_str(&format!("{k:<20} {first:>10.4} {last:>10.4} {max:>10.4}\n"));
        }
        out
    }
}

/// The main metrics of a run, `(key, first, last, max)`, for those it has (`eval/mean@<k>` for
/// the run's `eval.k`).
pub fn summary_rows(history: &[StepMetrics]) -> Vec<(String, f64, f64, f64)> {
    let mean_at_k = history
        .iter()
        .flat_map(|m| m.keys())
        .find(|k| k.starts_with("eval/mean@"))
        .cloned();
    const KEYS: [&str; 10] = [
        "eval/accuracy",
        "reward/mean",
        "accuracy",
        "kl",
        "entropy",
        "response_len/mean",
        "clip_frac/high",
        "staleness/mean",
        "offpolicy/kl",
        "tokens_per_s",
    ];
    let keys = KEYS[..1]
        .iter()
        .map(|k| k.to_string())
        .chain(mean_at_k)
        .chain(KEYS[1..].iter().map(|k| k.to_string()));
    keys.filter_map(|k| {
        let vals: Vec<f64> = history.iter().filter_map(|m| m.get(&k)?.as_f64()).collect();
        let max = vals.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        Some((k, *vals.first()?, *vals.last()?, max))
    })
    .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A crash mid-append leaves a torn last line: resuming drops it (and says so), keeps the
    /// steps up to the checkpoint, and rejects corruption earlier in the file.
    #[test]
    fn reopening_cuts_back_to_the_checkpoint_and_drops_a_torn_line() {
        let dir = std::env::temp_dir().join(format!("rlft-metrics-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("metrics.jsonl");
        std::fs::write(
            &path,
            "{\"kl\":0.1,\"step\":1}\n{\"kl\":0.2,\"step\":2}\n{\"kl\":0.3,\"step\":3}\n{\"kl\":0.",
        )
        .unwrap();
        let log = MetricsLog::open(&path, Some(2)).unwrap();
        assert_eq!(log.torn_lines, 1);
        assert_eq!(log.history.len(), 2);
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "{\"kl\":0.1,\"step\":1}\n{\"kl\":0.2,\"step\":2}\n"
        );
        std::fs::write(&path, "{\"step\":1}\nnot json\n{\"step\":2}\n").unwrap();
        let e = MetricsLog::open(&path, Some(2)).unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("metrics.jsonl"), "{e}");
        assert!(
            std::fs::read_to_string(&path).unwrap().contains("not json"),
            "nothing lost"
        );
        std::fs::remove_dir_all(&dir).ok();
    }
}
