//! Fused training ops for the flex CPU backend (issue: BERT's training step
//! spent more time in chains of small ops than in its matmuls). Each
//! function takes burn tensors and modules, runs the fused kernel on flex
//! (with a hand-written backward under autodiff), and falls back to burn's
//! own ops on any other backend, where nothing changes except that dropout
//! masks come from terse's counter-based hash on every backend.
//!
//! - [`layer_norm`]: LayerNorm over the last dimension;
//! - [`dense_gelu`]: a linear layer with the exact GELU fused into its bias;
//! - dropout: counter-based masks ([`DropoutStream`], in terse-compress, which
//!   the device kernels share);
//! - [`cross_entropy`]: mean cross-entropy from logits;
//! - [`linear`], [`linear_transposed`]: one 2-D gemm over all rows, forward
//!   and each gradient (`gemm_linear.rs`; the tied decoder's gradient in its
//!   stored layout);
//! - [`attention`]: the core (scores, scale + mask + softmax + dropout,
//!   context) per (batch, head) on the linear layers' `[batch, seq,
//!   hidden]` layout, gemm calls at the heads' strides, as one autodiff
//!   node (`attention_core.rs`); on cubecl devices its scale + mask +
//!   softmax + dropout ([`attention_probs`]) one step of one kernel each
//!   way (`device_softmax.rs`);
//! - [`conv2d`], [`batch_norm`] (with the ReLU after it), [`add_relu`]:
//!   ResNet's and VGG's convolution (im2col + one gemm per image), training
//!   BatchNorm and residual `relu(a + b)`;
//! - [`embedding`]: burn's own lookup kernel, as an op whose backward pass
//!   terse owns ([`embedding_backward`]: the table's gradient without
//!   flex's copy of it; timed for [`op_profile`]).

mod add_relu;
mod attention_core;
mod attention_probs;
mod autocast;
mod autodiff;
mod batch_norm;
mod bias_gelu;
mod conv2d;
mod cross_entropy;
mod device_cross_entropy;
mod device_dropout;
mod device_gelu;
mod device_layer_norm;
mod device_linear;
mod device_softmax;
mod embedding;
mod extension;
mod gemm_linear;
mod layer_norm;
mod matmul_routine;
pub mod op_profile;
mod reduce_routine;
mod rows;
pub mod vector_math;

use burn::backend::Dispatch;
use burn::backend::tensor::FloatTensor;
use burn::nn::conv::Conv2d;
use burn::nn::{BatchNorm, Dropout, Embedding, LayerNorm, Linear, PaddingConfig2d};
use burn::tensor::activation::{self, gelu, softmax};
use burn::tensor::{Device, FloatDType, Int, Tensor, TensorData};

use autocast::is_f32;
// `crate::with_avx` in the ops: the SIMD tier the
// compression loops use too.
use terse_compress::with_avx;

pub use add_relu::{add_relu_backward, add_relu_forward};
pub use attention_core::{HeadsShape, attention_backward, attention_forward};
pub use autocast::{half, narrow, widen, with_half};
pub use batch_norm::{BatchNormShape, BatchNormStats, batch_norm_backward, batch_norm_forward};
pub use bias_gelu::{bias_gelu_backward, bias_gelu_forward};
pub use conv2d::{ConvShape, conv2d_backward, conv2d_forward};
pub use cross_entropy::{cross_entropy_backward, cross_entropy_forward};
pub use embedding::embedding_backward;
pub use extension::FusedOps;
pub use layer_norm::{LayerNormStats, layer_norm_backward, layer_norm_forward};
pub use matmul_routine::{
    cublas_present, declined_matmuls, first_decline_reason, is_cublas_routine,
    matmul_routine_names, name_linear_matmul, named_linear_matmul, named_matmul,
};
pub use terse_compress::dropout::{DropoutStream, SiteMask, with_dropout_stream};

/// Elements per parallel work item of the elementwise loops.
const PIECE: usize = 1 << 14;

/// Whether tensors on `device` are flex tensors (with or without
/// autodiff): the fused kernels apply.
pub fn is_flex(device: &Device) -> bool {
    device.clone().without_autodiff() == Device::flex()
}

/// Whether the fused fp32 kernels apply to a matmul op: flex tensors
/// outside mixed precision (under it, burn's ops on half operands).
fn fp32_on_flex(device: &Device) -> bool {
    is_flex(device) && half().is_none()
}

/// A float tensor as the fused ops take it: burn's dispatch primitive.
type Primitive = FloatTensor<Dispatch>;

/// A fused op on burn's dispatch primitives, on an input and its layer's
/// two parameters (weight and bias, or γ and β).
fn fused3<const D: usize, const W: usize>(
    op: impl FnOnce(Primitive, Primitive, Primitive) -> Primitive,
    x: Tensor<D>,
    weight: Tensor<W>,
    bias: Tensor<1>,
) -> Tensor<D> {
    Tensor::from_dispatch(op(
        x.into_dispatch(),
        weight.into_dispatch(),
        bias.into_dispatch(),
    ))
}

/// LayerNorm over the last dimension with `norm`'s γ and β and `eps`
/// (burn's `LayerNorm` keeps its ε private; the model config has it).
pub fn layer_norm<const D: usize>(x: Tensor<D>, norm: &LayerNorm, eps: f64) -> Tensor<D> {
    // In fp32 under mixed precision too (autocast's rule for LayerNorm).
    let x = widen(x);
    match &norm.beta {
        Some(beta) if is_flex(&x.device()) => fused3(
            |x, gamma, beta| <Dispatch as FusedOps>::fused_layer_norm(x, gamma, beta, eps as f32),
            x,
            norm.gamma.val(),
            beta.val(),
        ),
        // A cubecl device: one step whose reductions run a parallel
        // routine (`device_layer_norm.rs`).
        Some(beta) => device_layer_norm::layer_norm(x, norm.gamma.val(), beta.val(), eps),
        None => norm.forward(x),
    }
}

/// `gelu(x·W + b)` of a linear layer, the bias added inside the fused GELU.
pub fn dense_gelu<const D: usize>(x: Tensor<D>, dense: &Linear) -> Tensor<D> {
    match &dense.bias {
        Some(bias) if fp32_on_flex(&x.device()) => fused3(
            <Dispatch as FusedOps>::fused_dense_gelu,
            x,
            dense.weight.val(),
            bias.val(),
        ),
        // A cubecl device: the exact derivative, in f32 (`device_gelu.rs`).
        _ if !is_flex(&x.device()) => device_gelu::gelu(linear(x, dense)),
        _ => gelu(linear(x, dense)),
    }
}

/// `dense`'s `x·W + b`: on flex in fp32 one fused gemm; elsewhere, and
/// under mixed precision, burn's `linear` (what `Linear::forward` calls) on
/// the operands narrowed to the half type (a no-op in fp32).
pub fn linear<const D: usize>(x: Tensor<D>, dense: &Linear) -> Tensor<D> {
    match &dense.bias {
        Some(bias) if fp32_on_flex(&x.device()) => fused3(
            |x, w, b| <Dispatch as FusedOps>::fused_linear(x, w, b, false),
            x,
            dense.weight.val(),
            bias.val(),
        ),
        // A cubecl device: burn's `linear`, with the bias gradient's sum
        // over rows in a parallel routine (`device_linear.rs`).
        Some(bias) if !is_flex(&x.device()) => {
            device_linear::linear(narrow(x), narrow(dense.weight.val()), narrow(bias.val()))
        }
        _ => {
            let bias = dense.bias.as_ref().map(|b| narrow(b.val()));
            burn::tensor::module::linear(narrow(x), narrow(dense.weight.val()), bias)
        }
    }
}

/// `x·Wᵀ + b` with W stored `[out, in]` — BERT's MLM decoder, tied to the
/// word embeddings `[vocab, hidden]`; on flex and on cubecl devices W's
/// gradient is produced in that layout (no transposed copy for the flat
/// gradient buffer).
pub fn linear_transposed(x: Tensor<2>, weight: Tensor<2>, bias: Tensor<1>) -> Tensor<2> {
    if fp32_on_flex(&x.device()) {
        let op = |x, w, b| <Dispatch as FusedOps>::fused_linear(x, w, b, true);
        return fused3(op, x, weight, bias);
    }
    if !is_flex(&x.device()) {
        return device_linear::linear_transposed(narrow(x), narrow(weight), narrow(bias));
    }
    narrow(x).matmul(narrow(weight).transpose()) + narrow(bias).unsqueeze_dim(0)
}

/// `table`'s rows at `ids` `[batch, seq]`.
pub fn embedding(ids: Tensor<2, Int>, table: &Embedding) -> Tensor<3> {
    if is_flex(&ids.device()) {
        return Tensor::from_dispatch(<Dispatch as FusedOps>::fused_embedding(
            table.weight.val().into_dispatch(),
            ids.into_dispatch(),
        ));
    }
    table.forward(ids)
}

/// Multi-head attention's core `dropout(softmax(q·kᵀ·scale + mask_bias))·v`
/// per head; q, k, v and the result `[batch, seq, heads·head_dim]` (the
/// linear layers' layout, heads side by side), `mask_bias` `[batch, seq]`
/// (0 where attended, the lowest float on padding). On flex one task per
/// head reads and writes that layout in place ([`attention_forward`],
/// [`attention_backward`]); elsewhere burn's ops on split heads.
pub fn attention(
    q: Tensor<3>,
    k: Tensor<3>,
    v: Tensor<3>,
    mask_bias: Tensor<2>,
    heads: usize,
    scale: f64,
    layer: &Dropout,
) -> Tensor<3> {
    let device = q.device();
    let (prob, key) = match site(layer, &device) {
        Some(key) => (layer.prob as f32, key),
        None => (0.0, 0),
    };
    if fp32_on_flex(&device) {
        return Tensor::from_dispatch(<Dispatch as FusedOps>::fused_attention(
            q.into_dispatch(),
            k.into_dispatch(),
            v.into_dispatch(),
            mask_bias.into_dispatch(),
            heads,
            scale as f32,
            prob,
            key,
        ));
    }
    // Other backends, and mixed precision: burn's ops, with terse's dropout
    // mask (the same site key the flex path took). Under mixed precision
    // the two products run in the half type and the scores' scale, mask
    // and softmax in fp32 (autocast's rule for softmax); in fp32 the casts
    // are no-ops.
    //
    // Each head's matrix is copied out of the linear layers' layout once,
    // into `[batch·heads, seq, head_dim]` (the reshape of the swapped view
    // is that copy), and the products read only whole heads. Handed the
    // swapped view instead, cubek's matmul copies it itself (a view whose
    // batch stride is shorter than its row stride is "highly permuted" to
    // it) at every product that reads it: k and q again in the backward
    // pass, the context's gradient twice, and each twice more on a device
    // without tensor cores, where `Strategy::Auto` copies before trying
    // its cmma routine and again for the fallback. On lavapipe one pass
    // forward and backward copied 20 tensors, 16 inside the products; now
    // 8, none inside them (`tests/device_attention.rs`, `results/dispatches/`).
    let [batch, seq, hidden] = q.dims();
    let head_dim = hidden / heads;
    let split = |t: Tensor<3>| {
        narrow(t)
            .reshape([batch, seq, heads, head_dim])
            .swap_dims(1, 2)
            .reshape([batch * heads, seq, head_dim])
    };
    // The scores stay `[batch·heads, seq, seq]` (the dropout mask's factor
    // is by position in that row-major order, the same as `[batch, heads,
    // seq, seq]`'s).
    let z = widen(split(q).matmul(split(k).swap_dims(1, 2)));
    let probs = attention_probs(z, mask_bias, scale, (prob > 0.0).then_some((prob, key)));
    narrow(probs)
        .matmul(split(v))
        .reshape([batch, heads, seq, head_dim])
        .swap_dims(1, 2)
        .reshape([batch, seq, hidden])
}

/// Attention probabilities `softmax(z·scale + bias)` over the last axis
/// of the scores `z` `[batch·heads, seq, keys]` (batch-major), each
/// sequence's rows biased by its row of `mask_bias` `[batch, keys]` (0 on
/// tokens, the lowest float on padding), times the factors of the dropout
/// mask `SiteMask::new(prob, key)` for `dropout = Some((prob, key))` by
/// position in `z`. On a cubecl device one step, one kernel each way, the
/// factors hashed where they are used (`device_softmax.rs`); elsewhere
/// burn's ops on the bias repeated per head, then the mask.
pub fn attention_probs(
    z: Tensor<3>,
    mask_bias: Tensor<2>,
    scale: f64,
    dropout: Option<(f32, u64)>,
) -> Tensor<3> {
    if !is_flex(&z.device()) {
        return device_softmax::attention_probs(z, mask_bias, scale, dropout);
    }
    let [heads_batch, _, keys] = z.dims();
    let batch = mask_bias.dims()[0];
    let mask_bias = mask_bias
        .reshape([batch, 1, 1, keys])
        .expand([batch, heads_batch / batch, 1, keys])
        .reshape([heads_batch, 1, keys]);
    let probs = softmax(z.mul_scalar(scale) + mask_bias, 2);
    match dropout {
        Some((prob, key)) => apply_mask(probs, SiteMask::new(prob, key)),
        None => probs,
    }
}

/// `layer`'s dropout with a counter-based mask: identity outside training
/// (no autodiff, or the layer's training flag off) and at probability 0.
pub fn dropout<const D: usize>(x: Tensor<D>, layer: &Dropout) -> Tensor<D> {
    let device = x.device();
    let Some(key) = site(layer, &device) else {
        return x;
    };
    let prob = layer.prob as f32;
    if is_f32(&x) {
        if is_flex(&device) {
            return Tensor::from_dispatch(<Dispatch as FusedOps>::fused_dropout(
                x.into_dispatch(),
                prob,
                key,
            ));
        }
        return device_dropout::dropped(x, None, prob, key);
    }
    apply_mask(x, SiteMask::new(prob, key))
}

/// `layer`'s dropout of `x` widened to f32, plus the f32 `residual`: a
/// residual block's sum. On a cubecl device one step, one kernel each way,
/// no factors kept (`device_dropout.rs`; a half `x` dropped in f32 and
/// rounded once, as [`dropout`] does); otherwise [`dropout`] (in `x`'s
/// type, then widened) and the sum.
pub fn dropout_add<const D: usize>(
    x: Tensor<D>,
    residual: Tensor<D>,
    layer: &Dropout,
) -> Tensor<D> {
    let device = x.device();
    if is_flex(&device) || !is_f32(&residual) {
        return widen(dropout(x, layer)) + residual;
    }
    match site(layer, &device) {
        Some(key) => device_dropout::dropped(x, Some(residual), layer.prob as f32, key),
        None => widen(x) + residual,
    }
}

/// `x` times `mask`'s factors, made on a cubecl device by a kernel (on any
/// other backend on the host).
fn apply_mask<const D: usize>(x: Tensor<D>, mask: SiteMask) -> Tensor<D> {
    let device = x.device();
    let shape = x.shape();
    let factors = match terse_kernels::tensor::device_dropout_factors(&mask, shape.clone(), &device)
    {
        Some(factors) => factors,
        None => {
            let factors: Vec<f32> = (0..shape.num_elements()).map(|j| mask.factor(j)).collect();
            Tensor::<D>::from_data(TensorData::new(factors, shape), &device)
        }
    };
    // Half activations are scaled in f32 and rounded once, as PyTorch's
    // dropout kernel does: the factor 1/(1−p) rounded to bf16 first (1.109
    // for 1.111 at p = 0.1) would shrink every kept activation by 0.16%.
    if is_f32(&x) {
        return x * factors;
    }
    let dtype: FloatDType = x.dtype().into();
    (widen(x) * factors).cast(dtype)
}

/// `layer_norm(dropout_add(x, residual, dropout), norm, eps)`: a post-LN
/// residual block's end. On a cubecl device with `x` in f32 one step, one
/// kernel forward, the sum formed inside and not kept
/// (`device_layer_norm.rs`); otherwise the two.
pub fn dropout_add_layer_norm<const D: usize>(
    x: Tensor<D>,
    residual: Tensor<D>,
    dropout: &Dropout,
    norm: &LayerNorm,
    eps: f64,
) -> Tensor<D> {
    let device = x.device();
    let beta = match &norm.beta {
        Some(beta) if !is_flex(&device) && is_f32(&x) && is_f32(&residual) => beta.val(),
        _ => return layer_norm(dropout_add(x, residual, dropout), norm, eps),
    };
    match site(dropout, &device) {
        Some(key) => device_layer_norm::dropout_add_layer_norm(
            x,
            residual,
            norm.gamma.val(),
            beta,
            eps,
            dropout.prob as f32,
            key,
        ),
        None => layer_norm(x + residual, norm, eps),
    }
}

/// `relu(a + b)`, a residual block's end: one pass each way on flex
/// ([`add_relu_forward`], [`add_relu_backward`]), burn's ops elsewhere.
pub fn add_relu<const D: usize>(a: Tensor<D>, b: Tensor<D>) -> Tensor<D> {
    if is_flex(&a.device()) {
        return Tensor::from_dispatch(<Dispatch as FusedOps>::fused_add_relu(
            a.into_dispatch(),
            b.into_dispatch(),
        ));
    }
    activation::relu(a + b)
}

/// `conv`'s `conv2d(x)` (NCHW): on flex im2col + one gemm per image, both
/// ways ([`conv2d_forward`], [`conv2d_backward`]), for one group, no
/// dilation and the same stride and symmetric padding on both axes;
/// burn's convolution otherwise.
pub fn conv2d(x: Tensor<4>, conv: &Conv2d) -> Tensor<4> {
    let pad = match conv.padding {
        PaddingConfig2d::Valid => Some(0),
        PaddingConfig2d::Explicit(top, left, bottom, right)
            if top == left && top == bottom && top == right =>
        {
            Some(top)
        }
        _ => None,
    };
    let fits = conv.groups == 1 && conv.dilation == [1, 1] && conv.stride[0] == conv.stride[1];
    match pad {
        Some(pad) if fits && is_flex(&x.device()) => {
            let out = Tensor::from_dispatch(<Dispatch as FusedOps>::fused_conv2d(
                x.into_dispatch(),
                conv.weight.val().into_dispatch(),
                conv.stride[0],
                pad,
            ));
            match &conv.bias {
                Some(bias) => {
                    let c_out = bias.dims()[0];
                    out + bias.val().reshape([1, c_out, 1, 1])
                }
                None => out,
            }
        }
        _ => conv.forward(x),
    }
}

/// `norm`'s BatchNorm of `x` `[batch, channels, …]`, then ReLU when
/// `relu`. Training on flex (autodiff, the layer's training flag on) runs
/// [`batch_norm_forward`] and [`batch_norm_backward`] and updates the
/// running statistics exactly as burn's `BatchNorm::forward` does; every
/// other case is burn's module (and burn's ReLU).
pub fn batch_norm<const D: usize>(x: Tensor<D>, norm: &BatchNorm, relu: bool) -> Tensor<D> {
    let device = x.device();
    if !(is_flex(&device) && device.is_autodiff() && norm.training.is_enabled()) {
        let y = norm.forward(x);
        return if relu { activation::relu(y) } else { y };
    }
    let (out, mean, var) = <Dispatch as FusedOps>::fused_batch_norm(
        x.into_dispatch(),
        norm.gamma.val().into_dispatch(),
        norm.beta.val().into_dispatch(),
        norm.epsilon as f32,
        relu,
    );
    let (mean, var) = (
        Tensor::<1>::from_dispatch(mean),
        Tensor::<1>::from_dispatch(var),
    );
    let m = norm.momentum;
    let running_mean = norm.running_mean.value_sync().to_device(&device);
    let running_var = norm.running_var.value_sync().to_device(&device);
    let running_mean = running_mean
        .mul_scalar(1.0 - m)
        .add(mean.detach().mul_scalar(m));
    let running_var = running_var
        .mul_scalar(1.0 - m)
        .add(var.detach().mul_scalar(m));
    norm.running_mean.update(running_mean.detach());
    norm.running_var.update(running_var.detach());
    Tensor::from_dispatch(out)
}

/// Mean cross-entropy of `logits` `[n, classes]` against `labels` `[n]`.
pub fn cross_entropy(logits: Tensor<2>, labels: Tensor<1, Int>) -> Tensor<1> {
    // In fp32 under mixed precision too (autocast's rule for losses).
    let logits = widen(logits);
    let device = logits.device();
    if is_flex(&device) {
        return Tensor::from_dispatch(<Dispatch as FusedOps>::fused_cross_entropy(
            logits.into_dispatch(),
            labels.into_dispatch(),
        ));
    }
    // A cubecl device: one step whose row reductions run a parallel
    // routine and whose backward pass reduces nothing
    // (`device_cross_entropy.rs`).
    device_cross_entropy::mean_cross_entropy(logits, labels)
}

/// The mask key of this dropout call, `None` when the layer is inactive.
/// Every active call takes the next site of the thread's stream.
fn site(layer: &Dropout, device: &Device) -> Option<u64> {
    (layer.training.is_enabled() && device.is_autodiff() && layer.prob > 0.0)
        .then(terse_compress::dropout::next_site_key)
}
