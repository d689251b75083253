//! The staleness numbers of the stale-samples lecture (docs/stale-samples.md, "The lecture"),
//! computed with rlft-algo.
//!
//! ```text
//! cargo run --release --example staleness_numbers
//! ```

use anyhow::Result;
use burn::tensor::{DType, Device, Tensor, TensorData};
use rlft::algo::clip::CtpoBounds;
use rlft::algo::masked::to_host;
use rlft::algo::ratio::{RatioLevel, log_ratio};

fn row(values: &[f64], device: &Device) -> Tensor<2> {
    Tensor::from_data(
        TensorData::new(values.to_vec(), [1, values.len()]),
        (device, DType::F64),
    )
}

/// `ρ` at `level` for one trajectory given per-step probabilities under πθ and μ.
fn ratios(p_theta: &[f64], p_mu: &[f64], level: RatioLevel, device: &Device) -> Result<Vec<f64>> {
    let lp = row(&p_theta.iter().map(|p| p.ln()).collect::<Vec<_>>(), device);
    let mu = row(&p_mu.iter().map(|p| p.ln()).collect::<Vec<_>>(), device);
    let mask = lp.ones_like();
    Ok(to_host(
        &log_ratio(lp, mu, &mask, level, false, Default::default()).exp(),
    )?)
}

fn main() -> Result<()> {
    let device = rlft::device::parse("flex")?;
    println!("{:<58} {:>12}", "quantity", "value");
    println!("{}", "-".repeat(71));

    let r = ratios(&[0.70, 0.20], &[0.40, 0.40], RatioLevel::Token, &device)?;
    println!(
        "{:<58} {:>12.4}",
        "token ratio, 'Check None explicitly' 0.70/0.40", r[0]
    );
    println!(
        "{:<58} {:>12.4}",
        "token ratio, 'Use get(..., 3)' 0.20/0.40", r[1]
    );

    // History step 0.10 vs 0.40, then a step both policies agree on (0.5 vs 0.5).
    let tok = ratios(&[0.10, 0.5], &[0.40, 0.5], RatioLevel::Token, &device)?;
    let cum = ratios(&[0.10, 0.5], &[0.40, 0.5], RatioLevel::Cumulative, &device)?;
    println!(
        "{:<58} {:>12.4}",
        "next-step token ratio (structural blindness)", tok[1]
    );
    println!(
        "{:<58} {:>12.4}",
        "next-step cumulative ratio (sees the 0.10/0.40 history)", cum[1]
    );

    let steps = 100;
    let cum = ratios(
        &vec![1.05; steps],
        &vec![1.0; steps],
        RatioLevel::Cumulative,
        &device,
    )?;
    println!(
        "{:<58} {:>12.4}",
        "cumulative ratio after 100 steps of 1.05",
        cum[steps - 1]
    );
    let mask = Tensor::<2>::ones([1, steps], (&device, DType::F64));
    let (lo, hi, dual) = CtpoBounds::default().ratio_bounds(&mask);
    let (lo, hi, dual) = (to_host(&lo)?, to_host(&hi)?, to_host(&dual)?);
    let clipped = cum[steps - 1].clamp(lo[steps - 1], hi[steps - 1]);
    println!(
        "{:<58} {:>12.4}",
        "CTPO bounds at t = 100: lower exp(-0.025*sqrt(t))",
        lo[steps - 1]
    );
    println!(
        "{:<58} {:>12.4}",
        "                        upper exp(0.05*sqrt(t))",
        hi[steps - 1]
    );
    println!(
        "{:<58} {:>12.4}",
        "                        dual  exp(0.05*sqrt(t))",
        dual[steps - 1]
    );
    println!(
        "{:<58} {:>12.4}",
        "CTPO-clipped cumulative ratio at t = 100", clipped
    );
    Ok(())
}
