//! Pictures of a run (plotters): one curve per numeric metric of `metrics.jsonl`, and the
//! stale-samples lecture's figures (docs/stale-samples.md, "The lecture") from the run's own
//! data ([`plot_run`]): the cumulative-ratio fan by token position, the staleness histogram, the
//! off-policy curves and the timeline of `events.jsonl`.

mod clip;
mod figures;
mod report;
mod sim;
mod timeline;

pub use clip::{ClipCurve, NotDrawn, clip_curves, write_clip_curves};
pub use report::write_report;
pub use sim::write_speedup;

use crate::metrics::read_metrics;
use crate::{Result, TrainError};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Fonts tried for axis labels; without one, charts are drawn without text.
const FONT_PATHS: [&str; 4] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/Library/Fonts/Arial.ttf",
    "C:\\Windows\\Fonts\\arial.ttf",
];

pub(crate) fn register_font() -> bool {
    static DONE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *DONE.get_or_init(|| {
        let path = std::env::var("RLFT_PLOT_FONT")
            .ok()
            .into_iter()
            .chain(FONT_PATHS.iter().map(|s| s.to_string()))
            .find(|p| Path::new(p).exists());
        let Some(bytes) = path.and_then(|p| std::fs::read(p).ok()) else {
            return false;
        };
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok()
    })
}

/// Writes `plot_<metric>.png` into `out_dir` for every numeric metric in `metrics` (a
/// `metrics.jsonl` path); returns the files written.
pub fn plot_metrics(metrics: &Path, out_dir: &Path) -> Result<Vec<PathBuf>> {
    let rows = read_metrics(metrics)?;
    let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for m in &rows {
        let Some(step) = m.get("step").and_then(|v| v.as_f64()) else {
            continue;
        };
        for (k, v) in m {
            if k != "step"
                && let Some(x) = v.as_f64().filter(|x| x.is_finite())
            {
                series.entry(k.clone()).or_default().push((step, x));
            }
        }
    }
    let text = register_font();
    let mut written = Vec::new();
    for (name, pts) in series {
        let stem = format!("plot_{}", name.replace(['/', ' '], "_"));
        let file = out_dir.join(format!("{stem}.png"));
        // Drawn beside it, synced, then renamed over it: a reader never sees half a picture.
        let tmp = out_dir.join(format!(".{stem}.tmp.png"));
        draw(&tmp, &name, &pts, text)
            .map_err(std::io::Error::other)
            .and_then(|()| std::fs::File::open(&tmp)?.sync_all())
            .and_then(|()| std::fs::rename(&tmp, &file))
            .map_err(|source| {
                let _ = std::fs::remove_file(&tmp);
                TrainError::Io {
                    path: file.clone(),
                    source,
                }
            })?;
        written.push(file);
    }
    Ok(written)
}

/// A picture drawable on any plotters backend (PNG and SVG).
pub(crate) trait Figure {
    /// Pixel size.
    fn size(&self) -> (u32, u32) {
        (900, 520)
    }

    /// Draws onto `root`; `text` is false when no font was found (no labels then).
    fn draw<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
        text: bool,
    ) -> std::result::Result<(), String>;
}

/// Writes `<stem>.png` and `<stem>.svg` into `out_dir` (each drawn aside, synced and renamed).
pub(crate) fn save(fig: &impl Figure, out_dir: &Path, stem: &str) -> Result<Vec<PathBuf>> {
    let text = register_font();
    let png = out_dir.join(format!("{stem}.png"));
    let tmp = out_dir.join(format!(".{stem}.tmp.png"));
    let drawn = {
        let root = BitMapBackend::new(&tmp, fig.size()).into_drawing_area();
        root.fill(&WHITE)
            .map_err(|e| e.to_string())
            .and_then(|()| fig.draw(&root, text))
            .and_then(|()| root.present().map_err(|e| e.to_string()))
    };
    drawn
        .map_err(std::io::Error::other)
        .and_then(|()| std::fs::File::open(&tmp)?.sync_all())
        .and_then(|()| std::fs::rename(&tmp, &png))
        .map_err(|source| {
            let _ = std::fs::remove_file(&tmp);
            TrainError::Io {
                path: png.clone(),
                source,
            }
        })?;
    let svg = out_dir.join(format!("{stem}.svg"));
    let mut text_svg = String::new();
    {
        let root = SVGBackend::with_string(&mut text_svg, fig.size()).into_drawing_area();
        root.fill(&WHITE)
            .map_err(|e| e.to_string())
            .and_then(|()| fig.draw(&root, text))
            .and_then(|()| root.present().map_err(|e| e.to_string()))
            .map_err(|e| TrainError::Io {
                path: svg.clone(),
                source: std::io::Error::other(e),
            })?;
    }
    crate::write_atomic(&svg, text_svg.as_bytes())?;
    Ok(vec![png, svg])
}

/// Every picture of run folder `run`: the metric curves, the cumulative-ratio fan
/// (`ratio_fan`), the staleness histogram (`staleness`), the off-policy curves (`offpolicy`) and
/// the timeline (`timeline`, beside `other`'s when given: a sync and an async run compared); a
/// figure the run has no data for says so and how to get it. Pictures go into `run`; returns
/// the files written.
///
/// # Errors
/// `run` has no readable `metrics.jsonl`, or a file cannot be written.
pub fn plot_run(run: &Path, other: Option<&Path>) -> Result<Vec<PathBuf>> {
    let metrics = run.join("metrics.jsonl");
    let mut written = plot_metrics(&metrics, run)?;
    let rows = read_metrics(&metrics)?;
    let off_policy = "no off-policy data: this run never compared pi_old with mu (sync mode with \
                      the auto correction); set algorithm.correction.mode = \"recompute\"";
    let no_data = |title, reason| figures::NoData { title, reason };
    written.extend(match figures::RatioFan::from_metrics(&rows) {
        Some(f) => save(&f, run, "ratio_fan")?,
        None => save(
            &no_data("cumulative log-ratio fan", off_policy),
            run,
            "ratio_fan",
        )?,
    });
    written.extend(match figures::StalenessHist::from_metrics(&rows) {
        Some(f) => save(&f, run, "staleness")?,
        None => save(
            &no_data("staleness", "no staleness/* metrics in metrics.jsonl"),
            run,
            "staleness",
        )?,
    });
    written.extend(match figures::OffPolicy::from_metrics(&rows) {
        Some(f) => save(&f, run, "offpolicy")?,
        None => save(&no_data("off-policy curves", off_policy), run, "offpolicy")?,
    });
    let mut runs = vec![timeline::RunTimeline::read(run)?];
    if let Some(o) = other {
        runs.push(timeline::RunTimeline::read(o)?);
    }
    runs.retain(|r| !r.events.is_empty());
    written.extend(if runs.is_empty() {
        save(
            &no_data(
                "timeline",
                "no events.jsonl in the run folder (runs of rlft before 0.1 wrote none)",
            ),
            run,
            "timeline",
        )?
    } else {
        save(&timeline::Timeline { runs }, run, "timeline")?
    });
    Ok(written)
}

fn draw(
    file: &Path,
    name: &str,
    pts: &[(f64, f64)],
    text: bool,
) -> std::result::Result<(), String> {
    let root = BitMapBackend::new(file, (720, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let (x0, x1) = pts
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| {
            (a.min(p.0), b.max(p.0))
        });
    let (y0, y1) = pts
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| {
            (a.min(p.1), b.max(p.1))
        });
    let pad = ((y1 - y0) * 0.05).max(1e-6);
    let mut builder = ChartBuilder::on(&root);
    builder.margin(12);
    if text {
        builder
            .caption(name, ("sans-serif", 22))
            .x_label_area_size(32)
            .y_label_area_size(60);
    }
    let mut chart = builder
        .build_cartesian_2d(x0..x1.max(x0 + 1.0), (y0 - pad)..(y1 + pad))
        .map_err(|e| e.to_string())?;
    let mut mesh = chart.configure_mesh();
    if text {
        mesh.x_desc("step");
    } else {
        mesh.x_labels(0).y_labels(0);
    }
    mesh.draw().map_err(|e| e.to_string())?;
    chart
        .draw_series(LineSeries::new(pts.iter().copied(), &BLUE))
        .map_err(|e| e.to_string())?;
    chart
        .draw_series(pts.iter().map(|&p| Circle::new(p, 2, BLUE.filled())))
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())?;
    Ok(())
}
