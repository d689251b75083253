//! Fused operations with their own backward passes: `silu(gate) · up`, and softmax and
//! log-softmax over the last dim.
//!
//! Composed from burn's operations, each of these is several element-wise passes forward and
//! more back, each allocating its output; burn's autodiff recomputes what it needs (the
//! sigmoid, the exponentials) in the backward pass, and the flex backend runs every pass on the
//! calling thread with a scalar `expf` per element. On flex (the default CPU backend), with or
//! without autodiff, the functions here are one vectorised pass each way (`kernels`, through a
//! burn backend extension with a hand-written autodiff step), split over the thread pool in
//! chunks of whole rows. On every other backend, and for dtypes other than f32, they are burn's
//! composed expressions. Results do not depend on the thread count, nor on which vector copy of
//! a kernel runs.

#[cfg(any(feature = "flex", test))]
mod kernels;
#[cfg(any(feature = "flex", test))]
mod simd;

use burn::tensor::Tensor;
use burn::tensor::activation;

/// `silu(gate) · up`, element by element (the gated MLP's SwiGLU).
///
/// # Shapes
/// - `gate`, `up`: `[..., f]` (other shapes broadcast through the composed path)
/// - output: `[..., f]`
pub fn silu_mul<const D: usize>(gate: Tensor<D>, up: Tensor<D>) -> Tensor<D> {
    #[cfg(feature = "flex")]
    if gate.dims() == up.dims() && flex::is_flex(&gate.device()) {
        return flex::silu_mul(gate, up);
    }
    activation::silu(gate) * up
}

/// Softmax along `dim`.
///
/// # Shapes
/// - `x`: any; output: the same
pub fn softmax<const D: usize>(x: Tensor<D>, dim: usize) -> Tensor<D> {
    #[cfg(feature = "flex")]
    if dim + 1 == D && flex::is_flex(&x.device()) {
        return flex::softmax(x);
    }
    activation::softmax(x, dim)
}

/// Log-softmax along `dim`.
///
/// # Shapes
/// - `x`: any; output: the same
pub fn log_softmax<const D: usize>(x: Tensor<D>, dim: usize) -> Tensor<D> {
    #[cfg(feature = "flex")]
    if dim + 1 == D && flex::is_flex(&x.device()) {
        return flex::log_softmax(x);
    }
    activation::log_softmax(x, dim)
}

#[cfg(feature = "flex")]
mod flex {
    //! The extension trait, its flex implementation and its autodiff steps.

    use super::kernels;
    use burn::backend::autodiff::NodeId;
    use burn::backend::autodiff::checkpoint::base::Checkpointer;
    use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
    use burn::backend::autodiff::grads::Gradients;
    use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
    use burn::backend::flex::{FlexTensor, Layout};
    use burn::backend::ops::{ActivationOps, FloatTensorOps};
    use burn::backend::tensor::FloatTensor;
    use burn::backend::{
        Autodiff, Backend, Bytes, DType, Dispatch, DispatchDevice, Flex, Shape, TensorMetadata,
        backend_extension,
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
        let out = <Dispatch as FusedOps>::silu_mul(gate.into_dispatch(), up.into_dispatch());
        Tensor::from_dispatch(out)
    }

    pub(super) fn softmax<const D: usize>(x: Tensor<D>) -> Tensor<D> {
        Tensor::from_dispatch(<Dispatch as FusedOps>::softmax_last(x.into_dispatch()))
    }

    pub(super) fn log_softmax<const D: usize>(x: Tensor<D>) -> Tensor<D> {
        Tensor::from_dispatch(<Dispatch as FusedOps>::log_softmax_last(x.into_dispatch()))
    }

    /// The fused operations, as backend operations.
    #[backend_extension(Flex, Autodiff)]
    pub trait FusedOps: Backend {
        /// `silu(gate) · up`.
        fn silu_mul(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self>;
        /// Softmax over the last dim.
        fn softmax_last(x: FloatTensor<Self>) -> FloatTensor<Self>;
        /// Log-softmax over the last dim.
        fn log_softmax_last(x: FloatTensor<Self>) -> FloatTensor<Self>;
    }

    /// The backward passes' kernels, on the backends [`FusedOps`]'s autodiff steps wrap.
    pub trait FusedGrads: Backend {
        /// `(∂L/∂gate, ∂L/∂up)` of `silu(gate) · up` from `grad = ∂L/∂out`.
        fn silu_mul_grad(
            gate: FloatTensor<Self>,
            up: FloatTensor<Self>,
            grad: FloatTensor<Self>,
        ) -> (FloatTensor<Self>, FloatTensor<Self>);
        /// `∂L/∂x` of the last-dim row operation `op` from its output `y` and `grad`.
        fn row_last_grad(
            op: RowOp,
            y: FloatTensor<Self>,
            grad: FloatTensor<Self>,
        ) -> FloatTensor<Self>;
    }

    /// The last dim's index (0 for a scalar).
    fn last_dim(shape: &Shape) -> usize {
        shape.num_dims().saturating_sub(1)
    }

    /// A contiguous f32 view of a flex tensor (copied into a contiguous layout first if it has
    /// none); `None` for other dtypes.
    fn f32s(t: &mut FlexTensor) -> Option<&[f32]> {
        if t.dtype() != DType::F32 {
            return None;
        }
        if t.as_slice::<f32>().is_none() {
            *t = t.to_contiguous();
        }
        t.as_slice::<f32>()
    }

    fn from_f32s(values: Vec<f32>, shape: Shape) -> FlexTensor {
        FlexTensor::new(
            Bytes::from_elems(values),
            Layout::contiguous(shape),
            DType::F32,
        )
    }

    /// A tensor's shape and the width of its rows (the last dim; 1 for a scalar).
    fn rows_of(t: &FlexTensor) -> (Shape, usize) {
        let shape = t.layout().shape().clone();
        let width = shape.last().copied().unwrap_or(1);
        (shape, width)
    }

    impl FusedOps for Flex {
        fn silu_mul(mut gate: FlexTensor, mut up: FlexTensor) -> FlexTensor {
            let shape = gate.layout().shape().clone();
            if &shape == up.layout().shape()
                && let (Some(g), Some(u)) = (f32s(&mut gate), f32s(&mut up))
            {
                return from_f32s(kernels::silu_mul(g, u), shape);
            }
            let s = Flex::sigmoid(gate.clone());
            Flex::float_mul(Flex::float_mul(gate, s), up)
        }

        fn softmax_last(x: FlexTensor) -> FlexTensor {
            row_last(RowOp::Softmax, x)
        }

        fn log_softmax_last(x: FlexTensor) -> FlexTensor {
            row_last(RowOp::LogSoftmax, x)
        }
    }

    /// `op` over the last dim of a flex tensor: the kernel for f32, burn's otherwise.
    fn row_last(op: RowOp, mut x: FlexTensor) -> FlexTensor {
        let (shape, w) = rows_of(&x);
        if let Some(v) = f32s(&mut x) {
            let y = match op {
                RowOp::Softmax => kernels::softmax(v, w),
                RowOp::LogSoftmax => kernels::log_softmax(v, w),
            };
            return from_f32s(y, shape);
        }
        match op {
            RowOp::Softmax => Flex::softmax(x, last_dim(&shape)),
            RowOp::LogSoftmax => Flex::log_softmax(x, last_dim(&shape)),
        }
    }

    impl FusedGrads for Flex {
        fn silu_mul_grad(
            mut gate: FlexTensor,
            mut up: FlexTensor,
            mut grad: FlexTensor,
        ) -> (FlexTensor, FlexTensor) {
            let shape = grad.layout().shape().clone();
            if let (Some(g), Some(u), Some(dy)) = (f32s(&mut gate), f32s(&mut up), f32s(&mut grad))
            {
                let (dg, du) = kernels::silu_mul_grad(g, u, dy);
                return (from_f32s(dg, shape.clone()), from_f32s(du, shape));
            }
            composed_silu_mul_grad::<Flex>(gate, up, grad)
        }

        fn row_last_grad(op: RowOp, mut y: FlexTensor, mut grad: FlexTensor) -> FlexTensor {
            let (shape, w) = rows_of(&y);
            if let (Some(yv), Some(dy)) = (f32s(&mut y), f32s(&mut grad)) {
                let dx = match op {
                    RowOp::Softmax => kernels::softmax_grad(yv, dy, w),
                    RowOp::LogSoftmax => kernels::log_softmax_grad(yv, dy, w),
                };
                return from_f32s(dx, shape);
            }
            composed_row_grad::<Flex>(op, y, grad)
        }
    }

    /// `silu(gate) · up`'s gradients from burn's operations (dtypes the kernels do not take).
    fn composed_silu_mul_grad<B: Backend>(
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

    /// A row operation's input gradient from burn's operations: `y ⊙ (dy − Σ dy⊙y)` for the
    /// softmax, `dy − exp(y) · Σ dy` for the log-softmax.
    fn composed_row_grad<B: Backend>(
        op: RowOp,
        y: FloatTensor<B>,
        grad: FloatTensor<B>,
    ) -> FloatTensor<B> {
        let dim = last_dim(&y.shape());
        match op {
            RowOp::Softmax => {
                let dot = B::float_sum_dim(B::float_mul(grad.clone(), y.clone()), dim);
                B::float_mul(y, B::float_sub(grad, dot))
            }
            RowOp::LogSoftmax => {
                let total = B::float_sum_dim(grad.clone(), dim);
                B::float_sub(grad, B::float_mul(B::float_exp(y), total))
            }
        }
    }

    /// `silu(gate) · up`'s autodiff step: keeps `gate` and `up`, one kernel call going back.
    #[derive(Debug)]
    struct SiluMulStep;

    impl<B: Backend + FusedGrads> Backward<B, 2> for SiluMulStep {
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

    /// A row-wise operation over the last dim.
    #[derive(Debug, Clone, Copy)]
    pub enum RowOp {
        /// Softmax.
        Softmax,
        /// Log-softmax.
        LogSoftmax,
    }

    /// A row-wise operation's autodiff step: keeps its output, from which its gradient follows.
    #[derive(Debug)]
    struct RowStep(RowOp);

    impl<B: Backend + FusedGrads> Backward<B, 1> for RowStep {
        type State = FloatTensor<B>;

        fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
            let grad = grads.consume::<B>(&ops.node);
            let [parent] = ops.parents;
            if let Some(node) = parent {
                grads.register::<B>(node.id, B::row_last_grad(self.0, ops.state, grad));
            }
        }
    }

    /// A row-wise operation under autodiff, its output kept for the backward pass.
    fn row_op<B, C>(op: RowOp, x: FloatTensor<Autodiff<B, C>>) -> FloatTensor<Autodiff<B, C>>
    where
        B: Backend + FusedOps + FusedGrads,
        C: CheckpointStrategy,
    {
        let forward = |x| match op {
            RowOp::Softmax => B::softmax_last(x),
            RowOp::LogSoftmax => B::log_softmax_last(x),
        };
        match RowStep(op)
            .prepare::<C>([x.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let y = forward(x.into_primitive());
                prep.finish(y.clone(), y)
            }
            OpsKind::UnTracked(prep) => prep.finish(forward(x.into_primitive())),
        }
    }

    impl<B, C> FusedOps for Autodiff<B, C>
    where
        B: Backend + FusedOps + FusedGrads,
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

        fn softmax_last(x: FloatTensor<Self>) -> FloatTensor<Self> {
            row_op::<B, C>(RowOp::Softmax, x)
        }

        fn log_softmax_last(x: FloatTensor<Self>) -> FloatTensor<Self> {
            row_op::<B, C>(RowOp::LogSoftmax, x)
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
        #[allow(deprecated)]
        all.push(Device::ndarray());
        all
    }

    /// `x` with its −∞ entries set to 0.
    fn finite(x: Tensor<3>) -> Tensor<3> {
        let masked = x.clone().equal_elem(f32::NEG_INFINITY);
        x.mask_fill(masked, 0.0)
    }

    /// Runs `op` and burn's composed `reference` on the same inputs under autodiff, with a
    /// second consumer of each input (its gradients must add up), and compares the values and
    /// every input's gradient.
    fn check<const N: usize>(
        shape: [usize; 3],
        op: impl Fn([Tensor<3>; N]) -> Tensor<3>,
        reference: impl Fn([Tensor<3>; N]) -> Tensor<3>,
    ) {
        for base in devices() {
            let device = base.autodiff();
            #[cfg(feature = "flex")]
            assert_eq!(flex::is_flex(&device), device == Device::flex().autodiff());
            let inputs: [Tensor<3>; N] = std::array::from_fn(|i| {
                let x = Tensor::<3>::random(shape, Distribution::Normal(0.0, 3.0), &device);
                // A masked entry, as attention scores have.
                if i == 0 {
                    x.slice_fill([0..1, 0..1, 1..2], f32::NEG_INFINITY)
                } else {
                    x
                }
            });
            let weights = Tensor::<3>::random(shape, Distribution::Default, &device);
            let run = |f: &dyn Fn([Tensor<3>; N]) -> Tensor<3>| {
                let xs = inputs.clone().map(|x| x.detach().require_grad());
                let y =
                    f(xs.clone()).mask_fill(inputs[0].clone().equal_elem(f32::NEG_INFINITY), 0.0);
                let mut loss = (y.clone() * weights.clone()).sum();
                for x in &xs {
                    loss = loss + (finite(x.clone()) * 0.5).sum();
                }
                let grads = loss.backward();
                let g = xs.map(|x| {
                    x.grad(&grads)
                        .expect("every input has a gradient")
                        .into_data()
                });
                (y.into_data(), g)
            };
            let (want, got) = (run(&reference), run(&op));
            let tol = Tolerance::<f32>::absolute(1e-5);
            want.0.assert_approx_eq::<f32>(&got.0, tol);
            for (w, g) in want.1.iter().zip(&got.1) {
                w.assert_approx_eq::<f32>(g, tol);
            }
        }
    }

    #[test]
    fn each_operation_equals_burns_with_gradients() {
        check::<2>(
            [2, 5, 7],
            |[g, u]| silu_mul(finite(g), u),
            |[g, u]| activation::silu(finite(g)) * u,
        );
        check::<1>(
            [2, 3, 40],
            |[x]| softmax(x, 2),
            |[x]| activation::softmax(x, 2),
        );
        check::<1>(
            [2, 3, 40],
            |[x]| log_softmax(x, 2),
            |[x]| activation::log_softmax(x, 2),
        );
    }

    #[test]
    fn other_dims_layouts_and_shapes() {
        let device = Device::flex();
        let x = Tensor::<2>::random([6, 4], Distribution::Normal(0.0, 2.0), &device);
        let tol = Tolerance::<f32>::absolute(1e-6);
        // A transposed input is made contiguous first; a softmax over another dim is burn's.
        let t = x.clone().transpose();
        activation::softmax(t.clone(), 1)
            .into_data()
            .assert_approx_eq::<f32>(&softmax(t.clone(), 1).into_data(), tol);
        activation::log_softmax(x.clone(), 0)
            .into_data()
            .assert_approx_eq::<f32>(&log_softmax(x.clone(), 0).into_data(), tol);
        let up = Tensor::<2>::random([4, 6], Distribution::Normal(0.0, 1.0), &device);
        (activation::silu(x.clone()) * up.clone().transpose())
            .into_data()
            .assert_approx_eq::<f32>(&silu_mul(x.clone(), up.transpose()).into_data(), tol);
        // Broadcast shapes go through the composed path.
        let row = Tensor::<2>::from_data(TensorData::new(vec![1.5f32; 4], [1, 4]), &device);
        (activation::silu(x.clone()) * row.clone())
            .into_data()
            .assert_approx_eq::<f32>(&silu_mul(x, row).into_data(), tol);
    }
}
