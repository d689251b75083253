//! The figures drawn from `metrics.jsonl`: the cumulative-ratio fan by token position (the
//! stale-samples lecture's Fig. 1) with CTPO's position-dependent bounds, the staleness histogram
//! over the run, and the importance-weight and mismatch-KL curves.

use super::Figure;
use crate::metrics::StepMetrics;
use plotters::coord::Shift;
use plotters::prelude::*;
use rlft_algo::clip::CtpoBounds;
use std::collections::BTreeMap;

type Res = std::result::Result<(), String>;

/// Named curves: (name, points (step, value)).
type Curves = Vec<(String, Vec<(f64, f64)>)>;

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Finite `(step, value)` of `key` over the rows.
fn series(rows: &[StepMetrics], key: &str) -> Vec<(f64, f64)> {
    rows.iter()
        .filter_map(|m| {
            let step = m.get("step")?.as_f64()?;
            let v = m.get(key)?.as_f64().filter(|v| v.is_finite())?;
            Some((step, v))
        })
        .collect()
}

/// `(min, max)` of values, widened when flat.
fn range(vals: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = vals.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
        (a.min(v), b.max(v))
    });
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    let pad = ((hi - lo) * 0.05).max(1e-9);
    (lo - pad, hi + pad)
}

const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// Quantiles of the cumulative log-ratio `log Π π/μ` against μ by response position, averaged
/// over the run's steps (from `offpolicy/pos/cum/<lo>-<hi>/p<q>`).
pub(crate) struct RatioFan {
    /// Per position bucket (its last position): quantile → mean value.
    buckets: Vec<(f64, BTreeMap<u32, f64>)>,
    bounds: CtpoBounds,
}

impl RatioFan {
    pub(crate) fn from_metrics(rows: &[StepMetrics]) -> Option<Self> {
        // (hi, q) → (sum, count)
        let mut acc: BTreeMap<(u64, u32), (f64, f64)> = BTreeMap::new();
        for m in rows {
            for (k, v) in m {
                let Some(rest) = k.strip_prefix("offpolicy/pos/cum/") else {
                    continue;
                };
                let Some((span, q)) = rest.split_once("/p") else {
                    continue;
                };
                let (Some(hi), Ok(q), Some(v)) = (
                    span.split_once('-')
                        .and_then(|(_, h)| h.parse::<u64>().ok()),
                    q.parse::<u32>(),
                    v.as_f64().filter(|v| v.is_finite()),
                ) else {
                    continue;
                };
                let e = acc.entry((hi, q)).or_default();
                e.0 += v;
                e.1 += 1.0;
            }
        }
        if acc.is_empty() {
            return None;
        }
        let mut buckets: BTreeMap<u64, BTreeMap<u32, f64>> = BTreeMap::new();
        for ((hi, q), (sum, n)) in acc {
            buckets.entry(hi).or_default().insert(q, sum / n);
        }
        Some(Self {
            buckets: buckets
                .into_iter()
                .map(|(hi, qs)| (hi as f64, qs))
                .collect(),
            bounds: CtpoBounds::default(),
        })
    }

    fn quantile(&self, q: u32) -> Vec<(f64, f64)> {
        self.buckets
            .iter()
            .filter_map(|(x, qs)| Some((*x, *qs.get(&q)?)))
            .collect()
    }
}

impl Figure for RatioFan {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>, text: bool) -> Res {
        let x1 = self.buckets.last().map_or(8.0, |b| b.0);
        let bound = |t: f64, c: f64| c * t.powf(self.bounds.power);
        let (mut y0, mut y1) = range(self.buckets.iter().flat_map(|(_, qs)| qs.values().copied()));
        y0 = y0.min(-bound(x1, self.bounds.c_low) * 1.1);
        y1 = y1.max(bound(x1, self.bounds.c_high) * 1.1);
        let mut b = ChartBuilder::on(root);
        b.margin(14);
        if text {
            b.caption(
                "cumulative log-ratio log Π π/μ by token position (mean over steps)",
                ("sans-serif", 20),
            )
            .x_label_area_size(36)
            .y_label_area_size(64);
        }
        let mut chart = b
            .build_cartesian_2d((1f64..x1.max(2.0)).log_scale(), y0..y1)
            .map_err(err)?;
        let mut mesh = chart.configure_mesh();
        mesh.x_labels(8);
        if text {
            mesh.x_desc("response position (end of bucket)");
        } else {
            mesh.x_labels(0).y_labels(0);
        }
        mesh.draw().map_err(err)?;
        let band = |lo: u32, hi: u32| -> Vec<(f64, f64)> {
            let mut pts = self.quantile(hi);
            pts.extend(self.quantile(lo).into_iter().rev());
            pts
        };
        let blue = PALETTE[0];
        for (lo, hi, alpha, label) in [(5, 95, 0.15, "p5–p95"), (25, 75, 0.3, "p25–p75")] {
            let pts = band(lo, hi);
            if pts.len() >= 4 {
                chart
                    .draw_series(std::iter::once(Polygon::new(pts, blue.mix(alpha).filled())))
                    .map_err(err)?
                    .label(label)
                    .legend(move |(x, y)| {
                        Rectangle::new([(x, y - 4), (x + 14, y + 4)], blue.mix(alpha).filled())
                    });
            }
        }
        chart
            .draw_series(LineSeries::new(self.quantile(50), blue.stroke_width(2)))
            .map_err(err)?
            .label("median")
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 14, y)], blue));
        // Every quantile as a marker too, so that a run with one position bucket still shows
        // its spread.
        for q in [5, 25, 50, 75, 95] {
            chart
                .draw_series(
                    self.quantile(q)
                        .into_iter()
                        .map(|p| Circle::new(p, if q == 50 { 4 } else { 3 }, blue.filled())),
                )
                .map_err(err)?;
        }
        let red = PALETTE[3];
        let ts: Vec<f64> = (0..=64)
            .map(|i| (x1.max(2.0).ln() * f64::from(i) / 64.0).exp())
            .collect();
        for (c, sign, label) in [
            (self.bounds.c_high, 1.0, "CTPO bounds ±c·t^p (defaults)"),
            (self.bounds.c_low, -1.0, ""),
        ] {
            let s = chart
                .draw_series(LineSeries::new(
                    ts.iter().map(|&t| (t, sign * bound(t, c))),
                    red.stroke_width(1),
                ))
                .map_err(err)?;
            if !label.is_empty() {
                s.label(label)
                    .legend(move |(x, y)| PathElement::new([(x, y), (x + 14, y)], red));
            }
        }
        if text {
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .position(SeriesLabelPosition::UpperLeft)
                .draw()
                .map_err(err)?;
        }
        Ok(())
    }
}

/// A figure a run has no data for: its title and why, so that `plot` always writes every
/// picture and says what is missing.
pub(crate) struct NoData {
    /// What the figure would show.
    pub title: &'static str,
    /// Why it cannot, and how to get it.
    pub reason: &'static str,
}

impl Figure for NoData {
    fn size(&self) -> (u32, u32) {
        (900, 200)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>, text: bool) -> Res {
        root.draw(&Rectangle::new(
            [(10, 10), (890, 190)],
            BLACK.stroke_width(1),
        ))
        .map_err(err)?;
        if text {
            root.draw(&Text::new(self.title, (30, 50), ("sans-serif", 22)))
                .map_err(err)?;
            root.draw(&Text::new(self.reason, (30, 110), ("sans-serif", 15)))
                .map_err(err)?;
        }
        Ok(())
    }
}

/// The fraction of each step's groups with staleness 0, 1, …, η and over η (stacked).
pub(crate) struct StalenessHist {
    /// (label, per step (step, fraction)).
    classes: Curves,
}

impl StalenessHist {
    pub(crate) fn from_metrics(rows: &[StepMetrics]) -> Option<Self> {
        let mut ks: Vec<u64> = rows
            .iter()
            .flat_map(|m| m.keys())
            .filter_map(|k| k.strip_prefix("staleness/hist/")?.parse().ok())
            .collect();
        ks.sort_unstable();
        ks.dedup();
        if ks.is_empty() {
            return None;
        }
        let mut classes: Curves = ks
            .iter()
            .map(|k| (k.to_string(), series(rows, &format!("staleness/hist/{k}"))))
            .collect();
        classes.push(("over η".into(), series(rows, "staleness/hist/over")));
        Some(Self { classes })
    }
}

impl Figure for StalenessHist {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>, text: bool) -> Res {
        let steps: Vec<f64> = self
            .classes
            .iter()
            .flat_map(|(_, s)| s.iter().map(|p| p.0))
            .collect();
        let (x0, x1) = (
            steps.iter().copied().fold(f64::INFINITY, f64::min),
            steps.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        );
        let mut b = ChartBuilder::on(root);
        b.margin(14);
        if text {
            b.caption(
                "staleness of the consumed groups (fraction per step)",
                ("sans-serif", 20),
            )
            .x_label_area_size(36)
            .y_label_area_size(56);
        }
        let mut chart = b
            .build_cartesian_2d((x0 - 0.5)..(x1.max(x0) + 0.5), 0f64..1.0)
            .map_err(err)?;
        let mut mesh = chart.configure_mesh();
        if text {
            mesh.x_desc("step").y_desc("fraction of groups");
        } else {
            mesh.x_labels(0).y_labels(0);
        }
        mesh.draw().map_err(err)?;
        // Stacked bars: each step's classes on top of one another.
        let mut base: BTreeMap<i64, f64> = BTreeMap::new();
        for (i, (label, pts)) in self.classes.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            let bars: Vec<Rectangle<(f64, f64)>> = pts
                .iter()
                .filter(|p| p.1 > 0.0)
                .map(|&(step, f)| {
                    let b0 = base.entry(step as i64).or_default();
                    let r =
                        Rectangle::new([(step - 0.4, *b0), (step + 0.4, *b0 + f)], color.filled());
                    *b0 += f;
                    r
                })
                .collect();
            chart
                .draw_series(bars)
                .map_err(err)?
                .label(format!("staleness {label}"))
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 4), (x + 14, y + 4)], color.filled())
                });
        }
        if text {
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .position(SeriesLabelPosition::LowerRight)
                .draw()
                .map_err(err)?;
        }
        Ok(())
    }
}

/// Mismatch KL between μ and the policy it is compared with, and the importance weights.
pub(crate) struct OffPolicy {
    kl: Curves,
    is: Curves,
}

impl OffPolicy {
    pub(crate) fn from_metrics(rows: &[StepMetrics]) -> Option<Self> {
        let pick = |keys: &[&str]| -> Curves {
            keys.iter()
                .map(|k| (k.to_string(), series(rows, &format!("offpolicy/{k}"))))
                .filter(|(_, s)| !s.is_empty())
                .collect()
        };
        let kl = pick(&["kl", "k3_kl"]);
        let is = pick(&[
            "rollout_is_mean",
            "rollout_is_eff_sample_size",
            "rollout_is_max",
            "rollout_is_min",
        ]);
        (!kl.is_empty() || !is.is_empty()).then_some(Self { kl, is })
    }
}

fn curves<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    lines: &Curves,
    text: bool,
) -> Res {
    let all: Vec<(f64, f64)> = lines.iter().flat_map(|(_, s)| s.iter().copied()).collect();
    let (x0, x1) = range(all.iter().map(|p| p.0));
    let (y0, y1) = range(all.iter().map(|p| p.1));
    let mut b = ChartBuilder::on(area);
    b.margin(12);
    if text {
        b.caption(title, ("sans-serif", 18))
            .x_label_area_size(32)
            .y_label_area_size(72);
    }
    let mut chart = b.build_cartesian_2d(x0..x1, y0..y1).map_err(err)?;
    let mut mesh = chart.configure_mesh();
    if text {
        mesh.x_desc("step");
    } else {
        mesh.x_labels(0).y_labels(0);
    }
    mesh.draw().map_err(err)?;
    for (i, (name, pts)) in lines.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
            .map_err(err)?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 14, y)], color));
    }
    if text && !lines.is_empty() {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(err)?;
    }
    Ok(())
}

impl OffPolicy {
    /// The panels with data: (title, curves).
    fn panels(&self) -> Vec<(&str, &Curves)> {
        [
            ("mismatch KL between μ and π (offpolicy/*)", &self.kl),
            ("importance weights π/μ (offpolicy/*)", &self.is),
        ]
        .into_iter()
        .filter(|(_, c)| !c.is_empty())
        .collect()
    }
}

impl Figure for OffPolicy {
    fn size(&self) -> (u32, u32) {
        (900, 380 * self.panels().len() as u32)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>, text: bool) -> Res {
        let panels = self.panels();
        for ((title, lines), area) in panels.iter().zip(root.split_evenly((panels.len(), 1))) {
            curves(&area, title, lines, text)?;
        }
        Ok(())
    }
}
