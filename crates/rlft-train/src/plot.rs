//! PNG curves of `metrics.jsonl` (plotters): one chart per numeric metric, against the step.

use crate::metrics::read_metrics;
use crate::{Result, TrainError};
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

fn register_font() -> bool {
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
