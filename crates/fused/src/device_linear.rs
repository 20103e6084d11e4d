//! Linear layers on cubecl devices, as one autodiff step whose bias
//! gradient — the sum over the rows of `∂L/∂y` — runs the routine
//! `reduce_routine.rs` names instead of burn's default.
//!
//! Why: burn's autodiff takes a bias gradient with `sum_dim` over the rows,
//! and without `autotune` burn-cubecl and its fused reduce always launch
//! cubek's `Unit` routine: one thread per column, each walking every row.
//! For BERT-base's `[4096, 768]` gradients that is 768 threads on a GPU
//! that holds ~270 000; on an H100 those sums (with LayerNorm's γ and β,
//! `device_layer_norm.rs`) took 263–505 µs each, 114 of them per step,
//! 43 ms of a 176 ms step (`results/gpu-cuda-profile/`).
//!
//! The forward pass is burn's `linear` (fused lazily under `fusion`), the
//! x and W gradients burn's `linear_*_backward`; only the bias gradient's
//! sum is terse's. Where a run names a matmul routine
//! (`matmul_routine.rs`), the three matmuls launch that routine instead,
//! each as one 2-D product over all rows. Flex keeps its fused kernel
//! (`gemm_linear.rs`).

use burn::backend::TensorMetadata;
use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::tensor::FloatTensor;
use burn::backend::wgpu::CubeBackend;
use burn::backend::{Dispatch, backend_extension};
use burn::tensor::{Shape, Tensor};

use crate::matmul_routine::{NamedMatmulOps, named_linear_matmul};
use crate::reduce_routine::{ParallelReduceOps, rows};

/// A linear layer with a bias.
#[backend_extension(Cube, Fusion, Autodiff)]
pub trait DeviceLinearOps: ParallelReduceOps + NamedMatmulOps {
    /// `x·W + b` over the last dimension, W `[in, out]`, or stored `[out,
    /// in]` where `weight_transposed` (the tied MLM decoder): burn's
    /// `linear`, or the named routine's product plus the bias.
    #[fusion(default)]
    fn biased_linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        weight_transposed: bool,
    ) -> FloatTensor<Self> {
        let weight = in_out::<Self>(weight, weight_transposed);
        if named_linear_matmul().is_none() {
            return Self::linear(x, weight, Some(bias));
        }
        let shape = x.shape();
        let out = weight.shape()[1];
        let product = Self::named_matmul(rows::<Self>(x), weight);
        let biased = Self::float_add(product, Self::float_reshape(bias, Shape::new([1, out])));
        let mut dims = shape.to_vec();
        *dims.last_mut().expect("x has a last dimension") = out;
        Self::float_reshape(biased, Shape::from(dims))
    }
}

/// W as `[in, out]`: itself, or the transposed view of W stored `[out, in]`.
fn in_out<B: DeviceLinearOps>(weight: FloatTensor<B>, transposed: bool) -> FloatTensor<B> {
    if transposed {
        B::float_swap_dims(weight, 0, 1)
    } else {
        weight
    }
}

/// `∂L/∂x = ∂L/∂y · Wᵀ`, in x's shape, W `[in, out]`.
fn x_grad<B: DeviceLinearOps>(weight: FloatTensor<B>, grad: FloatTensor<B>) -> FloatTensor<B> {
    if named_linear_matmul().is_none() {
        return B::linear_x_backward(weight, grad);
    }
    let mut dims = grad.shape().to_vec();
    *dims.last_mut().expect("grad has a last dimension") = weight.shape()[0];
    let product = B::named_matmul(rows::<B>(grad), B::float_swap_dims(weight, 0, 1));
    B::float_reshape(product, Shape::from(dims))
}

/// `∂L/∂W = xᵀ · ∂L/∂y` over all rows.
fn weight_grad<B: DeviceLinearOps>(x: FloatTensor<B>, grad: FloatTensor<B>) -> FloatTensor<B> {
    if named_linear_matmul().is_none() {
        return B::linear_weight_backward(x, grad);
    }
    B::named_matmul(B::float_swap_dims(rows::<B>(x), 0, 1), rows::<B>(grad))
}

impl DeviceLinearOps for CubeBackend {}

#[derive(Debug)]
struct LinearBackward;

impl<B: DeviceLinearOps> Backward<B, 3> for LinearBackward {
    /// x when W's gradient is wanted, W when x's is, and whether W is
    /// stored `[out, in]`.
    type State = (Option<FloatTensor<B>>, Option<FloatTensor<B>>, bool);

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_x, node_weight, node_bias] = ops.parents;
        let grad = grads.consume::<B>(&ops.node);
        let (x, weight, transposed) = ops.state;
        if let (Some(node), Some(weight)) = (node_x, weight) {
            let weight = in_out::<B>(weight, transposed);
            grads.register::<B>(node.id, x_grad::<B>(weight, grad.clone()));
        }
        if let (Some(node), Some(x)) = (node_weight, x) {
            // W's gradient in W's own layout: `∂L/∂yᵀ · x` for W stored
            // `[out, in]`, where `(xᵀ · ∂L/∂y)ᵀ` would be a transposed
            // view that the flat gradient buffer then copies out (a
            // `[vocab, hidden]` copy per step for the tied decoder).
            let dw = if transposed {
                weight_grad::<B>(grad.clone(), x)
            } else {
                weight_grad::<B>(x, grad.clone())
            };
            grads.register::<B>(node.id, dw);
        }
        if let Some(node) = node_bias {
            grads.register::<B>(node.id, B::column_sums(rows::<B>(grad)));
        }
    }
}

impl<B: DeviceLinearOps, C: CheckpointStrategy> DeviceLinearOps for Autodiff<B, C> {
    fn biased_linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        weight_transposed: bool,
    ) -> FloatTensor<Self> {
        let (want_x, want_weight) = (x.is_tracked(), weight.is_tracked());
        let nodes = [x.node(), weight.node(), bias.node()];
        let prep = LinearBackward
            .prepare::<C>(nodes)
            .compute_bound()
            .stateful();
        let (x, weight) = (x.into_primitive(), weight.into_primitive());
        let kept = (
            want_weight.then(|| x.clone()),
            want_x.then(|| weight.clone()),
            weight_transposed,
        );
        let out = B::biased_linear(x, weight, bias.into_primitive(), weight_transposed);
        match prep {
            OpsKind::Tracked(prep) => prep.finish(kept, out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }
}

/// `x·W + b` with W `[in, out]` as one [`DeviceLinearOps::biased_linear`]
/// step.
pub(crate) fn linear<const D: usize>(
    x: Tensor<D>,
    weight: Tensor<2>,
    bias: Tensor<1>,
) -> Tensor<D> {
    biased_linear(x, weight, bias, false)
}

/// `x·Wᵀ + b` with W stored `[out, in]` (the tied MLM decoder) as one
/// [`DeviceLinearOps::biased_linear`] step, W's gradient in that layout.
pub(crate) fn linear_transposed<const D: usize>(
    x: Tensor<D>,
    weight: Tensor<2>,
    bias: Tensor<1>,
) -> Tensor<D> {
    biased_linear(x, weight, bias, true)
}

fn biased_linear<const D: usize>(
    x: Tensor<D>,
    weight: Tensor<2>,
    bias: Tensor<1>,
    weight_transposed: bool,
) -> Tensor<D> {
    Tensor::from_dispatch(<Dispatch as DeviceLinearOps>::biased_linear(
        x.into_dispatch(),
        weight.into_dispatch(),
        bias.into_dispatch(),
        weight_transposed,
    ))
}
