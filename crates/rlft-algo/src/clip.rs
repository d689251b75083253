//! Clip settings: symmetric ε, decoupled ε_low/ε_high (Clip-Higher), dual clip, and CTPO's
//! position-adaptive log-space bounds.

use crate::ratio::valid_count_so_far;
use crate::{AlgoError, Result};
use burn::tensor::{Bool, Tensor};
use serde::{Deserialize, Serialize};

/// The trust region `ρ ∈ [1 − low, 1 + high]` of PPO-style clipping, plus the optional dual
/// clip `c` that caps the loss of negative-advantage tokens at `−A·c`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ClipRange {
    /// ε_low: the ratio is clipped below at `1 − low`.
    pub low: f64,
    /// ε_high: the ratio is clipped above at `1 + high` (DAPO's Clip-Higher raises it to 0.28).
    pub high: f64,
    /// Dual-clip constant `c > 1` for `A < 0` (None: off).
    pub dual: Option<f64>,
}

impl ClipRange {
    /// `[1 − ε, 1 + ε]`, no dual clip.
    pub fn symmetric(eps: f64) -> Self {
        Self {
            low: eps,
            high: eps,
            dual: None,
        }
    }

    /// Decoupled bounds `[1 − low, 1 + high]`, no dual clip.
    pub fn decoupled(low: f64, high: f64) -> Self {
        Self {
            low,
            high,
            dual: None,
        }
    }

    /// Adds the dual clip `c`.
    pub fn with_dual(mut self, c: Option<f64>) -> Self {
        self.dual = c;
        self
    }

    /// Checks `0 ≤ low < 1`, `high ≥ 0`, `c > 1 + high` ... and, when `require_ordered`,
    /// `high ≥ low` (Clip-Higher never lowers the upper bound).
    pub fn validate(&self, require_ordered: bool) -> Result<()> {
        if !(self.low.is_finite() && (0.0..=1.0).contains(&self.low)) {
            return Err(AlgoError::InvalidSetting {
                name: "clip_ratio_low",
                value: self.low,
                allowed: "must be in [0, 1] (the ratio is clipped below at 1 - clip_ratio_low)",
            });
        }
        if !(self.high.is_finite() && self.high >= 0.0) {
            return Err(AlgoError::InvalidSetting {
                name: "clip_ratio_high",
                value: self.high,
                allowed: "must be finite and >= 0",
            });
        }
        if require_ordered && self.high < self.low {
            return Err(AlgoError::InvalidSetting {
                name: "clip_ratio_high",
                value: self.high,
                allowed: "must be >= clip_ratio_low for this loss (Clip-Higher raises the upper bound)",
            });
        }
        if let Some(c) = self.dual
            && (c <= 1.0 || c.is_nan())
        {
            return Err(AlgoError::InvalidSetting {
                name: "dual_clip",
                value: c,
                allowed: "must be > 1 (typical: 3.0), or unset to switch dual clipping off",
            });
        }
        Ok(())
    }
}

/// CTPO's position-adaptive bounds in log space: at response position `t` (1-based, counting the
/// row's valid tokens, as the CTPO authors do) the log ratio is clipped to
/// `[−c_low·s_t, c_high·s_t]` with `s_t = t^p`, and negative-advantage tokens are dual-clipped at
/// `exp(c_dual·s_t)`. Later tokens, whose cumulative ratios spread more, get wider bounds
/// (`p = 0.5` suits products, whose log variance grows like `t`; `p = −0.5` geometric means).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CtpoBounds {
    /// Lower log-space coefficient.
    pub c_low: f64,
    /// Upper log-space coefficient.
    pub c_high: f64,
    /// Dual-clip log-space coefficient.
    pub c_dual: f64,
    /// Power `p` of the position.
    pub power: f64,
}

impl Default for CtpoBounds {
    fn default() -> Self {
        Self {
            c_low: 0.025,
            c_high: 0.05,
            c_dual: 0.05,
            power: 0.5,
        }
    }
}

impl CtpoBounds {
    /// Checks every coefficient is finite and ≥ 0 (`c_dual` > 0), the power finite.
    pub fn validate(&self) -> Result<()> {
        for (name, v) in [
            ("ctpo.c_low", self.c_low),
            ("ctpo.c_high", self.c_high),
            ("ctpo.c_dual", self.c_dual),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(AlgoError::InvalidSetting {
                    name,
                    value: v,
                    allowed: "CTPO coefficients must be finite and >= 0 (defaults 0.025, 0.05, 0.05, p = 0.5)",
                });
            }
        }
        if !self.power.is_finite() {
            return Err(AlgoError::InvalidSetting {
                name: "ctpo.power",
                value: self.power,
                allowed: "must be finite (0.5 for cumulative products, -0.5 for geometric means)",
            });
        }
        if self.c_dual == 0.0 {
            return Err(AlgoError::InvalidSetting {
                name: "ctpo.c_dual",
                value: 0.0,
                allowed: "must be > 0 so the dual bound exp(c_dual·t^p) exceeds 1",
            });
        }
        Ok(())
    }

    /// The scale `s_t = max(t, 1)^p` at every position, `t` counting the row's valid tokens.
    ///
    /// # Shapes
    /// - `mask`: `[batch, T]` → `[batch, T]`
    pub fn scale(&self, mask: &Tensor<2>) -> Tensor<2> {
        valid_count_so_far(mask)
            .clamp_min(1.0)
            .powf_scalar(self.power)
    }

    /// The ratio bounds `(exp(−c_low·s_t), exp(c_high·s_t), exp(c_dual·s_t))`.
    ///
    /// # Shapes
    /// - `mask`: `[batch, T]` → three `[batch, T]`
    pub fn ratio_bounds(&self, mask: &Tensor<2>) -> (Tensor<2>, Tensor<2>, Tensor<2>) {
        let tp = self.scale(mask);
        let lo = (tp.clone() * (-self.c_low)).exp();
        let hi = (tp.clone() * self.c_high).exp();
        let dual = (tp * self.c_dual).exp();
        (lo, hi, dual)
    }
}

/// Ratio bounds resolved for one batch, broadcast over `[batch, T]`: `[1, 1]` for a fixed clip
/// range, `[batch, T]` for CTPO's position-adaptive bounds.
#[derive(Debug, Clone)]
pub(crate) struct Bounds {
    lo: Tensor<2>,
    hi: Tensor<2>,
    dual: Option<Tensor<2>>,
}

impl Bounds {
    /// Fixed bounds `[1 − low, 1 + high]` (and `c`) in the dtype and on the device of `like`.
    pub(crate) fn from_range(r: &ClipRange, like: &Tensor<2>) -> Self {
        let scalar = |v: f64| crate::masked::from_host(vec![v], [1, 1], like);
        Bounds {
            lo: scalar(1.0 - r.low),
            hi: scalar(1.0 + r.high),
            dual: r.dual.map(scalar),
        }
    }

    /// CTPO's bounds at every position of `mask`.
    pub(crate) fn position_adaptive(b: &CtpoBounds, mask: &Tensor<2>) -> Self {
        let (lo, hi, dual) = b.ratio_bounds(mask);
        Bounds {
            lo,
            hi,
            dual: Some(dual),
        }
    }

    /// `clip(ρ, lo, hi)` (gradient passes inside the band).
    pub(crate) fn clip(&self, ratio: Tensor<2>) -> Tensor<2> {
        let dims = ratio.dims();
        ratio
            .max_pair(self.lo.clone().expand(dims))
            .min_pair(self.hi.clone().expand(dims))
    }

    /// `ρ` exactly on a bound.
    pub(crate) fn at_bound(&self, ratio: &Tensor<2>) -> Tensor<2, Bool> {
        let dims = ratio.dims();
        ratio
            .clone()
            .equal(self.lo.clone().expand(dims))
            .bool_or(ratio.clone().equal(self.hi.clone().expand(dims)))
    }

    /// `ρ < lo` and `ρ > hi` masks.
    pub(crate) fn outside(&self, ratio: &Tensor<2>) -> (Tensor<2, Bool>, Tensor<2, Bool>) {
        let dims = ratio.dims();
        (
            ratio.clone().lower(self.lo.clone().expand(dims)),
            ratio.clone().greater(self.hi.clone().expand(dims)),
        )
    }

    /// The dual-clip constant `c` broadcast to the shape of `like`, if dual clip is on.
    pub(crate) fn dual(&self, like: &Tensor<2>) -> Option<Tensor<2>> {
        self.dual.clone().map(|c| c.expand(like.dims()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::masked::to_host;
    use burn::tensor::Device;

    #[test]
    fn invalid_clip_settings_are_errors() {
        assert!(ClipRange::symmetric(-0.1).validate(false).is_err());
        assert!(ClipRange::decoupled(0.2, 0.1).validate(true).is_err());
        assert!(ClipRange::decoupled(0.2, 0.1).validate(false).is_ok());
        assert!(
            ClipRange::symmetric(0.2)
                .with_dual(Some(1.0))
                .validate(false)
                .is_err()
        );
        assert!(
            ClipRange::symmetric(0.2)
                .with_dual(Some(3.0))
                .validate(false)
                .is_ok()
        );
        let bad = CtpoBounds {
            c_low: f64::NAN,
            ..Default::default()
        };
        assert!(bad.validate().is_err());
    }

    /// 1.05 per step over 100 steps is ≈ 131.5, but CTPO's bound at t = 100 is
    /// exp(0.05·√100) = e^0.5 ≈ 1.65: the clipped value stays finite and small.
    #[test]
    fn ctpo_bounds_keep_the_product_finite() {
        let like = Tensor::<2>::ones([1, 100], &Device::flex());
        let (lo, hi, _) = CtpoBounds::default().ratio_bounds(&like);
        let hi = to_host(&hi).unwrap();
        let lo = to_host(&lo).unwrap();
        assert!((hi[99] - 0.5f64.exp()).abs() < 1e-5 && (lo[99] - (-0.25f64).exp()).abs() < 1e-5);
        assert!((hi[0] - 0.05f64.exp()).abs() < 1e-6);
        let cum = Tensor::<2>::full([1, 100], 1.05f64.powi(100), &Device::flex());
        let b = Bounds::position_adaptive(&CtpoBounds::default(), &like);
        let clipped = to_host(&b.clip(cum)).unwrap();
        assert!((clipped[99] - 0.5f64.exp()).abs() < 1e-4, "{}", clipped[99]);
    }
}
