//! Mixed precision as PyTorch's autocast does it: the parameters stay fp32
//! (the master copy the optimizer steps), and inside [`with_half`] the
//! models' matmuls — the linear layers, the attention's two products, the
//! MLM decoder — cast their operands to the half type and compute there,
//! GELU and dropout run on the half activations, while LayerNorm, softmax
//! and the losses cast their input back to fp32 and compute in fp32.
//! burn's cast is an autodiff op whose backward casts the gradient back to
//! the source type, so each fp32 parameter receives an fp32 gradient.
//!
//! The half copy of a weight is made where the forward uses it (burn has
//! no cast cache), once per micro-batch, as autocast does within one
//! forward; it is not kept across steps.

use std::cell::Cell;

use burn::tensor::{DType, FloatDType, Tensor};

thread_local! {
    /// The half type the calling thread's forward computes its matmuls in
    /// (`None`: fp32 throughout).
    static HALF: Cell<Option<FloatDType>> = const { Cell::new(None) };
}

/// Runs `f` (a forward pass) with its matmuls in `half` (`None`: fp32);
/// the caller's setting is restored after.
pub fn with_half<R>(half: Option<FloatDType>, f: impl FnOnce() -> R) -> R {
    let previous = HALF.with(|c| c.replace(half));
    let out = f();
    HALF.with(|c| c.set(previous));
    out
}

/// The half type of the calling thread's forward, if any.
pub fn half() -> Option<FloatDType> {
    HALF.with(Cell::get)
}

/// `x` in the forward's half type (unchanged outside [`with_half`]).
pub fn narrow<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    match half() {
        Some(dtype) => x.cast(dtype),
        None => x,
    }
}

/// `x` in fp32 (a no-op when it is already).
pub fn widen<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    x.cast(FloatDType::F32)
}

/// Whether `x` is an fp32 tensor (the flex kernels' type).
pub(crate) fn is_f32<const D: usize>(x: &Tensor<D>) -> bool {
    x.dtype() == DType::F32
}
