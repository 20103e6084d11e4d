//! Dropout on cubecl devices as one autodiff step, one kernel each way:
//! `y = x·f (+ r)`, each factor `f` hashed where it is used with the CPU's
//! `SiteMask` hash (`terse_kernels::device::dropped`), and backward `∂x =
//! g·f` (the same kernel on `g`; the residual's gradient is `g`).
//!
//! The earlier path made the factors as a tensor of `x`'s size (a kernel,
//! after uploading the mask's keys), multiplied them in, and autodiff kept
//! them for the backward product: per residual block of BERT-base at batch
//! 32 and seq 128 a 12.6 MB tensor made, kept and read again, and on
//! lavapipe two dispatches forward where the residual's sum now takes one.
//! f32 only: under mixed precision the activations are dropped in the half
//! type and widened (`lib.rs`'s `dropout_add`), as on the CPU.

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, binary, unary};
use burn::backend::fusion::custom::TensorSpec;
use burn::backend::ops::FloatTensorOps;
use burn::backend::tensor::FloatTensor;
use burn::backend::wgpu::{CubeBackend, CubeTensor};
use burn::backend::{Backend, DType, Dispatch, TensorMetadata, backend_extension};
use burn::tensor::{Tensor, TensorData};
use burn_cubecl::cubecl::ir::{ElemType, FloatKind};
use burn_cubecl::kernel::into_contiguous;
use terse_compress::dropout::SiteMask;
use terse_kernels::device;

use crate::reduce_routine::same_shape;

/// Dropout with counter-based masks, factors computed where used.
#[backend_extension(Cube, Fusion, Autodiff)]
pub trait DeviceDropoutOps: Backend {
    /// `x` times the factors of `SiteMask::new(prob, key)` by position.
    #[fusion(dtype = x, shape = same_shape(x))]
    fn dropped(x: FloatTensor<Self>, prob: f32, key: u64) -> FloatTensor<Self> {
        let factors = host_factors::<Self>(&x, &SiteMask::new(prob, key));
        Self::float_mul(x, factors)
    }

    /// [`DeviceDropoutOps::dropped`] plus `residual` (of `x`'s shape), in
    /// the residual's type. A half `x` is dropped in f32, rounded to its
    /// type once and widened (mixed precision's `widen(dropout(x)) + r`).
    #[fusion(dtype = residual, shape = same_shape(x))]
    fn dropped_add(
        x: FloatTensor<Self>,
        residual: FloatTensor<Self>,
        prob: f32,
        key: u64,
    ) -> FloatTensor<Self> {
        dropped_add_ops::<Self>(x, residual, prob, key)
    }

    /// The gradient of [`DeviceDropoutOps::dropped_add`]'s half `x` (of
    /// type `dtype`) from the upstream `g` of the residual's type:
    /// `dtype(wide(dtype(g))·f)`, the widening's gradient rounded first.
    #[fusion(meta = half_grad_spec)]
    fn dropped_half_grad(
        g: FloatTensor<Self>,
        dtype: DType,
        prob: f32,
        key: u64,
    ) -> FloatTensor<Self> {
        dropped_half_grad_ops::<Self>(g, dtype, prob, key)
    }
}

/// [`DeviceDropoutOps::dropped_add`] as burn's ops, the factors made on
/// the host (the reference, and where the kernels do not run).
fn dropped_add_ops<B: DeviceDropoutOps>(
    x: FloatTensor<B>,
    residual: FloatTensor<B>,
    prob: f32,
    key: u64,
) -> FloatTensor<B> {
    let (dtype, wide) = (x.dtype(), residual.dtype());
    if dtype == wide {
        return B::float_add(B::dropped(x, prob, key), residual);
    }
    let x = B::float_cast(x, wide.into());
    let factors = host_factors::<B>(&x, &SiteMask::new(prob, key));
    let dropped = B::float_cast(B::float_mul(x, factors), dtype.into());
    B::float_add(B::float_cast(dropped, wide.into()), residual)
}

/// [`DeviceDropoutOps::dropped_half_grad`] as burn's ops, likewise.
fn dropped_half_grad_ops<B: Backend>(
    g: FloatTensor<B>,
    dtype: DType,
    prob: f32,
    key: u64,
) -> FloatTensor<B> {
    let wide = g.dtype();
    let g = B::float_cast(B::float_cast(g, dtype.into()), wide.into());
    let factors = host_factors::<B>(&g, &SiteMask::new(prob, key));
    B::float_cast(B::float_mul(g, factors), dtype.into())
}

/// [`DeviceDropoutOps::dropped_half_grad`]'s output: `g`'s shape in `dtype`.
fn half_grad_spec(g: &TensorSpec, dtype: &DType, _: &f32, _: &u64) -> TensorSpec {
    TensorSpec::new(g.shape.clone(), *dtype)
}

/// cubecl's name for a half float type, `None` for any other.
fn half_elem(dtype: DType) -> Option<ElemType> {
    match dtype {
        DType::F16 => Some(ElemType::Float(FloatKind::F16)),
        DType::BF16 => Some(ElemType::Float(FloatKind::BF16)),
        _ => None,
    }
}

/// `mask`'s factors for every element of `like`, made on the host (the
/// reference; the kernels hash them where they use them).
pub(crate) fn host_factors<B: Backend>(like: &FloatTensor<B>, mask: &SiteMask) -> FloatTensor<B> {
    let shape = like.shape();
    let factors: Vec<f32> = (0..shape.num_elements()).map(|j| mask.factor(j)).collect();
    let data = TensorData::new(factors, shape).convert_dtype(like.dtype());
    B::float_from_data(data, &like.device())
}

/// The kernel's output for `x` (and `residual`), or `None` where the
/// trait's default body runs instead (a type other than f32).
fn launch(
    x: &CubeTensor,
    residual: Option<&CubeTensor>,
    prob: f32,
    key: u64,
) -> Option<CubeTensor> {
    if x.dtype != DType::F32 || residual.is_some_and(|r| r.dtype != DType::F32) {
        return None;
    }
    let x = into_contiguous(x.clone());
    let residual = residual.map(|r| into_contiguous(r.clone()));
    let len = x.shape().num_elements();
    let mask = SiteMask::new(prob, key);
    let y = device::dropped(
        &x.client,
        &mask,
        &x.handle,
        residual.as_ref().map(|r| &r.handle),
        len,
    );
    let shape = x.shape();
    Some(CubeTensor::new_contiguous(
        x.client,
        x.device,
        shape,
        y,
        DType::F32,
    ))
}

impl DeviceDropoutOps for CubeBackend {
    fn dropped(x: CubeTensor, prob: f32, key: u64) -> CubeTensor {
        launch(&x, None, prob, key).unwrap_or_else(|| {
            let factors = host_factors::<Self>(&x, &SiteMask::new(prob, key));
            Self::float_mul(x, factors)
        })
    }

    fn dropped_add(x: CubeTensor, residual: CubeTensor, prob: f32, key: u64) -> CubeTensor {
        if let Some(y) = launch(&x, Some(&residual), prob, key) {
            return y;
        }
        match half_elem(x.dtype) {
            Some(half) if residual.dtype == DType::F32 => {
                let (x, r) = (into_contiguous(x), into_contiguous(residual));
                let (len, shape) = (x.shape().num_elements(), x.shape());
                let mask = SiteMask::new(prob, key);
                let y = device::dropped_half_add(&x.client, &mask, &x.handle, half, &r.handle, len);
                CubeTensor::new_contiguous(x.client, x.device, shape, y, DType::F32)
            }
            _ => dropped_add_ops::<Self>(x, residual, prob, key),
        }
    }

    fn dropped_half_grad(g: CubeTensor, dtype: DType, prob: f32, key: u64) -> CubeTensor {
        match half_elem(dtype) {
            Some(half) if g.dtype == DType::F32 => {
                let g = into_contiguous(g);
                let (len, shape) = (g.shape().num_elements(), g.shape());
                let mask = SiteMask::new(prob, key);
                let dx = device::dropped_half_grad(&g.client, &mask, &g.handle, half, len);
                CubeTensor::new_contiguous(g.client, g.device, shape, dx, dtype)
            }
            _ => dropped_half_grad_ops::<Self>(g, dtype, prob, key),
        }
    }
}

/// The backward pass of `dropped` (one parent) and `dropped_add` (two):
/// `∂x = g·f`, `∂residual = g`. Keeps only the mask.
#[derive(Debug)]
struct DroppedBackward;

impl<B: DeviceDropoutOps> Backward<B, 1> for DroppedBackward {
    type State = (f32, u64);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (prob, key) = ops.state;
        unary::<B, _>(ops.parents, ops.node, grads, |g| B::dropped(g, prob, key));
    }
}

impl<B: DeviceDropoutOps> Backward<B, 2> for DroppedBackward {
    /// The mask, and `x`'s type when it is not the residual's.
    type State = (f32, u64, Option<DType>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (prob, key, half) = ops.state;
        binary::<B, _, _>(
            ops.parents,
            ops.node,
            grads,
            |g| match half {
                Some(dtype) => B::dropped_half_grad(g, dtype, prob, key),
                None => B::dropped(g, prob, key),
            },
            |g| g,
        );
    }
}

impl<B: DeviceDropoutOps, C: CheckpointStrategy> DeviceDropoutOps for Autodiff<B, C> {
    fn dropped(x: FloatTensor<Self>, prob: f32, key: u64) -> FloatTensor<Self> {
        let prep = <DroppedBackward as Backward<B, 1>>::prepare::<C>(DroppedBackward, [x.node()])
            .compute_bound()
            .stateful();
        let y = B::dropped(x.into_primitive(), prob, key);
        match prep {
            OpsKind::Tracked(prep) => prep.finish((prob, key), y),
            OpsKind::UnTracked(prep) => prep.finish(y),
        }
    }

    fn dropped_add(
        x: FloatTensor<Self>,
        residual: FloatTensor<Self>,
        prob: f32,
        key: u64,
    ) -> FloatTensor<Self> {
        let nodes = [x.node(), residual.node()];
        let prep = <DroppedBackward as Backward<B, 2>>::prepare::<C>(DroppedBackward, nodes)
            .compute_bound()
            .stateful();
        let (x, residual) = (x.into_primitive(), residual.into_primitive());
        let half = (x.dtype() != residual.dtype()).then(|| x.dtype());
        let y = B::dropped_add(x, residual, prob, key);
        match prep {
            OpsKind::Tracked(prep) => prep.finish((prob, key, half), y),
            OpsKind::UnTracked(prep) => prep.finish(y),
        }
    }
}

/// `x` times the factors of `SiteMask::new(prob, key)`, plus `residual`
/// when given, as one [`DeviceDropoutOps`] step.
pub(crate) fn dropped<const D: usize>(
    x: Tensor<D>,
    residual: Option<Tensor<D>>,
    prob: f32,
    key: u64,
) -> Tensor<D> {
    let x = x.into_dispatch();
    Tensor::from_dispatch(match residual {
        Some(residual) => {
            <Dispatch as DeviceDropoutOps>::dropped_add(x, residual.into_dispatch(), prob, key)
        }
        None => <Dispatch as DeviceDropoutOps>::dropped(x, prob, key),
    })
}
