//! Linear layers over batched inputs as one matrix product.
//!
//! burn 0.22 runs `Linear::forward` on a `[b, l, d_in]` input as `b` products against the
//! weight broadcast to `[1, d_in, d_out]` whenever `l` is a multiple of 32 (its tiling policy
//! keeps such rows batched), and autodiff differentiates that broadcast: the weight's gradient
//! is built as `[b, d_in, d_out]` and summed over `b`, on one thread, for every projection of
//! every layer. Folding the leading dims into the rows first makes the forward pass one
//! `[b·l, d_in] × [d_in, d_out]` product and the two backward products `[b·l, d_out] ×
//! [d_out, d_in]` and `[d_in, b·l] × [b·l, d_out]`, with no reduction.

use burn::nn::Linear;
use burn::tensor::Tensor;

/// [`Linear::forward`] with the input's leading dims folded into one row dim.
pub trait LinearRows {
    /// `x·W (+ b)` as one product over all rows of `x`; equal to [`Linear::forward`].
    ///
    /// # Shapes
    /// - `x`: `[..., d_in]` → `[..., d_out]`
    fn forward_rows<const D: usize>(&self, x: Tensor<D>) -> Tensor<D>;
}

impl LinearRows for Linear {
    fn forward_rows<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        if D <= 2 {
            return self.forward(x);
        }
        let mut dims = x.dims();
        let rows = dims[..D - 1].iter().product();
        let y = self.forward(x.reshape([rows, dims[D - 1]]));
        dims[D - 1] = y.dims()[1];
        y.reshape(dims)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hostmem::host_vec;
    use burn::nn::LinearConfig;
    use burn::tensor::{Device, Distribution, TensorData};

    fn host<const D: usize>(t: Tensor<D>) -> Vec<f32> {
        host_vec(t).expect("f32 values")
    }

    fn close(a: &[f32], b: &[f32]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() <= 1e-5 * (1.0 + y.abs()), "{x} vs {y}");
        }
    }

    /// Values and the gradients of input, weight and bias equal `Linear::forward`'s, for a
    /// row count burn keeps batched (32) and one it folds itself (5).
    #[test]
    fn equals_linear_forward_with_gradients() {
        let device = Device::flex().autodiff();
        for l in [32, 5] {
            let layer = LinearConfig::new(6, 4).init(&device);
            let x = Tensor::<3>::random([3, l, 6], Distribution::Default, &device).require_grad();
            let w = Tensor::<3>::from_data(
                TensorData::new(
                    (0..3 * l * 4).map(|i| (i % 7) as f32 - 3.0).collect(),
                    [3, l, 4],
                ),
                &device,
            );
            let run = |rows: bool| {
                let x = x.clone();
                let y = if rows {
                    layer.forward_rows(x.clone())
                } else {
                    layer.forward(x.clone())
                };
                let grads = (y.clone() * w.clone()).sum().backward();
                let b = layer.bias.as_ref().expect("bias");
                (
                    host(y),
                    host(x.grad(&grads).expect("x grad")),
                    host(layer.weight.val().grad(&grads).expect("w grad")),
                    host(b.val().grad(&grads).expect("b grad")),
                )
            };
            let (got, want) = (run(true), run(false));
            assert_eq!(got.0.len(), 3 * l * 4);
            close(&got.0, &want.0);
            close(&got.1, &want.1);
            close(&got.2, &want.2);
            close(&got.3, &want.3);
        }
        // A 2-D input is the plain forward.
        let layer = LinearConfig::new(6, 4).init(&Device::flex());
        let x = Tensor::<2>::random([5, 6], Distribution::Default, &Device::flex());
        assert_eq!(host(layer.forward_rows(x.clone())), host(layer.forward(x)));
    }
}
