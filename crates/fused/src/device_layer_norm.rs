//! LayerNorm over the last dimension on cubecl devices, as one autodiff
//! step whose reductions run the routine `reduce_routine.rs` names: two
//! row sums forward (mean, variance), two backward, and the γ and β
//! gradients' column sums.
//!
//! burn's `LayerNorm` is a chain of ops under autodiff: each broadcast
//! operand (the mean, the standard deviation, γ, β) costs a reduction in
//! the backward pass, every one with the `Unit` routine; γ's and β's sums
//! over BERT-base's 4096 rows were among the 263–505 µs reductions of an
//! H100's step (`results/gpu-cuda-profile/`). The forward arithmetic is
//! burn's (`(x − mean) / sqrt(var + ε)`, biased variance, then `·γ + β`);
//! the backward pass is the closed form
//! `∂x = (g·γ − mean(g·γ) − x̂·mean(g·γ·x̂)) / sqrt(var + ε)`,
//! `∂γ = Σ_rows g·x̂`, `∂β = Σ_rows g`, from the kept x̂ and denominator,
//! ∂x in one kernel for f32 (`terse_kernels::device::layer_norm_input_grad`:
//! one cube per row; as burn ops, with fusion, about ten dispatches on
//! lavapipe, two of them row sums: `results/dispatches/`).
//! Flex keeps its fused kernel (`layer_norm.rs`).

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::fusion::custom::TensorSpec;
use burn::backend::tensor::FloatTensor;
use burn::backend::wgpu::{CubeBackend, CubeTensor};
use burn::backend::{DType, Dispatch, TensorMetadata, backend_extension};
use burn::tensor::{Shape, Tensor};
use burn_cubecl::kernel::into_contiguous;
use terse_compress::dropout::SiteMask;
use terse_kernels::device;

use crate::device_dropout::DeviceDropoutOps;
use crate::reduce_routine::{ParallelReduceOps, row_means, rows, same_shape};

/// LayerNorm over the last dimension.
#[backend_extension(Cube, Fusion, Autodiff)]
pub trait DeviceLayerNormOps: ParallelReduceOps + DeviceDropoutOps {
    /// `(x − mean) / sqrt(var + eps) · γ + β` over the last dimension of
    /// `x`, γ and β `[d]`.
    #[fusion(default)]
    fn norm_scale_shift(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        eps: f64,
    ) -> FloatTensor<Self> {
        forward::<Self>(x, gamma, beta, eps).0
    }

    /// LayerNorm of `x` `[n, d]` with γ and β `[d]`: the output `[n, d]`
    /// with what the backward pass keeps, x̂ `[n, d]` and the rows'
    /// `sqrt(var + eps)` `[n, 1]`.
    #[fusion(meta = forward_specs)]
    fn layer_norm_forward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        eps: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        forward_ops::<Self>(x, gamma, beta, eps)
    }

    /// `norm_scale_shift` of `x·f + residual` (of one shape; `f` the
    /// factors of `SiteMask::new(prob, key)` by position): a post-LN
    /// block's `LayerNorm(dropout(x) + residual)`, the sum neither a
    /// dispatch nor a tensor on a cubecl device.
    #[fusion(default)]
    #[allow(clippy::too_many_arguments)]
    fn dropout_add_norm(
        x: FloatTensor<Self>,
        residual: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        eps: f64,
        prob: f32,
        key: u64,
    ) -> FloatTensor<Self> {
        let shape = x.shape();
        let (x, residual) = (rows::<Self>(x), rows::<Self>(residual));
        let (y, _, _) =
            Self::dropout_add_layer_norm_forward(x, residual, gamma, beta, eps, prob, key);
        Self::float_reshape(y, shape)
    }

    /// [`DeviceLayerNormOps::layer_norm_forward`] of `x·f + residual`
    /// (`x`, `residual` `[n, d]`).
    #[fusion(meta = dropout_add_forward_specs)]
    #[allow(clippy::too_many_arguments)]
    fn dropout_add_layer_norm_forward(
        x: FloatTensor<Self>,
        residual: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        eps: f64,
        prob: f32,
        key: u64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        dropout_add_forward_ops::<Self>(x, residual, gamma, beta, eps, prob, key)
    }

    /// The input's gradient from the upstream `g` `[n, d]`, the kept x̂
    /// `[n, d]` and denominators `[n, 1]`, and γ `[d]`: `[n, d]`.
    #[fusion(dtype = g, shape = same_shape(g))]
    fn layer_norm_input_grad(
        g: FloatTensor<Self>,
        xhat: FloatTensor<Self>,
        denom: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        input_grad::<Self>(g, xhat, denom, gamma)
    }
}

/// [`DeviceLayerNormOps::layer_norm_forward`]'s outputs for `x` `[n, d]`:
/// two of its shape and dtype, and `[n, 1]`.
fn forward_specs(
    x: &TensorSpec,
    _: &TensorSpec,
    _: &TensorSpec,
    _: &f64,
) -> (TensorSpec, TensorSpec, TensorSpec) {
    let rows = TensorSpec::new(Shape::new([x.shape[0], 1]), x.dtype);
    (x.clone(), x.clone(), rows)
}

/// [`DeviceLayerNormOps::dropout_add_layer_norm_forward`]'s outputs: as
/// [`forward_specs`].
#[allow(clippy::too_many_arguments)]
fn dropout_add_forward_specs(
    x: &TensorSpec,
    _: &TensorSpec,
    gamma: &TensorSpec,
    beta: &TensorSpec,
    eps: &f64,
    _: &f32,
    _: &u64,
) -> (TensorSpec, TensorSpec, TensorSpec) {
    forward_specs(x, gamma, beta, eps)
}

/// The kernel's outputs for `x` `[rows, d]` (with `residual`, of `x·f +
/// r`), or `None` where the inputs are not all f32 (burn's ops run then).
fn kernel_forward(
    x: &CubeTensor,
    residual: Option<(&CubeTensor, SiteMask)>,
    gamma: &CubeTensor,
    beta: &CubeTensor,
    eps: f64,
) -> Option<Normalized<CubeBackend>> {
    let r = residual.as_ref().map(|(r, _)| *r);
    if [Some(x), r, Some(gamma), Some(beta)]
        .into_iter()
        .flatten()
        .any(|t| t.dtype != DType::F32)
    {
        return None;
    }
    let [x, gamma, beta] = [x, gamma, beta].map(|t| into_contiguous(t.clone()));
    let residual = residual.map(|(r, mask)| (into_contiguous(r.clone()), mask));
    let (rows, d) = (x.shape()[0], x.shape()[1]);
    let handles = [&x.handle, &gamma.handle, &beta.handle];
    let residual = residual.as_ref().map(|(r, mask)| (&r.handle, mask));
    let [y, xhat, denom] =
        device::layer_norm_forward(&x.client, handles, residual, rows, d, eps as f32);
    let tensor = |handle, shape: [usize; 2]| {
        CubeTensor::new_contiguous(
            x.client.clone(),
            x.device.clone(),
            Shape::new(shape),
            handle,
            DType::F32,
        )
    };
    Some((
        tensor(y, [rows, d]),
        tensor(xhat, [rows, d]),
        tensor(denom, [rows, 1]),
    ))
}

impl DeviceLayerNormOps for CubeBackend {
    /// One kernel, one cube per row (`terse_kernels::device::
    /// layer_norm_forward`) for f32; other dtypes take burn's ops.
    fn layer_norm_forward(
        x: CubeTensor,
        gamma: CubeTensor,
        beta: CubeTensor,
        eps: f64,
    ) -> Normalized<Self> {
        kernel_forward(&x, None, &gamma, &beta, eps)
            .unwrap_or_else(|| forward_ops::<Self>(x, gamma, beta, eps))
    }

    /// The same kernel, the sum formed in its first pass, for f32.
    fn dropout_add_layer_norm_forward(
        x: CubeTensor,
        residual: CubeTensor,
        gamma: CubeTensor,
        beta: CubeTensor,
        eps: f64,
        prob: f32,
        key: u64,
    ) -> Normalized<Self> {
        let mask = SiteMask::new(prob, key);
        kernel_forward(&x, Some((&residual, mask)), &gamma, &beta, eps).unwrap_or_else(|| {
            dropout_add_forward_ops::<Self>(x, residual, gamma, beta, eps, prob, key)
        })
    }

    /// One kernel, one cube per row (`terse_kernels::device::
    /// layer_norm_input_grad`) for f32; other dtypes take burn's ops.
    fn layer_norm_input_grad(
        g: CubeTensor,
        xhat: CubeTensor,
        denom: CubeTensor,
        gamma: CubeTensor,
    ) -> CubeTensor {
        if [&g, &xhat, &denom, &gamma]
            .iter()
            .any(|t| t.dtype != DType::F32)
        {
            return input_grad::<Self>(g, xhat, denom, gamma);
        }
        let [g, xhat, denom, gamma] = [g, xhat, denom, gamma].map(into_contiguous);
        let (rows, d) = (g.shape()[0], g.shape()[1]);
        let handles = [&g.handle, &xhat.handle, &denom.handle, &gamma.handle];
        let dx = device::layer_norm_input_grad(&g.client, handles, rows, d);
        CubeTensor::new_contiguous(g.client, g.device, Shape::new([rows, d]), dx, DType::F32)
    }
}

/// The closed form as burn ops (the reference of the kernel, and where it
/// does not run): `(g·γ − mean(g·γ) − x̂·mean(g·γ·x̂)) / denom`.
fn input_grad<B: ParallelReduceOps>(
    g: FloatTensor<B>,
    xhat: FloatTensor<B>,
    denom: FloatTensor<B>,
    gamma: FloatTensor<B>,
) -> FloatTensor<B> {
    let d = xhat.shape()[1];
    let g_gamma = B::float_mul(g, B::float_reshape(gamma, Shape::new([1, d])));
    let mean_g = row_means::<B>(g_gamma.clone());
    let mean_g_xhat = row_means::<B>(B::float_mul(g_gamma.clone(), xhat.clone()));
    let centered = B::float_sub(g_gamma, mean_g);
    let dx = B::float_sub(centered, B::float_mul(xhat, mean_g_xhat));
    B::float_div(dx, denom)
}

/// LayerNorm's output in `x`'s shape, with x̂ `[n, d]` and the rows'
/// `sqrt(var + eps)` `[n, 1]` (what the backward pass keeps), as one
/// [`DeviceLayerNormOps::layer_norm_forward`].
fn forward<B: DeviceLayerNormOps>(
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    beta: FloatTensor<B>,
    eps: f64,
) -> Normalized<B> {
    let shape = x.shape();
    let (y, xhat, denom) = B::layer_norm_forward(rows::<B>(x), gamma, beta, eps);
    (B::float_reshape(y, shape), xhat, denom)
}

/// [`DeviceLayerNormOps::layer_norm_forward`] as burn's ops (the reference
/// of the kernel, and where it does not run), for `x` `[n, d]`.
fn forward_ops<B: ParallelReduceOps>(
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    beta: FloatTensor<B>,
    eps: f64,
) -> Normalized<B> {
    let (xhat, denom) = normalize::<B>(x, eps);
    let y = scale_shift::<B>(xhat.clone(), gamma, beta);
    (y, xhat, denom)
}

/// [`DeviceLayerNormOps::dropout_add_layer_norm_forward`] as two steps:
/// the dropout's sum, then [`forward_ops`] (the reference of the kernel,
/// and where it does not run).
#[allow(clippy::too_many_arguments)]
fn dropout_add_forward_ops<B: DeviceLayerNormOps>(
    x: FloatTensor<B>,
    residual: FloatTensor<B>,
    gamma: FloatTensor<B>,
    beta: FloatTensor<B>,
    eps: f64,
    prob: f32,
    key: u64,
) -> Normalized<B> {
    forward_ops::<B>(B::dropped_add(x, residual, prob, key), gamma, beta, eps)
}

/// `x` `[n, d]` normalised per row, and the rows' `sqrt(var + eps)`
/// `[n, 1]`.
fn normalize<B: ParallelReduceOps>(
    x: FloatTensor<B>,
    eps: f64,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let centered = B::float_sub(x.clone(), row_means::<B>(x));
    let var = row_means::<B>(B::float_mul(centered.clone(), centered.clone()));
    let denom = B::float_sqrt(B::float_add_scalar(var, eps.into()));
    (B::float_div(centered, denom.clone()), denom)
}

/// `x·γ + β` with γ and β `[d]` broadcast over the rows of `x` `[n, d]`.
fn scale_shift<B: ParallelReduceOps>(
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    beta: FloatTensor<B>,
) -> FloatTensor<B> {
    let d = x.shape()[1];
    let scaled = B::float_mul(x, B::float_reshape(gamma, Shape::new([1, d])));
    B::float_add(scaled, B::float_reshape(beta, Shape::new([1, d])))
}

#[derive(Debug)]
struct LayerNormBackward;

/// What the backward pass keeps: x̂ `[n, d]`, the denominators `[n, 1]`
/// and γ `[d]`.
type Kept<B> = (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>);

/// LayerNorm's output, x̂ `[n, d]` and the denominators `[n, 1]`.
type Normalized<B> = (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>);

/// From the upstream `grad`, those of γ, β and the normalised input (in
/// `grad`'s shape) that `wanted` asks for, in that order.
fn norm_backward<B: DeviceLayerNormOps>(
    grad: FloatTensor<B>,
    (xhat, denom, gamma): Kept<B>,
    wanted: [bool; 3],
) -> [Option<FloatTensor<B>>; 3] {
    let shape = grad.shape();
    let g = rows::<B>(grad);
    let dgamma = wanted[0].then(|| B::column_sums(B::float_mul(g.clone(), xhat.clone())));
    let dbeta = wanted[1].then(|| B::column_sums(g.clone()));
    let dx =
        wanted[2].then(|| B::float_reshape(B::layer_norm_input_grad(g, xhat, denom, gamma), shape));
    [dgamma, dbeta, dx]
}

impl<B: DeviceLayerNormOps> Backward<B, 3> for LayerNormBackward {
    type State = Kept<B>;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let [x, gamma, beta] = ops.parents;
        let wanted = [gamma.is_some(), beta.is_some(), x.is_some()];
        let computed = norm_backward::<B>(grad, ops.state, wanted);
        for (node, grad) in [gamma, beta, x].into_iter().zip(computed) {
            if let (Some(node), Some(grad)) = (node, grad) {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

/// The backward pass of `dropout_add_norm`: the sum's gradient `∂s` (the
/// residual's), and `∂s·f` for `x`.
#[derive(Debug)]
struct DropoutAddNormBackward;

impl<B: DeviceLayerNormOps> Backward<B, 4> for DropoutAddNormBackward {
    /// What `LayerNormBackward` keeps, and the mask's probability and key.
    type State = (Kept<B>, f32, u64);

    fn backward(self, ops: Ops<Self::State, 4>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let [x, residual, gamma, beta] = ops.parents;
        let (kept, prob, key) = ops.state;
        let input = x.is_some() || residual.is_some();
        let wanted = [gamma.is_some(), beta.is_some(), input];
        let [dgamma, dbeta, ds] = norm_backward::<B>(grad, kept, wanted);
        let dx = x
            .is_some()
            .then(|| B::dropped(ds.clone().unwrap(), prob, key));
        for (node, grad) in [gamma, beta, x, residual]
            .into_iter()
            .zip([dgamma, dbeta, dx, ds])
        {
            if let (Some(node), Some(grad)) = (node, grad) {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

impl<B: DeviceLayerNormOps, C: CheckpointStrategy> DeviceLayerNormOps for Autodiff<B, C> {
    fn dropout_add_norm(
        x: FloatTensor<Self>,
        residual: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        eps: f64,
        prob: f32,
        key: u64,
    ) -> FloatTensor<Self> {
        let nodes = [x.node(), residual.node(), gamma.node(), beta.node()];
        let prep = DropoutAddNormBackward
            .prepare::<C>(nodes)
            .compute_bound()
            .stateful();
        let shape = x.shape();
        let gamma = gamma.into_primitive();
        let (y, xhat, denom) = B::dropout_add_layer_norm_forward(
            rows::<B>(x.into_primitive()),
            rows::<B>(residual.into_primitive()),
            gamma.clone(),
            beta.into_primitive(),
            eps,
            prob,
            key,
        );
        let y = B::float_reshape(y, shape);
        match prep {
            OpsKind::Tracked(prep) => prep.finish(((xhat, denom, gamma), prob, key), y),
            OpsKind::UnTracked(prep) => prep.finish(y),
        }
    }

    fn norm_scale_shift(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        eps: f64,
    ) -> FloatTensor<Self> {
        let nodes = [x.node(), gamma.node(), beta.node()];
        let prep = LayerNormBackward
            .prepare::<C>(nodes)
            .compute_bound()
            .stateful();
        let gamma = gamma.into_primitive();
        let (y, xhat, denom) = forward::<B>(
            x.into_primitive(),
            gamma.clone(),
            beta.into_primitive(),
            eps,
        );
        match prep {
            OpsKind::Tracked(prep) => prep.finish((xhat, denom, gamma), y),
            OpsKind::UnTracked(prep) => prep.finish(y),
        }
    }
}

/// LayerNorm of `x` over its last dimension with γ, β and `eps`, as one
/// [`DeviceLayerNormOps::norm_scale_shift`] step.
pub(crate) fn layer_norm<const D: usize>(
    x: Tensor<D>,
    gamma: Tensor<1>,
    beta: Tensor<1>,
    eps: f64,
) -> Tensor<D> {
    Tensor::from_dispatch(<Dispatch as DeviceLayerNormOps>::norm_scale_shift(
        x.into_dispatch(),
        gamma.into_dispatch(),
        beta.into_dispatch(),
        eps,
    ))
}

/// LayerNorm of `x·f + residual` over the last dimension with γ, β and
/// `eps` (`f` the factors of `SiteMask::new(prob, key)` by position), as
/// one [`DeviceLayerNormOps::dropout_add_norm`] step.
#[allow(clippy::too_many_arguments)]
pub(crate) fn dropout_add_layer_norm<const D: usize>(
    x: Tensor<D>,
    residual: Tensor<D>,
    gamma: Tensor<1>,
    beta: Tensor<1>,
    eps: f64,
    prob: f32,
    key: u64,
) -> Tensor<D> {
    Tensor::from_dispatch(<Dispatch as DeviceLayerNormOps>::dropout_add_norm(
        x.into_dispatch(),
        residual.into_dispatch(),
        gamma.into_dispatch(),
        beta.into_dispatch(),
        eps,
        prob,
        key,
    ))
}
