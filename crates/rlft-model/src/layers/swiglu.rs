//! The gated MLP's `silu(gate) · up` as one operation with its own backward pass.
//!
//! Composed from burn's operations, `silu(gate) · up` is three element-wise passes forward and
//! six back, each allocating its output, and burn's autodiff recomputes the sigmoid in the
//! backward pass with a scalar `expf` per element. On the flex backend (the default CPU
//! backend) [`silu_mul`] is one vectorised pass each way through a burn backend
//! extension with a hand-written autodiff step; on every other backend, and for dtypes other than
//! f32, it is the composed expression.

#[cfg(any(feature = "flex", test))]
mod kernel;

use burn::tensor::Tensor;
use burn::tensor::activation::silu;

/// `silu(gate) · up`, element by element.
///
/// # Shapes
/// - `gate`, `up`: `[..., f]` (the same shape; other shapes broadcast through the composed path)
/// - output: `[..., f]`
pub fn silu_mul<const D: usize>(gate: Tensor<D>, up: Tensor<D>) -> Tensor<D> {
    #[cfg(feature = "flex")]
    if gate.dims() == up.dims() && flex::is_flex(&gate.device()) {
        return flex::silu_mul(gate, up);
    }
    silu(gate) * up
}

#[cfg(feature = "flex")]
mod flex {
    //! The extension trait, its flex implementation and its autodiff step.

    use super::kernel;
    use burn::backend::autodiff::NodeId;
    use burn::backend::autodiff::checkpoint::base::Checkpointer;
    use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
    use burn::backend::autodiff::grads::Gradients;
    use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
    use burn::backend::flex::{FlexTensor, Layout};
    use burn::backend::tensor::FloatTensor;
    use burn::backend::{
        Autodiff, Backend, Bytes, DType, Dispatch, DispatchDevice, Flex, backend_extension,
    };
    use burn::tensor::{Device, Tensor};

    /// Whether a tensor on `device` is held by the flex backend (with or without autodiff).
    pub(super) fn is_flex(device: &Device) -> bool {
        fn held_by_flex(device: &DispatchDevice) -> bool {
            #[allow(unreachable_patterns)]
            match device {
                DispatchDevice::Flex(_) => true,
                DispatchDevice::Autodiff(inner) => held_by_flex(inner),
                _ => false,
            }
        }
        held_by_flex(device.as_dispatch())
    }

    pub(super) fn silu_mul<const D: usize>(gate: Tensor<D>, up: Tensor<D>) -> Tensor<D> {
        let out = <Dispatch as SiluMulBackend>::silu_mul(gate.into_dispatch(), up.into_dispatch());
        Tensor::from_dispatch(out)
    }

    /// `silu(gate) · up` with its gradients, as backend operations.
    #[backend_extension(Flex, Autodiff)]
    pub trait SiluMulBackend: Backend {
        /// `silu(gate) · up`.
        fn silu_mul(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self>;
    }

    /// The backward pass's kernel, on the backends [`SiluMulBackend`]'s autodiff step wraps.
    pub trait SiluMulGrad: Backend {
        /// `(∂L/∂gate, ∂L/∂up)` from `grad = ∂L/∂out`.
        fn silu_mul_grad(
            gate: FloatTensor<Self>,
            up: FloatTensor<Self>,
            grad: FloatTensor<Self>,
        ) -> (FloatTensor<Self>, FloatTensor<Self>);
    }

    /// The composed forward, for layouts and dtypes the kernel does not take.
    fn composed<B: Backend>(gate: FloatTensor<B>, up: FloatTensor<B>) -> FloatTensor<B> {
        let s = B::sigmoid(gate.clone());
        B::float_mul(B::float_mul(gate, s), up)
    }

    /// The composed backward, likewise.
    fn composed_grad<B: Backend>(
        gate: FloatTensor<B>,
        up: FloatTensor<B>,
        grad: FloatTensor<B>,
    ) -> (FloatTensor<B>, FloatTensor<B>) {
        let s = B::sigmoid(gate.clone());
        let gs = B::float_mul(gate, s.clone());
        let one_minus_s = B::float_add_scalar(B::float_neg(s.clone()), 1.0.into());
        let dsilu = B::float_add(s, B::float_mul(gs.clone(), one_minus_s));
        let du = B::float_mul(grad.clone(), gs);
        let dg = B::float_mul(B::float_mul(grad, up), dsilu);
        (dg, du)
    }

    /// A contiguous f32 view of a flex tensor, if it has one.
    fn f32s(t: &FlexTensor) -> Option<&[f32]> {
        t.as_slice::<f32>()
    }

    fn from_f32s(values: Vec<f32>, like: &FlexTensor) -> FlexTensor {
        let layout = Layout::contiguous(like.layout().shape().clone());
        FlexTensor::new(Bytes::from_elems(values), layout, DType::F32)
    }

    impl SiluMulBackend for Flex {
        fn silu_mul(gate: FlexTensor, up: FlexTensor) -> FlexTensor {
            let same = gate.layout().shape() == up.layout().shape();
            match (same, f32s(&gate), f32s(&up)) {
                (true, Some(g), Some(u)) => from_f32s(kernel::forward(g, u), &gate),
                _ => composed::<Flex>(gate, up),
            }
        }
    }

    impl SiluMulGrad for Flex {
        fn silu_mul_grad(
            gate: FlexTensor,
            up: FlexTensor,
            grad: FlexTensor,
        ) -> (FlexTensor, FlexTensor) {
            let shape = gate.layout().shape();
            let same = up.layout().shape() == shape && grad.layout().shape() == shape;
            match (same, f32s(&gate), f32s(&up), f32s(&grad)) {
                (true, Some(g), Some(u), Some(dy)) => {
                    let (dg, du) = kernel::backward(g, u, dy);
                    (from_f32s(dg, &gate), from_f32s(du, &gate))
                }
                _ => composed_grad::<Flex>(gate, up, grad),
            }
        }
    }

    /// The autodiff step: keeps `gate` and `up`, and calls [`SiluMulGrad`] once going back.
    #[derive(Debug)]
    struct SiluMulStep;

    impl<B: Backend + SiluMulGrad> Backward<B, 2> for SiluMulStep {
        type State = (NodeId, NodeId);

        fn backward(
            self,
            ops: Ops<Self::State, 2>,
            grads: &mut Gradients,
            checkpointer: &mut Checkpointer,
        ) {
            let (gate, up) = ops.state;
            let gate = checkpointer.retrieve_node_output(gate);
            let up = checkpointer.retrieve_node_output(up);
            let grad = grads.consume::<B>(&ops.node);
            let (dg, du) = B::silu_mul_grad(gate, up, grad);
            let [gate_node, up_node] = ops.parents;
            if let Some(node) = gate_node {
                grads.register::<B>(node.id, dg);
            }
            if let Some(node) = up_node {
                grads.register::<B>(node.id, du);
            }
        }
    }

    impl<B, C> SiluMulBackend for Autodiff<B, C>
    where
        B: Backend + SiluMulBackend + SiluMulGrad,
        C: CheckpointStrategy,
    {
        fn silu_mul(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
            match SiluMulStep
                .prepare::<C>([gate.node(), up.node()])
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(mut prep) => {
                    let state = (prep.checkpoint(&gate), prep.checkpoint(&up));
                    let out = B::silu_mul(gate.into_primitive(), up.into_primitive());
                    prep.finish(state, out)
                }
                OpsKind::UnTracked(prep) => {
                    prep.finish(B::silu_mul(gate.into_primitive(), up.into_primitive()))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Device, Distribution, TensorData, Tolerance};

    #[cfg_attr(not(feature = "ndarray"), allow(unused_mut))]
    fn devices() -> Vec<Device> {
        let mut all = vec![Device::flex()];
        #[cfg(feature = "ndarray")]
        all.push(Device::ndarray());
        all
    }

    /// Values and both gradients against burn's composed `silu(gate) · up`, on each CPU
    /// backend, with and without a second consumer of `gate` (its gradients must add up).
    #[test]
    fn equals_the_composed_expression_with_gradients() {
        for base in devices() {
            let device = base.autodiff();
            #[cfg(feature = "flex")]
            assert_eq!(flex::is_flex(&device), device == Device::flex().autodiff());
            let gate = Tensor::<3>::random([2, 5, 7], Distribution::Normal(0.0, 3.0), &device);
            let up = Tensor::<3>::random([2, 5, 7], Distribution::Normal(0.0, 1.0), &device);
            let run = |fused: bool| {
                let g = gate.clone().detach().require_grad();
                let u = up.clone().detach().require_grad();
                let y = if fused {
                    silu_mul(g.clone(), u.clone())
                } else {
                    silu(g.clone()) * u.clone()
                };
                let loss = (y.clone() * y.clone()).sum() + (g.clone() * 0.5).sum();
                let grads = loss.backward();
                let grad = |t: &Tensor<3>| t.grad(&grads).map(|g| g.into_data());
                (y.into_data(), grad(&g), grad(&u))
            };
            let (want, got) = (run(false), run(true));
            let tol = Tolerance::<f32>::absolute(1e-5);
            want.0.assert_approx_eq::<f32>(&got.0, tol);
            for (w, g) in [(want.1, got.1), (want.2, got.2)] {
                let (w, g) = (w.expect("composed gradient"), g.expect("fused gradient"));
                w.assert_approx_eq::<f32>(&g, tol);
            }
        }
    }

    #[test]
    fn no_autodiff_and_transposed_inputs() {
        let device = Device::flex();
        let gate = Tensor::<2>::random([6, 4], Distribution::Normal(0.0, 2.0), &device);
        let up = Tensor::<2>::random([4, 6], Distribution::Normal(0.0, 1.0), &device);
        // A transposed `up` has no contiguous view: the composed path takes it.
        let want = silu(gate.clone()) * up.clone().transpose();
        let got = silu_mul(gate.clone(), up.transpose());
        want.into_data()
            .assert_approx_eq::<f32>(&got.into_data(), Tolerance::absolute(1e-6));
        // Broadcasting shapes go through the composed path too.
        let row = Tensor::<2>::from_data(TensorData::new(vec![1.0f32; 4], [1, 4]), &device);
        let got = silu_mul(gate.clone(), row.clone());
        (silu(gate) * row)
            .into_data()
            .assert_approx_eq::<f32>(&got.into_data(), Tolerance::absolute(1e-6));
    }
}
