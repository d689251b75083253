//! TensorBoard event files (`logging.tensorboard = true`): every numeric metric of a step as a
//! scalar, and the staleness and per-position log-ratio distributions as histograms, in
//! `RUN/tensorboard/events.out.tfevents.*`, readable by the `tensorboard` tool.
//!
//! The format is TFRecord framing (length, masked CRC32C of the length, the data, masked CRC32C
//! of the data) around `tensorflow.Event` protobufs, encoded with `prost` from the message
//! definitions below (the fields TensorBoard reads). Each process writes a new file. A resumed
//! run first cuts the earlier files back to the checkpoint's step (rewritten through a temporary
//! file), so no step appears twice; a run that turns TensorBoard on at resume gets the steps so
//! far written into its first file.

use crate::metrics::{MetricSink, MetricsLog, StepMetrics};
use crate::{Result, TrainError, io_err};
use prost::Message;
use std::io::Write;
use std::path::{Path, PathBuf};

/// `tensorflow.Event`.
#[derive(Clone, PartialEq, Message)]
pub struct Event {
    /// Seconds since the Unix epoch.
    #[prost(double, tag = "1")]
    pub wall_time: f64,
    /// The training step.
    #[prost(int64, tag = "2")]
    pub step: i64,
    /// What the event carries.
    #[prost(oneof = "EventWhat", tags = "3, 5")]
    pub what: Option<EventWhat>,
}

/// `Event.what`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum EventWhat {
    /// The first event of a file: `brain.Event:2`.
    #[prost(string, tag = "3")]
    FileVersion(String),
    /// Scalars and histograms.
    #[prost(message, tag = "5")]
    Summary(Summary),
}

/// `tensorflow.Summary`.
#[derive(Clone, PartialEq, Message)]
pub struct Summary {
    /// The values.
    #[prost(message, repeated, tag = "1")]
    pub value: Vec<SummaryValue>,
}

/// `tensorflow.Summary.Value`.
#[derive(Clone, PartialEq, Message)]
pub struct SummaryValue {
    /// The metric name.
    #[prost(string, tag = "1")]
    pub tag: String,
    /// A scalar or a histogram.
    #[prost(oneof = "SummaryKind", tags = "2, 5")]
    pub value: Option<SummaryKind>,
}

/// `Summary.Value.value`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum SummaryKind {
    /// A scalar.
    #[prost(float, tag = "2")]
    SimpleValue(f32),
    /// A histogram.
    #[prost(message, tag = "5")]
    Histo(Histogram),
}

/// `tensorflow.HistogramProto`: bucket `i` holds the mass in `(bucket_limit[i-1],
/// bucket_limit[i]]`.
#[derive(Clone, PartialEq, Message)]
pub struct Histogram {
    /// Smallest value.
    #[prost(double, tag = "1")]
    pub min: f64,
    /// Largest value.
    #[prost(double, tag = "2")]
    pub max: f64,
    /// Total mass.
    #[prost(double, tag = "3")]
    pub num: f64,
    /// Σ x.
    #[prost(double, tag = "4")]
    pub sum: f64,
    /// Σ x².
    #[prost(double, tag = "5")]
    pub sum_squares: f64,
    /// Upper bucket edges.
    #[prost(double, repeated, tag = "6")]
    pub bucket_limit: Vec<f64>,
    /// Bucket masses.
    #[prost(double, repeated, tag = "7")]
    pub bucket: Vec<f64>,
}

/// The folder under a run that holds the event files.
pub const DIR: &str = "tensorboard";

fn masked_crc(data: &[u8]) -> u32 {
    let c = crc32c::crc32c(data);
    c.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// One TFRecord.
fn record(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
    out
}

/// The events of an event file, checking both checksums of every record. A torn last record
/// (a crash mid-write) ends the list; a bad checksum before it is an error.
pub fn read_events(path: &Path) -> Result<Vec<Event>> {
    let bytes = std::fs::read(path).map_err(io_err(path))?;
    let bad = |msg: String| TrainError::Checkpoint {
        path: path.into(),
        msg,
    };
    let mut events = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let Some(head) = bytes.get(at..at + 12) else {
            break;
        };
        let len = u64::from_le_bytes(head[..8].try_into().unwrap_or_default());
        if u32::from_le_bytes(head[8..].try_into().unwrap_or_default()) != masked_crc(&head[..8]) {
            return Err(bad(format!("record at byte {at}: bad length checksum")));
        }
        let Some(end) = usize::try_from(len)
            .ok()
            .and_then(|l| (at + 12).checked_add(l))
        else {
            return Err(bad(format!("record at byte {at}: length {len}")));
        };
        let (Some(data), Some(crc)) = (bytes.get(at + 12..end), bytes.get(end..end + 4)) else {
            break;
        };
        if u32::from_le_bytes(crc.try_into().unwrap_or_default()) != masked_crc(data) {
            return Err(bad(format!("record at byte {at}: bad data checksum")));
        }
        events.push(Event::decode(data).map_err(|e| bad(format!("record at byte {at}: {e}")))?);
        at = end + 4;
    }
    Ok(events)
}

/// The event files in `dir`, oldest first (their names start with the creation time).
pub fn event_files(dir: &Path) -> Result<Vec<PathBuf>> {
    if !dir.exists() {
        return Ok(Vec::new());
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io_err(dir))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("events.out.tfevents.") && !n.ends_with(".tmp"))
        })
        .collect();
    files.sort();
    Ok(files)
}

/// Scalars of every numeric metric but `step`, and histograms of the staleness distribution
/// (`staleness/hist/*`) and of each position range's log-ratio quantiles
/// (`offpolicy/pos/<level>/<range>/p5..p95`: a histogram of the quantile sketch, the mass
/// between neighbouring quantiles spread over their interval).
pub fn summary(m: &StepMetrics) -> Summary {
    let mut value: Vec<SummaryValue> = m
        .iter()
        .filter(|(k, _)| *k != "step")
        .filter_map(|(k, v)| {
            Some(SummaryValue {
                tag: k.clone(),
                value: Some(SummaryKind::SimpleValue(v.as_f64()? as f32)),
            })
        })
        .collect();
    let get = |k: &str| m.get(k).and_then(|v| v.as_f64());
    // Staleness: bucket k holds the share of groups k versions old, then the share past η.
    let mut limits = Vec::new();
    let mut buckets = Vec::new();
    while let Some(share) = get(&format!("staleness/hist/{}", limits.len())) {
        limits.push(limits.len() as f64 + 0.5);
        buckets.push(share);
    }
    if let Some(over) = get("staleness/hist/over")
        && !buckets.is_empty()
    {
        limits.push(f64::MAX);
        buckets.push(over);
        let max = get("staleness/max").unwrap_or(limits.len() as f64);
        let ks = (0..buckets.len()).map(|k| (k as f64).min(max));
        value.push(SummaryValue {
            tag: "staleness".into(),
            value: Some(SummaryKind::Histo(Histogram {
                min: 0.0,
                max,
                num: buckets.iter().sum(),
                sum: get("staleness/mean").unwrap_or(0.0),
                sum_squares: ks.zip(&buckets).map(|(k, b)| k * k * b).sum(),
                bucket_limit: limits,
                bucket: buckets,
            })),
        });
    }
    // Log-ratio quantiles by position range.
    const QS: [(&str, f64); 5] = [
        ("p5", 0.05),
        ("p25", 0.25),
        ("p50", 0.5),
        ("p75", 0.75),
        ("p95", 0.95),
    ];
    let prefixes: std::collections::BTreeSet<&str> = m
        .keys()
        .filter(|k| k.starts_with("offpolicy/pos/"))
        .filter_map(|k| k.rsplit_once('/').map(|(p, _)| p))
        .collect();
    for prefix in prefixes {
        let q: Option<Vec<f64>> = QS
            .iter()
            .map(|(n, _)| get(&format!("{prefix}/{n}")))
            .collect();
        let Some(q) = q.filter(|q| q.iter().all(|x| x.is_finite())) else {
            continue;
        };
        // Mass 5 % up to p5, then the share between neighbouring quantiles, 5 % past p95.
        let mut bucket_limit = q.clone();
        bucket_limit.push(f64::MAX);
        let mut bucket = vec![QS[0].1];
        bucket.extend(QS.windows(2).map(|w| w[1].1 - w[0].1));
        bucket.push(1.0 - QS[4].1);
        let mids: Vec<f64> = std::iter::once(q[0])
            .chain(q.windows(2).map(|w| (w[0] + w[1]) / 2.0))
            .chain(std::iter::once(q[4]))
            .collect();
        value.push(SummaryValue {
            tag: prefix.to_string(),
            value: Some(SummaryKind::Histo(Histogram {
                min: q[0],
                max: q[4],
                num: 1.0,
                sum: mids.iter().zip(&bucket).map(|(x, b)| x * b).sum(),
                sum_squares: mids.iter().zip(&bucket).map(|(x, b)| x * x * b).sum(),
                bucket_limit,
                bucket,
            })),
        });
    }
    Summary { value }
}

/// Appends a run's steps to a new event file.
#[derive(Debug)]
pub struct EventWriter {
    path: PathBuf,
    file: std::fs::File,
}

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl EventWriter {
    /// Opens a new event file in `run/tensorboard/`. With `keep_until = Some(step)` (a resumed
    /// run) the earlier files are first cut back to the events of steps ≤ `step`; if there were
    /// none, `history` (the metric lines kept) is written first, so the file has the whole run.
    pub fn open(run: &Path, keep_until: Option<usize>, history: &[StepMetrics]) -> Result<Self> {
        let dir = run.join(DIR);
        std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        let old = event_files(&dir)?;
        if let Some(last) = keep_until {
            for f in &old {
                let events = read_events(f)?;
                let kept: Vec<u8> = events
                    .iter()
                    .filter(|e| e.step <= last as i64)
                    .flat_map(|e| record(&e.encode_to_vec()))
                    .collect();
                crate::write_atomic(f, &kept)?;
            }
        } else {
            for f in &old {
                std::fs::remove_file(f).map_err(io_err(f))?;
            }
        }
        let wall = now();
        let name = format!(
            "events.out.tfevents.{:010}.rlft.{}.{}",
            wall as u64,
            std::process::id(),
            old.len()
        );
        let path = dir.join(name);
        let file = std::fs::OpenOptions::new()
            .create_new(true)
            .append(true)
            .open(&path)
            .map_err(io_err(&path))?;
        let mut w = Self { path, file };
        w.append(&Event {
            wall_time: wall,
            step: 0,
            what: Some(EventWhat::FileVersion("brain.Event:2".into())),
        })?;
        if keep_until.is_none_or(|_| old.is_empty()) {
            for m in history {
                w.write(m)?;
            }
        }
        Ok(w)
    }

    /// The file written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn append(&mut self, e: &Event) -> Result<()> {
        self.file
            .write_all(&record(&e.encode_to_vec()))
            .map_err(io_err(&self.path))
    }

    /// Writes one step's metrics (its `step` key is the step).
    pub fn write(&mut self, m: &StepMetrics) -> Result<()> {
        let step = m.get("step").and_then(|s| s.as_i64()).unwrap_or(0);
        self.append(&Event {
            wall_time: now(),
            step,
            what: Some(EventWhat::Summary(summary(m))),
        })
    }
}

impl MetricSink for EventWriter {
    fn write(&mut self, m: &StepMetrics) -> Result<()> {
        EventWriter::write(self, m)
    }
}

impl MetricsLog {
    /// From now on every line also goes to a new TensorBoard event file in `run`
    /// ([`EventWriter::open`], with the same `keep_until` as [`MetricsLog::open`]).
    pub fn with_tensorboard(self, run: &Path, keep_until: Option<usize>) -> Result<Self> {
        let events = EventWriter::open(run, keep_until, &self.history)?;
        Ok(self.with_sink(events))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn metrics(step: u64) -> StepMetrics {
        json!({
            "step": step, "reward/mean": 0.5, "name": "x",
            "staleness/hist/0": 0.25, "staleness/hist/1": 0.75, "staleness/hist/over": 0.0,
            "staleness/max": 1.0, "staleness/mean": 0.75,
            "offpolicy/pos/cum/1-8/p5": -0.2, "offpolicy/pos/cum/1-8/p25": -0.1,
            "offpolicy/pos/cum/1-8/p50": 0.0, "offpolicy/pos/cum/1-8/p75": 0.1,
            "offpolicy/pos/cum/1-8/p95": 0.3,
        })
        .as_object()
        .unwrap()
        .clone()
    }

    #[test]
    fn scalars_and_histograms() {
        let s = summary(&metrics(3));
        let tags: Vec<&str> = s.value.iter().map(|v| v.tag.as_str()).collect();
        assert!(
            tags.contains(&"reward/mean") && !tags.contains(&"name") && !tags.contains(&"step")
        );
        let histo = |tag: &str| match &s.value.iter().find(|v| v.tag == tag).unwrap().value {
            Some(SummaryKind::Histo(h)) => h.clone(),
            other => panic!("{other:?}"),
        };
        let h = histo("staleness");
        assert_eq!(h.bucket, [0.25, 0.75, 0.0]);
        assert_eq!(h.bucket_limit[..2], [0.5, 1.5]);
        let h = histo("offpolicy/pos/cum/1-8");
        assert_eq!(h.bucket_limit[..5], [-0.2, -0.1, 0.0, 0.1, 0.3]);
        assert!((h.bucket.iter().sum::<f64>() - 1.0).abs() < 1e-12);
    }

    #[test]
    fn resume_cuts_back_and_starts_a_new_file() {
        let run = std::env::temp_dir().join(format!("rlft-tb-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&run);
        let mut w = EventWriter::open(&run, None, &[]).unwrap();
        for s in 0..=5 {
            w.write(&metrics(s)).unwrap();
        }
        let first = w.path().to_path_buf();
        drop(w);
        // Torn last record: dropped on reading.
        let mut bytes = std::fs::read(&first).unwrap();
        bytes.extend_from_slice(&[1, 2, 3]);
        std::fs::write(&first, &bytes).unwrap();
        let mut w = EventWriter::open(&run, Some(3), &[]).unwrap();
        w.write(&metrics(4)).unwrap();
        let files = event_files(&run.join(DIR)).unwrap();
        assert_eq!(files.len(), 2);
        let steps: Vec<i64> = files
            .iter()
            .flat_map(|f| read_events(f).unwrap())
            .filter(|e| matches!(e.what, Some(EventWhat::Summary(_))))
            .map(|e| e.step)
            .collect();
        assert_eq!(steps, [0, 1, 2, 3, 4]);
        // A flipped byte is a checksum error, not a silent skip.
        let mut bytes = std::fs::read(&first).unwrap();
        bytes[20] ^= 0xff;
        std::fs::write(&first, &bytes).unwrap();
        assert!(
            read_events(&first)
                .unwrap_err()
                .to_string()
                .contains("checksum")
        );
        std::fs::remove_dir_all(&run).ok();
    }
}
