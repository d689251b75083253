//! Masked reductions and small tensor helpers shared by the rest of the crate.

use crate::{AlgoError, Result};
use burn::tensor::{Bool, Tensor, TensorData};

/// Guard added to masked counts, as verl's `masked_mean` does (`Σ x·m / (Σ m + 1e-8)`).
pub const COUNT_EPS: f64 = 1e-8;

/// Fails with [`AlgoError::ShapeMismatch`] unless `t` has the shape `dims`.
pub fn check_shape<const D: usize>(
    name: &'static str,
    t: &Tensor<D>,
    dims: [usize; D],
    what: &str,
) -> Result<()> {
    let got = t.dims();
    if got != dims {
        return Err(AlgoError::ShapeMismatch {
            name,
            expected: format!("{what} is {dims:?}"),
            got: got.to_vec(),
        });
    }
    Ok(())
}

/// `true` where the mask selects a token (mask > 0.5).
pub fn valid(mask: &Tensor<2>) -> Tensor<2, Bool> {
    mask.clone().greater_elem(0.5)
}

/// Replaces the values at unmasked positions with `0`, with a zero gradient there.
///
/// Padded positions may hold finite garbage (or even ±inf); after this they cannot reach a loss
/// or a gradient.
pub fn zero_padding(x: Tensor<2>, mask: &Tensor<2>) -> Tensor<2> {
    x.mask_fill(valid(mask).bool_not(), 0.0)
}

/// `Σ x·m` over all elements.
///
/// # Shapes
/// - `x`, `mask`: `[batch, T]` → `[1]`
pub fn masked_sum(x: Tensor<2>, mask: &Tensor<2>) -> Tensor<1> {
    zero_padding(x, mask).sum()
}

/// `Σ x·m / (Σ m + 1e-8)` over all elements (verl's `masked_mean`).
///
/// # Shapes
/// - `x`, `mask`: `[batch, T]` → `[1]`
pub fn masked_mean(x: Tensor<2>, mask: &Tensor<2>) -> Tensor<1> {
    masked_sum(x, mask) / (mask.clone().sum() + COUNT_EPS)
}

/// Per-row `Σ_t x·m`.
///
/// # Shapes
/// - `x`, `mask`: `[batch, T]` → `[batch]`
pub fn masked_row_sum(x: Tensor<2>, mask: &Tensor<2>) -> Tensor<1> {
    zero_padding(x, mask).sum_dim(1).squeeze_dim(1)
}

/// Whitens `x` over the masked tokens: `(x − μ)·rsqrt(var + 1e-8)`, with the unbiased variance
/// (`·n/(n−1)`) and both means divided by `n + 1e-8`, as verl's `masked_whiten` does. With
/// `shift_mean = false` the mean is added back after scaling.
///
/// # Shapes
/// - `x`, `mask`: `[batch, T]` → `[batch, T]` (unmasked positions are transformed too)
pub fn masked_whiten(x: Tensor<2>, mask: &Tensor<2>, shift_mean: bool) -> Tensor<2> {
    let mean = masked_mean(x.clone(), mask).unsqueeze::<2>();
    let centered = x.clone() - mean.clone();
    let var = masked_mean(centered.clone().square(), mask);
    let n = mask.clone().sum();
    // Bessel's correction, as verl applies it (it divides by n - 1 without a guard).
    let var = var * n.clone() / (n - 1.0);
    let scale = (var + 1e-8).sqrt().recip().unsqueeze::<2>();
    let whitened = centered * scale;
    if shift_mean {
        whitened
    } else {
        whitened + mean
    }
}

/// `t / v` for a scalar `v`, differentiable at full precision.
///
/// burn 0.22's autodiff computes the gradient of `tensor / scalar` with an f32 reciprocal, which
/// costs f64 runs 8 digits; multiplying by `1 / v` keeps the gradient in the tensor's dtype.
pub fn div_scalar<const D: usize>(t: Tensor<D>, v: f64) -> Tensor<D> {
    t * (1.0 / v)
}

/// Reads a float tensor back to the host as `f64` values (row-major).
pub fn to_host<const D: usize>(t: &Tensor<D>) -> Result<Vec<f64>> {
    t.to_data()
        .convert::<f64>()
        .try_into_vec::<f64>()
        .map_err(|e| AlgoError::Readback(format!("{e:?}")))
}

/// Builds a float tensor from host values on the device and with the dtype of `like`.
pub fn from_host<const D: usize, const E: usize>(
    values: Vec<f64>,
    dims: [usize; D],
    like: &Tensor<E>,
) -> Tensor<D> {
    Tensor::from_data(
        TensorData::new(values, dims),
        (&like.device(), like.dtype()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{DType, Device};

    fn t2(v: &[f64], dims: [usize; 2]) -> Tensor<2> {
        Tensor::from_data(
            TensorData::new(v.to_vec(), dims),
            (&Device::flex(), DType::F64),
        )
    }

    #[test]
    fn masked_mean_ignores_padding_garbage() {
        let x = t2(&[1.0, 3.0, 1e30, 5.0], [2, 2]);
        let m = t2(&[1.0, 1.0, 0.0, 1.0], [2, 2]);
        let v = to_host(&masked_mean(x, &m)).unwrap()[0];
        assert!((v - 3.0).abs() < 1e-7, "{v}");
    }

    #[test]
    fn whiten_has_zero_mean_unit_unbiased_var() {
        let x = t2(&[1.0, 2.0, 3.0, 4.0, 9.0, 9.0], [2, 3]);
        let m = t2(&[1.0, 1.0, 1.0, 1.0, 0.0, 0.0], [2, 3]);
        let w = to_host(&masked_whiten(x, &m, true)).unwrap();
        let v: Vec<f64> = w[..4].to_vec();
        let mean = v.iter().sum::<f64>() / 4.0;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / 3.0;
        // verl divides masked means by n + 1e-8, so the mean is 0 to ~1e-8.
        assert!(
            mean.abs() < 1e-7 && (var - 1.0).abs() < 1e-6,
            "{mean} {var}"
        );
    }
}
