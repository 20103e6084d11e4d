//! The fused ops as a burn backend extension: the `FusedOps` trait, its
//! flex implementation (forward only: inference and untracked tensors) and
//! its `Autodiff<Flex>` implementation (the same forward plus a
//! hand-written backward for each op). The slice kernels live in the
//! op's own file; this file only moves flex tensors in and out of them.

use std::borrow::Cow;
use std::sync::Arc;

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, unary};
use burn::backend::flex::FlexTensor;
use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::backend::{Backend, DType, Flex, backend_extension};
use burn::tensor::{Shape, TensorData};

use super::attention_probs::{ScoresShape, attention_probs_backward, attention_probs_forward};
use super::bias_gelu::{bias_gelu_backward, bias_gelu_forward};
use super::cross_entropy::{cross_entropy_backward, cross_entropy_forward};
use super::dropout::SiteMask;
use super::layer_norm::{LayerNormStats, layer_norm_backward, layer_norm_forward};

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
    /// `dropout(softmax(scores·scale + bias))`, scores `[b, h, q, k]`, bias
    /// `[b, k]`; `prob` 0 for no dropout.
    fn fused_attention_probs(
        scores: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        scale: f32,
        prob: f32,
        key: u64,
    ) -> FloatTensor<Self>;
    /// `gelu(h + bias)` over the last dimension.
    fn fused_bias_gelu(h: FloatTensor<Self>, bias: FloatTensor<Self>) -> FloatTensor<Self>;
    /// Counter-based dropout.
    fn fused_dropout(x: FloatTensor<Self>, prob: f32, key: u64) -> FloatTensor<Self>;
    /// Mean cross-entropy of logits `[n, c]` against labels `[n]`, shape `[1]`.
    fn fused_cross_entropy(logits: FloatTensor<Self>, labels: IntTensor<Self>)
    -> FloatTensor<Self>;
}

/// The tensor's values as one contiguous f32 slice (a view when possible).
fn values(t: &FlexTensor) -> Cow<'_, [f32]> {
    assert_eq!(t.dtype(), DType::F32, "fused ops are f32 only");
    match t.as_slice::<f32>() {
        Some(s) => Cow::Borrowed(s),
        None => Cow::Owned(into_values(t.to_contiguous())),
    }
}

/// The tensor's values, owned (no copy when the tensor held the only
/// reference to contiguous storage).
fn into_values(t: FlexTensor) -> Vec<f32> {
    assert_eq!(t.dtype(), DType::F32, "fused ops are f32 only");
    t.into_data()
        .try_into_vec::<f32>()
        .expect("f32 tensor data")
}

fn labels_of(t: &FlexTensor) -> Vec<i64> {
    t.clone()
        .into_data()
        .convert::<i64>()
        .try_into_vec::<i64>()
        .expect("integer labels")
}

fn shape_of(t: &FlexTensor) -> Shape {
    t.layout().shape().clone()
}

fn tensor(values: Vec<f32>, shape: Shape) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(values, shape))
}

fn mask(prob: f32, key: u64) -> Option<SiteMask> {
    (prob > 0.0).then(|| SiteMask::new(prob, key))
}

fn layer_norm(
    x: &FlexTensor,
    gamma: &FlexTensor,
    beta: &FlexTensor,
    eps: f32,
) -> (FlexTensor, LayerNormStats) {
    let mut y = vec![0.0; x.layout().shape().num_elements()];
    let stats = layer_norm_forward(&values(x), &values(gamma), &values(beta), eps, &mut y);
    (tensor(y, shape_of(x)), stats)
}

fn attention_probs(
    scores: &FlexTensor,
    bias: &FlexTensor,
    scale: f32,
    mask: Option<&SiteMask>,
) -> (FlexTensor, Option<FlexTensor>) {
    let shape = shape_of(scores);
    let dims = shape.dims::<4>();
    let scores_shape = ScoresShape {
        rows_per_batch: dims[1] * dims[2],
        keys: dims[3],
    };
    let n = shape.num_elements();
    let mut probs = vec![0.0; n];
    let mut out = mask.map(|_| vec![0.0; n]);
    attention_probs_forward(
        &values(scores),
        &values(bias),
        scores_shape,
        scale,
        &mut probs,
        mask.zip(out.as_deref_mut()),
    );
    (
        tensor(probs, shape.clone()),
        out.map(|out| tensor(out, shape)),
    )
}

fn bias_gelu(h: &FlexTensor, bias: &FlexTensor) -> FlexTensor {
    let mut out = vec![0.0; h.layout().shape().num_elements()];
    bias_gelu_forward(&values(h), &values(bias), &mut out);
    tensor(out, shape_of(h))
}

fn dropout(x: FlexTensor, mask: &SiteMask) -> FlexTensor {
    let shape = shape_of(&x);
    let mut v = into_values(x);
    mask.apply_in_place(&mut v);
    tensor(v, shape)
}

fn cross_entropy(logits: &FlexTensor, labels: &[i64]) -> (FlexTensor, Vec<f32>) {
    let classes = shape_of(logits).dims::<2>()[1];
    let (lse, loss) = cross_entropy_forward(&values(logits), labels, classes);
    (tensor(vec![loss], Shape::new([1])), lse)
}

impl FusedOps for Flex {
    fn fused_layer_norm(
        x: FlexTensor,
        gamma: FlexTensor,
        beta: FlexTensor,
        eps: f32,
    ) -> FlexTensor {
        layer_norm(&x, &gamma, &beta, eps).0
    }

    fn fused_attention_probs(
        scores: FlexTensor,
        bias: FlexTensor,
        scale: f32,
        prob: f32,
        key: u64,
    ) -> FlexTensor {
        let mask = mask(prob, key);
        let (probs, dropped) = attention_probs(&scores, &bias, scale, mask.as_ref());
        dropped.unwrap_or(probs)
    }

    fn fused_bias_gelu(h: FlexTensor, bias: FlexTensor) -> FlexTensor {
        bias_gelu(&h, &bias)
    }

    fn fused_dropout(x: FlexTensor, prob: f32, key: u64) -> FlexTensor {
        match mask(prob, key) {
            Some(mask) => dropout(x, &mask),
            None => x,
        }
    }

    fn fused_cross_entropy(logits: FlexTensor, labels: FlexTensor) -> FlexTensor {
        cross_entropy(&logits, &labels_of(&labels)).0
    }
}

#[derive(Debug)]
struct LayerNormBackward;

impl Backward<Flex, 3> for LayerNormBackward {
    type State = (FlexTensor, FlexTensor, Arc<LayerNormStats>);

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_x, node_gamma, node_beta] = ops.parents;
        let grad = grads.consume::<Flex>(&ops.node);
        let (x, gamma, stats) = ops.state;
        let shape = shape_of(&x);
        let mut dx = vec![0.0; shape.num_elements()];
        let (dgamma, dbeta) = layer_norm_backward(
            &values(&grad),
            &values(&x),
            &values(&gamma),
            &stats,
            &mut dx,
        );
        let d = dgamma.len();
        if let Some(node) = node_x {
            grads.register::<Flex>(node.id, tensor(dx, shape));
        }
        if let Some(node) = node_gamma {
            grads.register::<Flex>(node.id, tensor(dgamma, Shape::new([d])));
        }
        if let Some(node) = node_beta {
            grads.register::<Flex>(node.id, tensor(dbeta, Shape::new([d])));
        }
    }
}

#[derive(Debug)]
struct AttentionProbsBackward;

impl Backward<Flex, 1> for AttentionProbsBackward {
    type State = (FlexTensor, f32, Option<SiteMask>);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (probs, scale, mask) = ops.state;
        unary::<Flex, _>(ops.parents, ops.node, grads, |grad| {
            let shape = shape_of(&probs);
            let keys = shape.dims::<4>()[3];
            let mut g = into_values(grad);
            attention_probs_backward(&mut g, &values(&probs), keys, scale, mask.as_ref());
            tensor(g, shape)
        });
    }
}

#[derive(Debug)]
struct BiasGeluBackward;

impl Backward<Flex, 2> for BiasGeluBackward {
    type State = (FlexTensor, FlexTensor);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_h, node_bias] = ops.parents;
        let grad = grads.consume::<Flex>(&ops.node);
        let (h, bias) = ops.state;
        let shape = shape_of(&h);
        let mut g = into_values(grad);
        let dbias = bias_gelu_backward(&mut g, &values(&h), &values(&bias));
        if let Some(node) = node_h {
            grads.register::<Flex>(node.id, tensor(g, shape));
        }
        if let Some(node) = node_bias {
            let d = dbias.len();
            grads.register::<Flex>(node.id, tensor(dbias, Shape::new([d])));
        }
    }
}

#[derive(Debug)]
struct DropoutBackward;

impl Backward<Flex, 1> for DropoutBackward {
    type State = SiteMask;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let mask = ops.state;
        unary::<Flex, _>(ops.parents, ops.node, grads, |grad| dropout(grad, &mask));
    }
}

#[derive(Debug)]
struct CrossEntropyBackward;

impl Backward<Flex, 1> for CrossEntropyBackward {
    type State = (FlexTensor, Arc<Vec<i64>>, Arc<Vec<f32>>);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (logits, labels, lse) = ops.state;
        unary::<Flex, _>(ops.parents, ops.node, grads, |grad| {
            let shape = shape_of(&logits);
            let classes = shape.dims::<2>()[1];
            let upstream = values(&grad)[0];
            let mut out = vec![0.0; shape.num_elements()];
            cross_entropy_backward(&values(&logits), &labels, &lse, classes, upstream, &mut out);
            tensor(out, shape)
        });
    }
}

impl<C: CheckpointStrategy> FusedOps for Autodiff<Flex, C> {
    fn fused_layer_norm(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        eps: f32,
    ) -> FloatTensor<Self> {
        let prep = LayerNormBackward
            .prepare::<C>([x.node(), gamma.node(), beta.node()])
            .compute_bound()
            .stateful();
        let (y, stats) = layer_norm(x.primitive(), gamma.primitive(), beta.primitive(), eps);
        match prep {
            OpsKind::Tracked(prep) => prep.finish(
                (
                    x.primitive().clone(),
                    gamma.primitive().clone(),
                    Arc::new(stats),
                ),
                y,
            ),
            OpsKind::UnTracked(prep) => prep.finish(y),
        }
    }

    fn fused_attention_probs(
        scores: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        scale: f32,
        prob: f32,
        key: u64,
    ) -> FloatTensor<Self> {
        // The additive mask is a constant: only the scores get a gradient.
        let prep = AttentionProbsBackward
            .prepare::<C>([scores.node()])
            .compute_bound()
            .stateful();
        let mask = mask(prob, key);
        let (probs, dropped) =
            attention_probs(scores.primitive(), bias.primitive(), scale, mask.as_ref());
        let out = dropped.unwrap_or_else(|| probs.clone());
        match prep {
            OpsKind::Tracked(prep) => prep.finish((probs, scale, mask), out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }

    fn fused_bias_gelu(h: FloatTensor<Self>, bias: FloatTensor<Self>) -> FloatTensor<Self> {
        let prep = BiasGeluBackward
            .prepare::<C>([h.node(), bias.node()])
            .compute_bound()
            .stateful();
        let out = bias_gelu(h.primitive(), bias.primitive());
        match prep {
            OpsKind::Tracked(prep) => {
                prep.finish((h.primitive().clone(), bias.primitive().clone()), out)
            }
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }

    fn fused_dropout(x: FloatTensor<Self>, prob: f32, key: u64) -> FloatTensor<Self> {
        let Some(mask) = mask(prob, key) else {
            return x;
        };
        let prep = DropoutBackward
            .prepare::<C>([x.node()])
            .compute_bound()
            .stateful();
        let out = dropout(x.primitive().clone(), &mask);
        match prep {
            OpsKind::Tracked(prep) => prep.finish(mask, out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }

    fn fused_cross_entropy(logits: FloatTensor<Self>, labels: FlexTensor) -> FloatTensor<Self> {
        let prep = CrossEntropyBackward
            .prepare::<C>([logits.node()])
            .compute_bound()
            .stateful();
        let labels = labels_of(&labels);
        let (loss, lse) = cross_entropy(logits.primitive(), &labels);
        match prep {
            OpsKind::Tracked(prep) => prep.finish(
                (logits.primitive().clone(), Arc::new(labels), Arc::new(lse)),
                loss,
            ),
            OpsKind::UnTracked(prep) => prep.finish(loss),
        }
    }
}
