//! The timeline of `events.jsonl` as a Gantt chart: one lane per actor (the learner and each
//! rollout worker), one bar per interval coloured by what it did; two runs (sync and async) one
//! above the other on the same time axis.

use super::Figure;
use crate::Result;
use crate::events::{Event, EventKind};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

type Res = std::result::Result<(), String>;

/// One run's intervals.
pub(crate) struct RunTimeline {
    name: String,
    pub(crate) events: Vec<Event>,
}

impl RunTimeline {
    /// Reads `run/events.jsonl` (no file: no intervals).
    pub(crate) fn read(run: &Path) -> Result<Self> {
        let name = run
            .file_name()
            .map_or_else(|| run.display().to_string(), |n| n.to_string_lossy().into());
        let events = crate::events::read_events(run)?;
        Ok(Self { name, events })
    }

    /// Actors in lane order: the learner first, then the workers by index.
    fn actors(&self) -> Vec<String> {
        let mut a: Vec<String> = self
            .events
            .iter()
            .filter(|e| e.kind != EventKind::Consume)
            .map(|e| e.actor.clone())
            .collect();
        a.sort_by_key(|x| {
            (
                x != "learner",
                x.rsplit('/')
                    .next()
                    .and_then(|i| i.parse::<u32>().ok())
                    .unwrap_or(0),
                x.clone(),
            )
        });
        a.dedup();
        a
    }
}

/// The Gantt chart of one or two runs.
pub(crate) struct Timeline {
    pub(crate) runs: Vec<RunTimeline>,
}

fn color(kind: EventKind) -> RGBColor {
    match kind {
        EventKind::Generate => RGBColor(31, 119, 180),
        EventKind::Score => RGBColor(44, 160, 44),
        EventKind::Learn => RGBColor(214, 39, 40),
        EventKind::Publish => RGBColor(148, 103, 189),
        EventKind::Wait => RGBColor(200, 200, 200),
        EventKind::Request => RGBColor(255, 127, 14),
        EventKind::Consume => RGBColor(0, 0, 0),
    }
}

/// The kinds drawn as bars (a consumption is an instant, not drawn).
const KINDS: [(EventKind, &str); 6] = [
    (EventKind::Generate, "generate"),
    (EventKind::Score, "score"),
    (EventKind::Learn, "learn"),
    (EventKind::Publish, "publish"),
    (EventKind::Wait, "wait"),
    (EventKind::Request, "server request"),
];

impl Figure for Timeline {
    fn size(&self) -> (u32, u32) {
        (1100, 260 + 200 * self.runs.len() as u32)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>, text: bool) -> Res {
        let t1 = self
            .runs
            .iter()
            .flat_map(|r| r.events.iter().map(|e| e.end_s))
            .fold(0.0f64, f64::max)
            .max(1e-3);
        let panels = root.split_evenly((self.runs.len(), 1));
        for (run, area) in self.runs.iter().zip(&panels) {
            let actors = run.actors();
            let lanes = actors.len().max(1);
            let mut b = ChartBuilder::on(area);
            b.margin(12);
            if text {
                b.caption(
                    format!("{}: what each side did over time", run.name),
                    ("sans-serif", 18),
                )
                .x_label_area_size(32)
                .y_label_area_size(90);
            }
            let mut chart = b
                .build_cartesian_2d(0f64..t1, 0f64..lanes as f64)
                .map_err(|e| e.to_string())?;
            // Lane i (from the bottom) is centred at i + 0.5: label the centres.
            let lane_label = |y: &f64| {
                let i = (y - 0.5).round();
                if (y - 0.5 - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < lanes {
                    actors[lanes - 1 - i as usize].clone()
                } else {
                    String::new()
                }
            };
            let mut mesh = chart.configure_mesh();
            mesh.disable_y_mesh()
                .y_labels(lanes * 2 + 1)
                .y_label_formatter(&lane_label);
            if text {
                mesh.x_desc("seconds since the run started");
            } else {
                mesh.x_labels(0).y_labels(0);
            }
            mesh.draw().map_err(|e| e.to_string())?;
            for (kind, label) in KINDS {
                let c = color(kind);
                let spans: Vec<[(f64, f64); 2]> = run
                    .events
                    .iter()
                    .filter(|e| e.kind == kind && e.end_s >= e.start_s)
                    .filter_map(|e| {
                        let lane = actors.iter().position(|a| *a == e.actor)?;
                        let y = (lanes - 1 - lane) as f64;
                        Some([(e.start_s, y + 0.15), (e.end_s, y + 0.85)])
                    })
                    .collect();
                // Back-to-back intervals stay apart: each bar gets a white outline.
                chart
                    .draw_series(
                        spans
                            .iter()
                            .map(|r| Rectangle::new(*r, WHITE.stroke_width(1))),
                    )
                    .map_err(|e| e.to_string())?;
                let bars = spans.iter().map(|r| Rectangle::new(*r, c.filled()));
                chart
                    .draw_series(bars)
                    .map_err(|e| e.to_string())?
                    .label(label)
                    .legend(move |(x, y)| {
                        Rectangle::new([(x, y - 4), (x + 14, y + 4)], c.filled())
                    });
            }
            if text {
                chart
                    .configure_series_labels()
                    .background_style(WHITE.mix(0.85))
                    .border_style(BLACK)
                    .position(SeriesLabelPosition::UpperRight)
                    .draw()
                    .map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }
}
