//! The clip curves (p.32 of the stale-samples lecture): the per-token objective against the
//! importance ratio for A = +1 and A = −1, computed by the registered losses themselves on a grid
//! of ratios.

use super::{Figure, save};
use crate::Result;
use burn::tensor::{Device, Tensor, TensorData};
use plotters::coord::Shift;
use plotters::prelude::*;
use rlft_algo::loss::{LossContext, LossRegistry, LossValue, PolicyLossConfig, PolicyLossInput};
use std::path::{Path, PathBuf};

/// One panel: a loss (with a setting) and its objective for A = +1 and A = −1.
#[derive(Debug, Clone)]
pub struct ClipCurve {
    /// Panel title.
    pub title: String,
    /// `(ratio, objective)` for A = +1.
    pub positive: Vec<(f64, f64)>,
    /// `(ratio, objective)` for A = −1.
    pub negative: Vec<(f64, f64)>,
}

/// A loss that has no per-token objective to draw, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotDrawn {
    /// The loss or preset.
    pub loss: String,
    /// Why.
    pub reason: String,
}

/// Ratios drawn: 0.05 to 3 in 0.01 steps.
fn grid() -> Vec<f64> {
    (5..=300).map(|i| i as f64 / 100.0).collect()
}

/// The objective (−per-token loss) of loss `name` with `config` at each ratio of the grid for
/// advantage `adv`, at response position `position` (1-based): the tokens before it have ratio
/// 1, so a cumulative ratio equals the last token's.
fn objective(
    registry: &LossRegistry,
    name: &str,
    config: &PolicyLossConfig,
    adv: f32,
    position: usize,
    device: &Device,
) -> Result<Vec<(f64, f64)>> {
    let ratios = grid();
    let (n, t) = (ratios.len(), position);
    let mut lp = vec![0f32; n * t];
    for (i, r) in ratios.iter().enumerate() {
        lp[i * t + t - 1] = r.ln() as f32;
    }
    let tensor = |v: Vec<f32>| Tensor::<2>::from_data(TensorData::new(v, [n, t]), device);
    let input = PolicyLossInput::new(
        tensor(lp),
        tensor(vec![0.0; n * t]),
        tensor(vec![adv; n * t]),
        tensor(vec![1.0; n * t]),
    );
    let terms = registry.get(name)?.terms(&LossContext {
        input: &input,
        config,
    })?;
    let LossValue::PerToken { loss, .. } = terms.value else {
        return Err(crate::TrainError::Usage(format!(
            "loss {name} reduces the batch itself: no per-token objective to draw"
        )));
    };
    let values: Vec<f32> = loss
        .slice([0..n, t - 1..t])
        .into_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .map_err(|e| crate::TrainError::Usage(format!("{e:?}")))?;
    Ok(ratios
        .into_iter()
        .zip(values)
        .map(|(r, l)| (r, -l as f64))
        .collect())
}

/// Every registered loss and preset that has a per-token objective, with its preset's settings
/// (`dapo`: Clip-Higher), PPO with a dual clip, and CTPO at several positions; and those that
/// cannot be drawn, with the reason.
pub fn clip_curves(registry: &LossRegistry) -> Result<(Vec<ClipCurve>, Vec<NotDrawn>)> {
    let device = rlft_model::device::resolve(None)?;
    let mut panels: Vec<(String, String, PolicyLossConfig, usize)> = Vec::new();
    let mut skipped = Vec::new();
    for name in registry.names() {
        if registry.is_batch_coupled(&name)? {
            skipped.push(NotDrawn {
                loss: name,
                reason: "batch-coupled: it picks tokens by covariance statistics over the batch, \
                         so one token's objective is not a function of its ratio alone"
                    .into(),
            });
            continue;
        }
        let c = registry.resolve(&name)?.config;
        let eps = if c.clip_ratio_low == c.clip_ratio_high {
            format!("ε {}", c.clip_ratio_low)
        } else {
            format!("ε {} / {}", c.clip_ratio_low, c.clip_ratio_high)
        };
        match name.as_str() {
            "ppo" => {
                panels.push((format!("ppo ({eps})"), name.clone(), c.clone(), 1));
                panels.push((
                    format!("ppo dual clip (c = 3, {eps})"),
                    name.clone(),
                    c.with_dual_clip(Some(3.0)),
                    1,
                ));
            }
            "ctpo" => {
                for t in [1, 16, 256] {
                    panels.push((format!("ctpo at position {t}"), name.clone(), c.clone(), t));
                }
            }
            _ => panels.push((format!("{name} ({eps})"), name.clone(), c, 1)),
        }
    }
    let mut curves = Vec::new();
    for (title, name, config, t) in panels {
        match (
            objective(registry, &name, &config, 1.0, t, &device),
            objective(registry, &name, &config, -1.0, t, &device),
        ) {
            (Ok(positive), Ok(negative)) => curves.push(ClipCurve {
                title,
                positive,
                negative,
            }),
            (Err(e), _) | (_, Err(e)) => skipped.push(NotDrawn {
                loss: name,
                reason: e.to_string(),
            }),
        }
    }
    Ok((curves, skipped))
}

/// The panels in a grid.
struct ClipFigure(Vec<ClipCurve>);

const COLS: usize = 4;

impl Figure for ClipFigure {
    fn size(&self) -> (u32, u32) {
        (1400, 300 * self.0.len().div_ceil(COLS).max(1) as u32)
    }

    fn draw<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
        text: bool,
    ) -> std::result::Result<(), String> {
        let rows = self.0.len().div_ceil(COLS).max(1);
        let areas = root.split_evenly((rows, COLS));
        for (area, c) in areas.iter().zip(&self.0) {
            let ys = c.positive.iter().chain(&c.negative).map(|p| p.1);
            let (lo, hi) = ys.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), y| {
                (a.min(y), b.max(y))
            });
            let (lo, hi) = (lo.max(-4.0) - 0.1, hi.min(4.0) + 0.1);
            let mut b = ChartBuilder::on(area);
            b.margin(8);
            if text {
                b.caption(&c.title, ("sans-serif", 16))
                    .x_label_area_size(24)
                    .y_label_area_size(36);
            }
            let mut chart = b
                .build_cartesian_2d(0.0..3.0, lo..hi)
                .map_err(|e| e.to_string())?;
            let mut mesh = chart.configure_mesh();
            if !text {
                mesh.x_labels(0).y_labels(0);
            }
            mesh.draw().map_err(|e| e.to_string())?;
            let clamp = |pts: &[(f64, f64)]| -> Vec<(f64, f64)> {
                pts.iter().map(|&(x, y)| (x, y.clamp(lo, hi))).collect()
            };
            chart
                .draw_series(LineSeries::new(clamp(&c.positive), BLUE.stroke_width(2)))
                .map_err(|e| e.to_string())?
                .label("A = +1")
                .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], BLUE));
            chart
                .draw_series(LineSeries::new(clamp(&c.negative), RED.stroke_width(2)))
                .map_err(|e| e.to_string())?
                .label("A = -1")
                .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], RED));
            if text {
                chart
                    .configure_series_labels()
                    .background_style(WHITE.mix(0.8))
                    .border_style(BLACK)
                    .draw()
                    .map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }
}

/// Writes `clip_curves.png` and `.svg` into `out_dir`; returns the files and the losses not
/// drawn, with the reason.
pub fn write_clip_curves(
    registry: &LossRegistry,
    out_dir: &Path,
) -> Result<(Vec<PathBuf>, Vec<NotDrawn>)> {
    let (curves, skipped) = clip_curves(registry)?;
    std::fs::create_dir_all(out_dir).map_err(crate::io_err(out_dir))?;
    let files = save(&ClipFigure(curves), out_dir, "clip_curves")?;
    Ok((files, skipped))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(curve: &[(f64, f64)], r: f64) -> f64 {
        curve.iter().find(|p| (p.0 - r).abs() < 1e-9).unwrap().1
    }

    #[test]
    fn ppo_clips_where_the_stale_samples_lecture_says() {
        let (curves, skipped) = clip_curves(&LossRegistry::with_builtins()).unwrap();
        let ppo = curves.iter().find(|c| c.title == "ppo (ε 0.2)").unwrap();
        // A = +1: r up to 1.2, then flat at 1.2.
        assert!((at(&ppo.positive, 1.1) - 1.1).abs() < 1e-5);
        assert!((at(&ppo.positive, 2.0) - 1.2).abs() < 1e-5);
        // A = −1: −max(r, 0.8) · 1 … flat at −0.8 below 0.8, −r above.
        assert!((at(&ppo.negative, 0.5) + 0.8).abs() < 1e-5);
        assert!((at(&ppo.negative, 2.0) + 2.0).abs() < 1e-5);
        let dual = curves.iter().find(|c| c.title.contains("dual")).unwrap();
        assert!((at(&dual.negative, 2.9) + 2.9).abs() < 1e-4);
        assert!((at(&dual.negative, 3.0 - 0.01) - at(&dual.negative, 2.99)).abs() < 1e-9);
        assert!(at(&dual.negative, 3.0) >= -3.0 - 1e-4, "capped at −c");
        let higher = curves.iter().find(|c| c.title.starts_with("dapo")).unwrap();
        assert!((at(&higher.positive, 2.0) - 1.28).abs() < 1e-5);
        assert!(skipped.iter().any(|n| n.loss == "clip_cov"));
        assert!(curves.iter().any(|c| c.title == "ctpo at position 256"));
    }
}
