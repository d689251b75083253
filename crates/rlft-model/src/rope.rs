//! Llama 3 RoPE scaling in GGUF files. llama.cpp's converter (`convert_hf_to_gguf.py`,
//! `LlamaModel.generate_extra_tensors`) stores a Llama 3.x `rope_scaling` as one divisor per
//! rotary frequency (`rope_freqs.weight`), not as its parameters.
//! [`TransformerConfig::llama3_scaling_from_divisors`] recovers the parameters, so that a model
//! loaded from such a file exports a `config.json` declaring the frequencies it uses; and
//! [`crate::Transformer::save_hf`] refuses to write a `config.json` that would declare others.
//! Reading the divisors from a GGUF file is part of loading it (`crate::load`'s GGUF source).

use crate::{Llama3RopeScaling, ModelError, Result, TransformerConfig};
use std::f64::consts::PI;

/// How closely (relative) a configuration must reproduce a model's RoPE frequencies. The
/// converter computes the divisors in f32 and stores them as f32, which moves them by a few
/// 1e-7; a wrong scaling is off by far more.
pub(crate) const RTOL: f64 = 1e-6;

/// `original_max_position_embeddings` assumed when a GGUF does not record
/// `{arch}.rope.scaling.original_context_length`: Llama 3's, and the converter's default.
pub const LLAMA3_ORIGINAL_CONTEXT: f64 = 8192.0;

impl TransformerConfig {
    /// RoPE inverse frequencies `θ^(−2i/d)` without any scaling.
    pub(crate) fn unscaled_inv_freq(&self) -> Vec<f64> {
        TransformerConfig {
            rope_scaling: None,
            ..self.clone()
        }
        .inv_freq()
    }

    /// llama.cpp's `rope_freqs.weight` for this configuration's Llama 3 scaling, as
    /// `convert_hf_to_gguf.py` computes it (f32 arithmetic, f32 storage): one divisor per
    /// rotary frequency. `None` without a scaling.
    pub(crate) fn llama3_divisors(&self) -> Option<Vec<f32>> {
        let s = self.rope_scaling.as_ref()?;
        let (factor, low, high) = (
            s.factor as f32,
            s.low_freq_factor as f32,
            s.high_freq_factor as f32,
        );
        let (orig, dim) = (
            s.original_max_position_embeddings as f32,
            self.head_dim as f32,
        );
        let divisor = |i: usize| {
            let freq = 1.0 / (self.rope_theta as f32).powf((2 * i) as f32 / dim);
            let wavelen = 2.0 * std::f32::consts::PI / freq;
            if wavelen < orig / high {
                1.0
            } else if wavelen > orig / low {
                factor
            } else {
                let smooth = (orig / wavelen - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor + smooth)
            }
        };
        Some((0..self.head_dim / 2).map(divisor).collect())
    }

    /// The Llama 3 scaling whose frequencies ([`TransformerConfig::inv_freq`]) are this
    /// configuration's unscaled ones divided by `divisors` (llama.cpp's `rope_freqs.weight`, one
    /// per frequency), to within a relative 1e-6. `Ok(None)` when every divisor is 1.
    ///
    /// The divisors fix `low_freq_factor` and `high_freq_factor` only relative to
    /// `original_max_position_embeddings` (scaling all three together changes nothing), so that
    /// one is given: the GGUF's `{arch}.rope.scaling.original_context_length`, or
    /// [`LLAMA3_ORIGINAL_CONTEXT`].
    ///
    /// # Errors
    /// [`ModelError::RopeScaling`] when there are not `head_dim / 2` positive finite divisors, or
    /// when no Llama 3 parameters reproduce them (another scaling scheme).
    pub fn llama3_scaling_from_divisors(
        &self,
        divisors: &[f64],
        original_max_position_embeddings: f64,
    ) -> Result<Option<Llama3RopeScaling>> {
        let err = |msg: String| ModelError::RopeScaling(msg);
        let n = self.head_dim / 2;
        if divisors.len() != n {
            return Err(err(format!(
                "{} RoPE divisors for head_dim {} (expected {n}, one per frequency)",
                divisors.len(),
                self.head_dim
            )));
        }
        if let Some((i, d)) = divisors
            .iter()
            .enumerate()
            .find(|(_, d)| !(d.is_finite() && **d > 0.0))
        {
            return Err(err(format!(
                "RoPE divisor {i} is {d}; divisors must be positive and finite"
            )));
        }
        let orig = original_max_position_embeddings;
        if !(orig.is_finite() && orig > 0.0) {
            return Err(err(format!(
                "original_max_position_embeddings is {orig}; it must be positive"
            )));
        }
        if divisors.iter().all(|d| (d - 1.0).abs() <= RTOL) {
            return Ok(None);
        }
        let base = self.unscaled_inv_freq();
        let target = divide(&base, divisors);
        let factor = divisors.iter().copied().fold(f64::MIN, f64::max);
        if factor <= 1.0 {
            return Err(err(format!(
                "RoPE divisors are at most {factor}, below 1 (they speed rotations up); Llama 3 \
                 scaling only slows them down, so this GGUF uses another scheme"
            )));
        }
        // x = orig / wavelength; Llama 3 interpolates linearly in x between the factors.
        let x: Vec<f64> = base.iter().map(|b| orig * b / (2.0 * PI)).collect();
        let mut best: Option<(f64, usize, Llama3RopeScaling)> = None;
        for (low, high) in factor_candidates(&x, divisors, factor) {
            let snap = |v: f64| (v * 1000.0).round() / 1000.0;
            for (factor, low, high) in [(snap(factor), snap(low), snap(high)), (factor, low, high)]
            {
                if !(low.is_finite() && high.is_finite() && 0.0 < low && low < high) {
                    continue;
                }
                let scaling = Llama3RopeScaling {
                    factor,
                    low_freq_factor: low,
                    high_freq_factor: high,
                    original_max_position_embeddings: orig,
                };
                let cfg = TransformerConfig {
                    rope_scaling: Some(scaling.clone()),
                    ..self.clone()
                };
                let (worst, at) = max_rel_diff(&cfg.inv_freq(), &target);
                if worst <= RTOL {
                    return Ok(Some(scaling));
                }
                if best.as_ref().is_none_or(|b| worst < b.0) {
                    best = Some((worst, at, scaling));
                }
            }
        }
        Err(err(match best {
            Some((worst, i, s)) => format!(
                "the RoPE divisors are not Llama 3 scaling: the closest Llama 3 parameters \
                 (factor {}, low_freq_factor {}, high_freq_factor {}, \
                 original_max_position_embeddings {}) miss frequency {i} by a relative {worst:.2e}",
                s.factor, s.low_freq_factor, s.high_freq_factor, s.original_max_position_embeddings
            ),
            None => format!(
                "the RoPE divisors (from {} to {factor}) are not Llama 3 scaling: no positive \
                 low_freq_factor < high_freq_factor puts them on Llama 3's ramp",
                divisors.iter().copied().fold(f64::MAX, f64::min)
            ),
        }))
    }
}

/// `(low_freq_factor, high_freq_factor)` pairs that may reproduce `divisors` with `factor`,
/// given each frequency's `x = original_max_position_embeddings / wavelength`. A divisor of 1
/// needs `x > high`, `factor` needs `x < low`, and one in between lies on the line
/// `s = (x − low) / (high − low)` with `1/divisor = (1 − s)/factor + s`. Two such points fix
/// the line; with fewer, Llama 3's 1 and 4 are tried first, then values inside the bounds.
fn factor_candidates(x: &[f64], divisors: &[f64], factor: f64) -> Vec<(f64, f64)> {
    let (mut lo, mut hi) = (0.0_f64, f64::INFINITY);
    let mut line = Vec::new();
    for (&x, &d) in x.iter().zip(divisors) {
        if (d - 1.0).abs() <= RTOL {
            hi = hi.min(x);
        } else if (d - factor).abs() <= RTOL * factor {
            lo = lo.max(x);
        } else {
            line.push((x, (1.0 / d - 1.0 / factor) / (1.0 - 1.0 / factor)));
        }
    }
    match line.as_slice() {
        [] => {
            let hi = if hi.is_finite() { hi } else { lo * 64.0 };
            let third = |a: f64, b: f64| a.powf(2.0 / 3.0) * b.powf(1.0 / 3.0);
            vec![(1.0, 4.0), (third(lo, hi), third(hi, lo))]
        }
        &[(x0, s0)] => {
            let high_for = |low: f64| low + (x0 - low) / s0;
            let low = if lo > 0.0 { (lo * x0).sqrt() } else { x0 / 2.0 };
            vec![
                (1.0, high_for(1.0)),
                ((x0 - 4.0 * s0) / (1.0 - s0), 4.0),
                (x0 / (1.0 + 3.0 * s0), 4.0 * x0 / (1.0 + 3.0 * s0)),
                (low, high_for(low)),
            ]
        }
        points => {
            // Least squares s = a·x + b; low = −b/a, high = low + 1/a.
            let n = points.len() as f64;
            let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
            let ms = points.iter().map(|p| p.1).sum::<f64>() / n;
            let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
            let sxs: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - ms)).sum();
            let a = sxs / sxx;
            if !(a.is_finite() && a > 0.0) {
                return Vec::new();
            }
            let low = mx - ms / a;
            vec![(low, low + 1.0 / a)]
        }
    }
}

/// `base[i] / divisors[i]`: the frequencies llama.cpp uses for a file's `rope_freqs.weight`.
pub(crate) fn divide(base: &[f64], divisors: &[f64]) -> Vec<f64> {
    base.iter().zip(divisors).map(|(b, d)| b / d).collect()
}

/// The largest `|a − b| / |b|` and where it is (`(inf, 0)` when the lengths differ).
pub(crate) fn max_rel_diff(a: &[f64], b: &[f64]) -> (f64, usize) {
    if a.len() != b.len() {
        return (f64::INFINITY, 0);
    }
    a.iter()
        .zip(b)
        .map(|(a, b)| (a - b).abs() / b.abs())
        .enumerate()
        .fold(
            (0.0, 0),
            |acc, (i, r)| {
                if r > acc.0 || r.is_nan() { (r, i) } else { acc }
            },
        )
}

/// Checks that `config` declares the RoPE frequencies the model uses (`model_inv_freq`), so an
/// exported `config.json` describes this model.
///
/// # Errors
/// [`ModelError::RopeScaling`] naming the first frequency that differs by more than 1e-6.
pub(crate) fn check_exportable(model_inv_freq: &[f64], config: &TransformerConfig) -> Result<()> {
    let declared = config.inv_freq();
    let (worst, i) = max_rel_diff(model_inv_freq, &declared);
    if worst <= RTOL {
        return Ok(());
    }
    let model = model_inv_freq.get(i).copied().unwrap_or(f64::NAN);
    let declared = declared.get(i).copied().unwrap_or(f64::NAN);
    let scaling = match &config.rope_scaling {
        None => "none".to_string(),
        Some(s) => format!(
            "llama3 (factor {}, low_freq_factor {}, high_freq_factor {}, \
             original_max_position_embeddings {})",
            s.factor, s.low_freq_factor, s.high_freq_factor, s.original_max_position_embeddings
        ),
    };
    Err(ModelError::RopeScaling(format!(
        "the model's RoPE scaling cannot be expressed in an HF config.json: rotary frequency {i} \
         is {model:e} in the model ({} frequencies) but {declared:e} under the config's \
         rope_theta {} and rope_scaling {scaling} ({} frequencies). A GGUF whose \
         rope_freqs.weight is not Llama 3's scaling scheme loads like this. Nothing was \
         exported, since the checkpoint would rotate positions differently; fine-tune from the \
         Hugging Face checkpoint the GGUF was converted from instead, or pass the config this \
         model was built from",
        model_inv_freq.len(),
        config.rope_theta,
        config.head_dim / 2
    )))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn llama3(factor: f64, low: f64, high: f64, orig: f64) -> Llama3RopeScaling {
        Llama3RopeScaling {
            factor,
            low_freq_factor: low,
            high_freq_factor: high,
            original_max_position_embeddings: orig,
        }
    }

    /// A tiny model with Llama 3's θ, the given head width and scaling.
    pub(crate) fn config(head_dim: usize, scaling: Option<Llama3RopeScaling>) -> TransformerConfig {
        TransformerConfig::new(16, 32, 32, 1, 2, 1, head_dim)
            .with_rope_theta(500000.0)
            .with_rope_scaling(scaling)
            .with_max_position_embeddings(131072)
    }

    /// The divisors in f64: unscaled over scaled frequencies, through rlft's own scaling.
    fn exact_divisors(cfg: &TransformerConfig) -> Vec<f64> {
        let base = cfg.unscaled_inv_freq();
        base.iter()
            .zip(cfg.inv_freq())
            .map(|(b, s)| b / s)
            .collect()
    }

    fn assert_close(got: &Llama3RopeScaling, want: &Llama3RopeScaling, tol: f64) {
        for (g, w) in [
            (got.factor, want.factor),
            (got.low_freq_factor, want.low_freq_factor),
            (got.high_freq_factor, want.high_freq_factor),
            (
                got.original_max_position_embeddings,
                want.original_max_position_embeddings,
            ),
        ] {
            assert!((g - w).abs() <= tol, "fitted {got:?}, want {want:?}");
        }
    }

    /// Divisors from `want` (exact, and as the converter writes them) fit back to `want`, and the
    /// fitted scaling reproduces the frequencies.
    fn round_trip(head_dim: usize, want: Llama3RopeScaling) {
        let scaled = config(head_dim, Some(want.clone()));
        let plain = config(head_dim, None);
        let orig = want.original_max_position_embeddings;
        let exact = exact_divisors(&scaled);
        let fit = plain.llama3_scaling_from_divisors(&exact, orig).unwrap();
        let fit = fit.expect("scaled");
        assert_close(&fit, &want, 1e-9);
        let refit = config(head_dim, Some(fit));
        let (worst, _) = max_rel_diff(&refit.inv_freq(), &scaled.inv_freq());
        assert!(worst <= 1e-12, "head_dim {head_dim}: {worst:e}");

        let stored: Vec<f64> = scaled
            .llama3_divisors()
            .expect("scaled config")
            .into_iter()
            .map(f64::from)
            .collect();
        let fit = plain.llama3_scaling_from_divisors(&stored, orig).unwrap();
        let fit = fit.expect("scaled");
        assert_close(&fit, &want, 1e-9);
        let file_freqs = divide(&plain.unscaled_inv_freq(), &stored);
        let (worst, _) = max_rel_diff(&config(head_dim, Some(fit)).inv_freq(), &file_freqs);
        assert!(worst <= RTOL, "head_dim {head_dim}: {worst:e}");
    }

    #[test]
    fn rope_fit_recovers_llama_3_1() {
        for head_dim in [64, 128] {
            round_trip(head_dim, llama3(8.0, 1.0, 4.0, 8192.0));
        }
    }

    #[test]
    fn rope_fit_recovers_llama_3_2() {
        for head_dim in [64, 128] {
            round_trip(head_dim, llama3(32.0, 1.0, 4.0, 8192.0));
        }
    }

    #[test]
    fn rope_fit_recovers_unrounded_parameters() {
        round_trip(128, llama3(7.3, 1.37, 5.1, 8192.0));
    }

    /// Another original context gives other factors with the same frequencies.
    #[test]
    fn rope_fit_with_another_original_context_is_equivalent() {
        let scaled = config(128, Some(llama3(8.0, 1.0, 4.0, 4096.0)));
        let fit = config(128, None)
            .llama3_scaling_from_divisors(&exact_divisors(&scaled), 8192.0)
            .unwrap()
            .expect("scaled");
        assert_close(&fit, &llama3(8.0, 2.0, 8.0, 8192.0), 1e-9);
    }

    /// Small heads leave one frequency or none between the plateaus, too few to fix the ramp:
    /// Llama 3's own factors are preferred, and any fit reproduces the frequencies (Llama 4's
    /// `low_freq_factor == high_freq_factor` step included).
    #[test]
    fn rope_fit_with_few_ramp_points() {
        for (head_dim, want, exact) in [
            (8, llama3(8.0, 1.0, 4.0, 8192.0), true),
            (16, llama3(8.0, 1.0, 4.0, 8192.0), true),
            (32, llama3(32.0, 1.0, 4.0, 8192.0), true),
            (8, llama3(16.0, 1.0, 1.0, 8192.0), false),
            (64, llama3(16.0, 1.0, 1.0, 8192.0), false),
        ] {
            let scaled = config(head_dim, Some(want.clone()));
            let fit = config(head_dim, None)
                .llama3_scaling_from_divisors(&exact_divisors(&scaled), 8192.0)
                .unwrap()
                .expect("scaled");
            if exact {
                assert_eq!(fit, want);
            }
            let (worst, _) =
                max_rel_diff(&config(head_dim, Some(fit)).inv_freq(), &scaled.inv_freq());
            assert!(worst <= 1e-12, "head_dim {head_dim}, {want:?}: {worst:e}");
        }
    }

    #[test]
    fn rope_fit_of_unit_divisors_is_no_scaling() {
        let plain = config(64, None);
        assert_eq!(
            plain
                .llama3_scaling_from_divisors(&[1.0; 32], 8192.0)
                .unwrap(),
            None
        );
    }

    /// A ramp in the frequency index (not in 1/wavelength) and divisors below 1 are other
    /// schemes; a wrong count is an error too.
    #[test]
    fn rope_fit_rejects_other_schemes() {
        let plain = config(64, None);
        let e = plain
            .llama3_scaling_from_divisors(&ramp(32), 8192.0)
            .unwrap_err();
        assert!(e.to_string().contains("not Llama 3 scaling"), "{e}");
        let e = plain
            .llama3_scaling_from_divisors(&[0.5; 32], 8192.0)
            .unwrap_err();
        assert!(e.to_string().contains("below 1"), "{e}");
        let e = plain
            .llama3_scaling_from_divisors(&[1.0; 31], 8192.0)
            .unwrap_err();
        assert!(e.to_string().contains("expected 32"), "{e}");
    }

    /// Divisors rising linearly with the frequency index, from 1 to 8.
    pub(crate) fn ramp(n: usize) -> Vec<f64> {
        (0..n)
            .map(|i| 1.0 + 7.0 * i as f64 / (n - 1) as f64)
            .collect()
    }
}
