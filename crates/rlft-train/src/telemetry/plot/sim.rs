//! The async simulation's picture: projected speed-up over sync against the number of rollout
//! devices, one line per staleness bound η.

use super::{Figure, save};
use crate::Result;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::{Path, PathBuf};

/// `(η, [(devices, speed-up)])` per line.
struct SpeedupFigure(Vec<(usize, Vec<(usize, f64)>)>);

impl Figure for SpeedupFigure {
    fn draw<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
        text: bool,
    ) -> std::result::Result<(), String> {
        let top = self
            .0
            .iter()
            .flat_map(|(_, p)| p.iter().map(|q| q.1))
            .fold(1.0f64, f64::max)
            * 1.1;
        let most = self
            .0
            .iter()
            .flat_map(|(_, p)| p.iter().map(|q| q.0))
            .max()
            .unwrap_or(1)
            .max(2) as f64;
        let mut b = ChartBuilder::on(root);
        b.margin(12);
        if text {
            b.caption("projected speed-up of async over sync", ("sans-serif", 22))
                .x_label_area_size(36)
                .y_label_area_size(50);
        }
        let mut chart = b
            .build_cartesian_2d((1.0..most).log_scale(), 0.0..top)
            .map_err(|e| e.to_string())?;
        let mut mesh = chart.configure_mesh();
        if text {
            mesh.x_desc("rollout devices")
                .y_desc("x sync")
                .x_labels(8)
                .x_label_formatter(&|x| format!("{x:.0}"));
        } else {
            mesh.x_labels(0).y_labels(0);
        }
        mesh.draw().map_err(|e| e.to_string())?;
        for (i, (eta, pts)) in self.0.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let line: Vec<(f64, f64)> = pts.iter().map(|&(d, s)| (d as f64, s)).collect();
            chart
                .draw_series(LineSeries::new(line.clone(), color.stroke_width(2)))
                .map_err(|e| e.to_string())?
                .label(format!("eta = {eta}"))
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color));
            chart
                .draw_series(line.into_iter().map(|p| Circle::new(p, 3, color.filled())))
                .map_err(|e| e.to_string())?;
        }
        if text {
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

/// Writes `async_sim.png` and `.svg` into `out_dir` from `(η, [(devices, speed-up)])` lines.
pub fn write_speedup(
    lines: Vec<(usize, Vec<(usize, f64)>)>,
    out_dir: &Path,
) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(out_dir).map_err(crate::io_err(out_dir))?;
    save(&SpeedupFigure(lines), out_dir, "async_sim")
}
