//! GELU on cubecl devices as one autodiff step with the exact derivative,
//! its arithmetic in f32 for a half tensor (f16, bf16).
//!
//! burn's `gelu` is exact (`x·Φ(x)`, Φ by `erf`), but its backward pass
//! (`gelu_backward`'s default, which neither burn-cubecl nor burn-fusion
//! overrides) is the derivative of the tanh approximation: up to 8.7e-4
//! off the exact derivative, which PyTorch's `gelu` and flex's fused GELU
//! use. And in fp16 it builds `x³` in the half type: inf from |x| ≈ 40.3,
//! then `inf·0` = NaN, a step the loss scaler skips and skips again until
//! the run stops at the scale's floor. Here the forward pass is burn's
//! arithmetic (so an f32 run's activations keep their bits), taken in f32
//! for a half input, and the backward pass is
//! `g·(Φ(x) + x·φ(x))`, `φ(x) = exp(−x²/2)/√(2π)`, in f32, from the kept
//! input alone. Element-wise throughout: burn's fusion makes each pass one
//! kernel.

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::tensor::FloatTensor;
use burn::backend::wgpu::CubeBackend;
use burn::backend::{Backend, DType, Dispatch, TensorMetadata, backend_extension};
use burn::tensor::{FloatDType, Tensor};

/// GELU with its exact derivative.
#[backend_extension(Cube, Fusion, Autodiff)]
pub trait DeviceGeluOps: Backend {
    /// `x·Φ(x)` (burn's arithmetic, in f32), in `x`'s type.
    #[fusion(default)]
    fn exact_gelu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        forward::<Self>(x)
    }

    /// `g·(Φ(x) + x·φ(x))` (in f32), in `g`'s type.
    #[fusion(default)]
    fn exact_gelu_grad(x: FloatTensor<Self>, g: FloatTensor<Self>) -> FloatTensor<Self> {
        input_grad::<Self>(x, g)
    }
}

impl DeviceGeluOps for CubeBackend {}

/// Whether `dtype` is a half type, computed here in f32.
fn is_half(dtype: DType) -> bool {
    matches!(dtype, DType::F16 | DType::BF16)
}

/// `x` in f32 if it is half, and the type to return to.
fn in_f32<B: Backend>(x: FloatTensor<B>) -> (FloatTensor<B>, DType) {
    let dtype = x.dtype();
    let x = if is_half(dtype) {
        B::float_cast(x, FloatDType::F32)
    } else {
        x
    };
    (x, dtype)
}

/// `y` back in `dtype`.
fn back_to<B: Backend>(y: FloatTensor<B>, dtype: DType) -> FloatTensor<B> {
    if is_half(dtype) {
        B::float_cast(y, dtype.into())
    } else {
        y
    }
}

/// burn's `gelu`: `x·(1 + erf(x/√2))/2`.
fn forward<B: Backend>(x: FloatTensor<B>) -> FloatTensor<B> {
    let (x, dtype) = in_f32::<B>(x);
    let phi = B::float_erf(B::float_div_scalar(
        x.clone(),
        std::f64::consts::SQRT_2.into(),
    ));
    let y = B::float_mul(x, B::float_add_scalar(phi, 1f32.into()));
    back_to::<B>(B::float_div_scalar(y, 2f32.into()), dtype)
}

/// `g·(Φ(x) + x·φ(x))` with `Φ(x) = (1 + erf(x/√2))/2` and
/// `φ(x) = exp(−x²/2)/√(2π)`.
fn input_grad<B: Backend>(x: FloatTensor<B>, g: FloatTensor<B>) -> FloatTensor<B> {
    let (x, _) = in_f32::<B>(x);
    let (g, dtype) = in_f32::<B>(g);
    let erf = B::float_erf(B::float_div_scalar(
        x.clone(),
        std::f64::consts::SQRT_2.into(),
    ));
    let cdf = B::float_mul_scalar(B::float_add_scalar(erf, 1f32.into()), 0.5f32.into());
    let half_square = B::float_mul_scalar(B::float_mul(x.clone(), x.clone()), (-0.5f32).into());
    let inv_sqrt_2pi = 1.0 / (2.0 * std::f64::consts::PI).sqrt();
    let pdf = B::float_mul_scalar(B::float_exp(half_square), inv_sqrt_2pi.into());
    let slope = B::float_add(cdf, B::float_mul(x, pdf));
    back_to::<B>(B::float_mul(g, slope), dtype)
}

#[derive(Debug)]
struct GeluBackward;

impl<B: DeviceGeluOps> Backward<B, 1> for GeluBackward {
    /// The input.
    type State = FloatTensor<B>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_x] = ops.parents;
        let g = grads.consume::<B>(&ops.node);
        if let Some(node) = node_x {
            grads.register::<B>(node.id, B::exact_gelu_grad(ops.state, g));
        }
    }
}

impl<B: DeviceGeluOps, C: CheckpointStrategy> DeviceGeluOps for Autodiff<B, C> {
    fn exact_gelu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        let prep = GeluBackward
            .prepare::<C>([x.node()])
            .compute_bound()
            .stateful();
        let x = x.into_primitive();
        match prep {
            OpsKind::Tracked(prep) => prep.finish(x.clone(), B::exact_gelu(x)),
            OpsKind::UnTracked(prep) => prep.finish(B::exact_gelu(x)),
        }
    }
}

/// GELU of `x` on a cubecl device, as one [`DeviceGeluOps::exact_gelu`]
/// step.
pub(crate) fn gelu<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    Tensor::from_dispatch(<Dispatch as DeviceGeluOps>::exact_gelu(x.into_dispatch()))
}
