//! The fused ops as a burn backend extension: the `FusedOps` trait and its
//! flex implementation (forward only: inference and untracked tensors);
//! `autodiff.rs` implements it for `Autodiff<Flex>` (the same forward plus
//! a hand-written backward for each op). The slice kernels live in the
//! op's own file; this file only moves flex tensors in and out of them.

use std::borrow::Cow;

use burn::backend::flex::FlexTensor;
use burn::backend::ops::ModuleOps;
use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::backend::{Backend, DType, Flex, backend_extension};
use burn::tensor::{Shape, TensorData};

use super::add_relu::add_relu_forward;
use super::attention_core::{HeadsShape, attention_forward};
use super::batch_norm::{BatchNormShape, BatchNormStats, batch_norm_forward};
use super::bias_gelu::bias_gelu_forward;
use super::conv2d::{ConvShape, conv2d_forward};
use super::cross_entropy::cross_entropy_forward;
use super::embedding::embedding_backward;
use super::gemm_linear::{self, Weight};
use super::layer_norm::{LayerNormStats, layer_norm_forward};
use super::op_profile::{OpClass, timed};
use terse_compress::dropout::SiteMask;

/// Fused training ops. Implemented for flex and autodiff-over-flex only;
/// [`super`]'s tensor functions route every other backend to burn's ops.
#[backend_extension(Flex, Autodiff)]
pub trait FusedOps: Backend {
    /// LayerNorm over the last dimension.
    fn fused_layer_norm(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        eps: f32,
    ) -> FloatTensor<Self>;
    /// `gelu(x·W + bias)`, W `[in, out]`: a linear layer with the exact GELU
    /// fused into its bias addition.
    fn fused_dense_gelu(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
    ) -> FloatTensor<Self>;
    /// `relu(a + b)` of two tensors of one shape (a residual block's end).
    fn fused_add_relu(a: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self>;
    /// Counter-based dropout.
    fn fused_dropout(x: FloatTensor<Self>, prob: f32, key: u64) -> FloatTensor<Self>;
    /// Mean cross-entropy of logits `[n, c]` against labels `[n]`, shape `[1]`.
    fn fused_cross_entropy(logits: FloatTensor<Self>, labels: IntTensor<Self>)
    -> FloatTensor<Self>;
    /// `x·W + b` over the last dimension, W `[in, out]`; with `transposed`
    /// W is stored `[out, in]` (the tied MLM decoder) and its gradient is
    /// produced in that layout.
    fn fused_linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        transposed: bool,
    ) -> FloatTensor<Self>;
    /// Rows of `weights` `[n, d]` at `ids` `[b, t]`, shape `[b, t, d]`.
    fn fused_embedding(weights: FloatTensor<Self>, ids: IntTensor<Self>) -> FloatTensor<Self>;
    /// The attention core: `dropout(softmax(q·kᵀ·scale + bias))·v` per
    /// head, q, k, v and the output `[b, t, heads·head_dim]` (the heads
    /// side by side in each row, as the linear layers make them), bias
    /// `[b, t]`.
    #[allow(clippy::too_many_arguments)]
    fn fused_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        heads: usize,
        scale: f32,
        prob: f32,
        key: u64,
    ) -> FloatTensor<Self>;
    /// `conv2d(x, weight)` without bias: x `[b, c_in, h, w]`, weight
    /// `[c_out, c_in, kh, kw]`, one group, no dilation, the same `stride`
    /// and zero `padding` on both axes.
    fn fused_conv2d(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        stride: usize,
        padding: usize,
    ) -> FloatTensor<Self>;
    /// Training-mode BatchNorm over dimension 1 with the batch's own
    /// statistics, then ReLU when `relu`: `(output, mean, biased variance)`,
    /// the statistics untracked.
    fn fused_batch_norm(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        eps: f32,
        relu: bool,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);
}

/// The tensor's values as one contiguous f32 slice (a view when possible).
pub(super) fn values(t: &FlexTensor) -> Cow<'_, [f32]> {
    assert_eq!(t.dtype(), DType::F32, "fused ops are f32 only");
    match t.as_slice::<f32>() {
        Some(s) => Cow::Borrowed(s),
        None => Cow::Owned(into_values(t.to_contiguous())),
    }
}

/// The tensor's values, owned (no copy when the tensor held the only
/// reference to contiguous storage).
pub(super) fn into_values(t: FlexTensor) -> Vec<f32> {
    assert_eq!(t.dtype(), DType::F32, "fused ops are f32 only");
    t.into_data()
        .try_into_vec::<f32>()
        .expect("f32 tensor data")
}

pub(super) fn labels_of(t: &FlexTensor) -> Vec<i64> {
    t.clone()
        .into_data()
        .convert::<i64>()
        .try_into_vec::<i64>()
        .expect("integer labels")
}

pub(super) fn shape_of(t: &FlexTensor) -> Shape {
    t.layout().shape().clone()
}

pub(super) fn tensor(values: Vec<f32>, shape: Shape) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(values, shape))
}

/// The gradient of `weights` `[rows, dim]` from the lookup's output
/// gradient `grad` `[b, t, dim]` at `ids` `[b, t]` ([`embedding_backward`]).
pub(super) fn embedding_grad(
    weights: &FlexTensor,
    grad: &FlexTensor,
    ids: &FlexTensor,
) -> FlexTensor {
    let shape = shape_of(weights);
    let [rows, dim] = [shape[0], shape[1]];
    let table = embedding_backward(&labels_of(ids), &values(grad), rows, dim);
    tensor(table, shape)
}

pub(super) fn mask(prob: f32, key: u64) -> Option<SiteMask> {
    (prob > 0.0).then(|| SiteMask::new(prob, key))
}

pub(super) fn layer_norm(
    x: &FlexTensor,
    gamma: &FlexTensor,
    beta: &FlexTensor,
    eps: f32,
) -> (FlexTensor, LayerNormStats) {
    let mut y = vec![0.0; x.layout().shape().num_elements()];
    let stats = layer_norm_forward(&values(x), &values(gamma), &values(beta), eps, &mut y);
    (tensor(y, shape_of(x)), stats)
}

/// `(gelu(x·W + b), x·W)`: the output and the pre-activation without its
/// bias, which the backward pass needs.
pub(super) fn dense_gelu(
    x: &FlexTensor,
    weight: &FlexTensor,
    bias: &FlexTensor,
) -> (FlexTensor, FlexTensor) {
    let h = linear(x, weight, None, false);
    let out = timed(OpClass::Activation, || {
        let mut out = vec![0.0; h.layout().shape().num_elements()];
        bias_gelu_forward(&values(&h), &values(bias), &mut out);
        tensor(out, shape_of(&h))
    });
    (out, h)
}

pub(super) fn dropout(x: FlexTensor, mask: &SiteMask) -> FlexTensor {
    let shape = shape_of(&x);
    let mut v = into_values(x);
    mask.apply_in_place(&mut v);
    tensor(v, shape)
}

pub(super) fn cross_entropy(logits: &FlexTensor, labels: &[i64]) -> (FlexTensor, Vec<f32>) {
    let classes = shape_of(logits).dims::<2>()[1];
    let (lse, loss) = cross_entropy_forward(&values(logits), labels, classes);
    (tensor(vec![loss], Shape::new([1])), lse)
}

/// `x·W (+ b)` over the last dimension of `x`, W `[in, out]` or with
/// `transposed` stored `[out, in]`: one 2-D gemm over all rows
/// ([`gemm_linear`]).
pub(super) fn linear(
    x: &FlexTensor,
    weight: &FlexTensor,
    bias: Option<&FlexTensor>,
    transposed: bool,
) -> FlexTensor {
    timed(OpClass::Matmul, || {
        let w = values(weight);
        let weight = weight_of(weight, &w, transposed);
        let bias = bias.map(values);
        let out = gemm_linear::linear_forward(&values(x), weight, bias.as_deref());
        tensor(out, with_last_dim(shape_of(x), weight.n))
    })
}

/// The gradients of [`linear`] for its upstream gradient `grad`: `∂x` in
/// x's shape, `∂W` in W's stored layout (for the tied decoder `gradᵀ·x`
/// directly, not a transposed `xᵀ·grad` the embedding gradient would be
/// added to through a stride of the vocabulary size), and `∂b`.
pub(super) struct LinearGrads {
    pub x: Option<FlexTensor>,
    pub weight: Option<FlexTensor>,
    pub bias: Option<FlexTensor>,
}

pub(super) fn linear_grads(
    x: &FlexTensor,
    weight: &FlexTensor,
    grad: &FlexTensor,
    transposed: bool,
    (want_x, want_weight, want_bias): (bool, bool, bool),
) -> LinearGrads {
    let w = values(weight);
    let layout = weight_of(weight, &w, transposed);
    let g = values(grad);
    LinearGrads {
        x: want_x.then(|| {
            tensor(
                gemm_linear::linear_x_grad(&g, layout),
                with_last_dim(shape_of(grad), layout.k),
            )
        }),
        weight: want_weight.then(|| {
            tensor(
                gemm_linear::linear_weight_grad(&values(x), &g, layout),
                shape_of(weight),
            )
        }),
        bias: want_bias.then(|| {
            tensor(
                gemm_linear::linear_bias_grad(&g, layout.n),
                Shape::new([layout.n]),
            )
        }),
    }
}

/// The `[k, n]` weight a `[k, n]` (or, `transposed`, `[n, k]`) tensor holds.
fn weight_of<'a>(weight: &FlexTensor, values: &'a [f32], transposed: bool) -> Weight<'a> {
    let [rows, cols] = shape_of(weight).dims::<2>();
    let (k, n) = if transposed {
        (cols, rows)
    } else {
        (rows, cols)
    };
    Weight {
        values,
        k,
        n,
        transposed,
    }
}

fn with_last_dim(shape: Shape, last: usize) -> Shape {
    let rank = shape.num_dims();
    let dims: Vec<usize> = (0..rank)
        .map(|i| if i + 1 == rank { last } else { shape[i] })
        .collect();
    Shape::from(dims)
}

/// The [`HeadsShape`] of `[batch, seq, hidden]` q with `heads` heads.
pub(super) fn heads_shape(q: &FlexTensor, heads: usize) -> HeadsShape {
    let [batch, seq, hidden] = shape_of(q).dims::<3>();
    assert!(
        heads > 0 && hidden % heads == 0,
        "attention: {hidden} values do not split into {heads} heads"
    );
    HeadsShape {
        batch,
        seq,
        heads,
        head_dim: hidden / heads,
    }
}

/// `(context [batch, seq, hidden], probabilities [batch, heads, seq, seq])`.
pub(super) fn attention(
    [q, k, v]: [&FlexTensor; 3],
    bias: &FlexTensor,
    s: &HeadsShape,
    scale: f32,
    mask: Option<&SiteMask>,
) -> (FlexTensor, FlexTensor) {
    timed(OpClass::Attention, || {
        let (context, probs) = attention_forward(
            &values(q),
            &values(k),
            &values(v),
            &values(bias),
            s,
            scale,
            mask,
        );
        let probs_shape = Shape::new([s.batch, s.heads, s.seq, s.seq]);
        (tensor(context, shape_of(q)), tensor(probs, probs_shape))
    })
}

pub(super) fn add_relu(a: FlexTensor, b: &FlexTensor) -> FlexTensor {
    timed(OpClass::Activation, || {
        let shape = shape_of(&a);
        assert_eq!(shape, shape_of(b), "add_relu: operands of different shapes");
        let mut out = into_values(a);
        add_relu_forward(&mut out, &values(b));
        tensor(out, shape)
    })
}

/// The [`ConvShape`] of `conv2d(x, weight)` with `stride` and `padding`.
pub(super) fn conv_shape(
    x: &FlexTensor,
    weight: &FlexTensor,
    stride: usize,
    padding: usize,
) -> ConvShape {
    let [batch, c_in, h, w] = shape_of(x).dims::<4>();
    let [c_out, w_in, kh, kw] = shape_of(weight).dims::<4>();
    assert_eq!(
        w_in, c_in,
        "conv2d: the weight takes {w_in} channels, the input has {c_in}"
    );
    ConvShape {
        batch,
        c_in,
        h,
        w,
        c_out,
        kh,
        kw,
        stride,
        pad: padding,
    }
}

pub(super) fn conv2d(x: &FlexTensor, weight: &FlexTensor, s: &ConvShape) -> FlexTensor {
    timed(OpClass::Matmul, || {
        let out = conv2d_forward(&values(x), &values(weight), s);
        tensor(out, Shape::new([s.batch, s.c_out, s.out_h(), s.out_w()]))
    })
}

/// `[batch, channels, plane]` of a `[batch, channels, …]` tensor.
pub(super) fn batch_norm_shape(x: &FlexTensor) -> BatchNormShape {
    let shape = shape_of(x);
    let (batch, channels) = (shape[0], shape[1]);
    BatchNormShape {
        batch,
        channels,
        plane: shape.num_elements() / (batch * channels).max(1),
    }
}

pub(super) fn batch_norm(
    x: &FlexTensor,
    gamma: &FlexTensor,
    beta: &FlexTensor,
    eps: f32,
    relu: bool,
) -> (FlexTensor, BatchNormStats) {
    timed(OpClass::Norm, || {
        let s = batch_norm_shape(x);
        let mut out = vec![0.0; s.batch * s.channels * s.plane];
        let stats = batch_norm_forward(
            &values(x),
            &values(gamma),
            &values(beta),
            s,
            eps,
            relu,
            &mut out,
        );
        (tensor(out, shape_of(x)), stats)
    })
}

/// A per-channel statistic as a `[channels]` tensor.
pub(super) fn channel_tensor(v: &[f32]) -> FlexTensor {
    tensor(v.to_vec(), Shape::new([v.len()]))
}

impl FusedOps for Flex {
    fn fused_layer_norm(
        x: FlexTensor,
        gamma: FlexTensor,
        beta: FlexTensor,
        eps: f32,
    ) -> FlexTensor {
        timed(OpClass::Norm, || layer_norm(&x, &gamma, &beta, eps).0)
    }

    fn fused_dense_gelu(x: FlexTensor, weight: FlexTensor, bias: FlexTensor) -> FlexTensor {
        dense_gelu(&x, &weight, &bias).0
    }

    fn fused_add_relu(a: FlexTensor, b: FlexTensor) -> FlexTensor {
        add_relu(a, &b)
    }

    fn fused_dropout(x: FlexTensor, prob: f32, key: u64) -> FlexTensor {
        match mask(prob, key) {
            Some(mask) => timed(OpClass::Dropout, || dropout(x, &mask)),
            None => x,
        }
    }

    fn fused_cross_entropy(logits: FlexTensor, labels: FlexTensor) -> FlexTensor {
        timed(OpClass::Loss, || {
            cross_entropy(&logits, &labels_of(&labels)).0
        })
    }

    fn fused_linear(
        x: FlexTensor,
        weight: FlexTensor,
        bias: FlexTensor,
        transposed: bool,
    ) -> FlexTensor {
        linear(&x, &weight, Some(&bias), transposed)
    }

    fn fused_embedding(weights: FlexTensor, ids: FlexTensor) -> FlexTensor {
        timed(OpClass::Embedding, || Flex::embedding(weights, ids))
    }

    fn fused_attention(
        q: FlexTensor,
        k: FlexTensor,
        v: FlexTensor,
        bias: FlexTensor,
        heads: usize,
        scale: f32,
        prob: f32,
        key: u64,
    ) -> FlexTensor {
        let s = heads_shape(&q, heads);
        attention([&q, &k, &v], &bias, &s, scale, mask(prob, key).as_ref()).0
    }

    fn fused_conv2d(
        x: FlexTensor,
        weight: FlexTensor,
        stride: usize,
        padding: usize,
    ) -> FlexTensor {
        conv2d(&x, &weight, &conv_shape(&x, &weight, stride, padding))
    }

    fn fused_batch_norm(
        x: FlexTensor,
        gamma: FlexTensor,
        beta: FlexTensor,
        eps: f32,
        relu: bool,
    ) -> (FlexTensor, FlexTensor, FlexTensor) {
        let (out, stats) = batch_norm(&x, &gamma, &beta, eps, relu);
        (out, channel_tensor(&stats.mean), channel_tensor(&stats.var))
    }
}
