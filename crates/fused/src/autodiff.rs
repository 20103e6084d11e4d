//! `FusedOps` for `Autodiff<Flex>`: each op's flex forward (from
//! `extension.rs`) registered with a hand-written backward pass. Backward
//! passes regenerate what is cheap to recompute (dropout masks) and keep
//! what is not (softmax probabilities, LayerNorm's per-row statistics).

use std::sync::Arc;

use burn::backend::Flex;
use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, NodeGuard, Ops, OpsKind, unary};
use burn::backend::flex::FlexTensor;
use burn::backend::ops::{FloatTensorOps, ModuleOps};
use burn::backend::tensor::FloatTensor;
use burn::tensor::{Shape, TensorData};

use super::add_relu::add_relu_backward;
use super::attention_core::{HeadsShape, attention_backward};
use super::batch_norm::{BatchNormShape, BatchNormStats, batch_norm_backward};
use super::bias_gelu::bias_gelu_backward;
use super::conv2d::{ConvShape, conv2d_backward};
use super::cross_entropy::cross_entropy_backward;
use super::extension::{
    FusedOps, add_relu, attention, batch_norm, batch_norm_shape, conv_shape, conv2d, cross_entropy,
    dense_gelu, dropout, embedding_grad, heads_shape, into_values, labels_of, layer_norm, linear,
    linear_grads, mask, shape_of, tensor, values,
};
use super::layer_norm::{LayerNormStats, layer_norm_backward};
use super::op_profile::{OpClass, timed};
use terse_compress::dropout::SiteMask;

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
        let (dgamma, dbeta) = timed(OpClass::Norm, || {
            layer_norm_backward(
                &values(&grad),
                &values(&x),
                &values(&gamma),
                &stats,
                &mut dx,
            )
        });
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
struct DenseGeluBackward;

impl Backward<Flex, 3> for DenseGeluBackward {
    type State = (FlexTensor, FlexTensor, FlexTensor, FlexTensor);

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_x, node_weight, node_bias] = ops.parents;
        let grad = grads.consume::<Flex>(&ops.node);
        let (x, weight, h, bias) = ops.state;
        let shape = shape_of(&h);
        let mut g = into_values(grad);
        let dbias = timed(OpClass::Activation, || {
            bias_gelu_backward(&mut g, &values(&h), &values(&bias))
        });
        let dh = tensor(g, shape);
        if let Some(node) = node_bias {
            let d = dbias.len();
            grads.register::<Flex>(node.id, tensor(dbias, Shape::new([d])));
        }
        timed(OpClass::Matmul, || {
            let want = (node_x.is_some(), node_weight.is_some(), false);
            let d = linear_grads(&x, &weight, &dh, false, want);
            if let (Some(node), Some(dw)) = (node_weight, d.weight) {
                grads.register::<Flex>(node.id, dw);
            }
            if let (Some(node), Some(dx)) = (node_x, d.x) {
                grads.register::<Flex>(node.id, dx);
            }
        });
    }
}

#[derive(Debug)]
struct DropoutBackward;

impl Backward<Flex, 1> for DropoutBackward {
    type State = SiteMask;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let mask = ops.state;
        unary::<Flex, _>(ops.parents, ops.node, grads, |grad| {
            timed(OpClass::Dropout, || dropout(grad, &mask))
        });
    }
}

#[derive(Debug)]
struct CrossEntropyBackward;

impl Backward<Flex, 1> for CrossEntropyBackward {
    type State = (FlexTensor, Arc<Vec<i64>>, Arc<Vec<f32>>);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (logits, labels, lse) = ops.state;
        unary::<Flex, _>(ops.parents, ops.node, grads, |grad| {
            timed(OpClass::Loss, || {
                let shape = shape_of(&logits);
                let classes = shape.dims::<2>()[1];
                let upstream = values(&grad)[0];
                // No copy when the state held the logits' only reference.
                let mut g = into_values(logits);
                cross_entropy_backward(&mut g, &labels, &lse, classes, upstream);
                tensor(g, shape)
            })
        });
    }
}

#[derive(Debug)]
struct LinearBackward;

impl Backward<Flex, 3> for LinearBackward {
    type State = (FlexTensor, FlexTensor, bool);

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_x, node_weight, node_bias] = ops.parents;
        let grad = grads.consume::<Flex>(&ops.node);
        let (x, weight, transposed) = ops.state;
        timed(OpClass::Matmul, || {
            let want = (node_x.is_some(), node_weight.is_some(), node_bias.is_some());
            let d = linear_grads(&x, &weight, &grad, transposed, want);
            for (node, g) in [(node_x, d.x), (node_weight, d.weight), (node_bias, d.bias)] {
                if let (Some(node), Some(g)) = (node, g) {
                    grads.register::<Flex>(node.id, g);
                }
            }
        });
    }
}

#[derive(Debug)]
struct EmbeddingBackward;

impl Backward<Flex, 1> for EmbeddingBackward {
    type State = (FlexTensor, FlexTensor);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (weights, ids) = ops.state;
        unary::<Flex, _>(ops.parents, ops.node, grads, |grad| {
            timed(OpClass::Embedding, || embedding_grad(&weights, &grad, &ids))
        });
    }
}

#[derive(Debug)]
struct AttentionBackward;

impl Backward<Flex, 3> for AttentionBackward {
    /// q, k, v, the probabilities, the shape, the scale and the mask.
    type State = (
        [FlexTensor; 3],
        FlexTensor,
        HeadsShape,
        f32,
        Option<SiteMask>,
    );

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<Flex>(&ops.node);
        let ([q, k, v], probs, s, scale, mask) = ops.state;
        let shape = shape_of(&q);
        let d = timed(OpClass::Attention, || {
            attention_backward(
                &values(&grad),
                &values(&q),
                &values(&k),
                &values(&v),
                &values(&probs),
                &s,
                scale,
                mask.as_ref(),
            )
        });
        for (node, g) in ops.parents.into_iter().zip(d) {
            if let Some(node) = node {
                grads.register::<Flex>(node.id, tensor(g, shape.clone()));
            }
        }
    }
}

#[derive(Debug)]
struct AddReluBackward;

impl Backward<Flex, 2> for AddReluBackward {
    /// The output, whose sign is the ReLU's mask.
    type State = FlexTensor;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<Flex>(&ops.node);
        let out = ops.state;
        let shape = shape_of(&out);
        let mut g = into_values(grad);
        timed(OpClass::Activation, || {
            add_relu_backward(&mut g, &values(&out))
        });
        let g = tensor(g, shape);
        for node in ops.parents.into_iter().flatten() {
            grads.register::<Flex>(node.id, g.clone());
        }
    }
}

#[derive(Debug)]
struct Conv2dBackward;

impl Backward<Flex, 2> for Conv2dBackward {
    type State = (FlexTensor, FlexTensor, ConvShape);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_x, node_weight] = ops.parents;
        let grad = grads.consume::<Flex>(&ops.node);
        let (x, weight, s) = ops.state;
        timed(OpClass::Matmul, || {
            let want = (node_x.is_some(), node_weight.is_some());
            let (dx, dw) = conv2d_backward(&values(&x), &values(&weight), &values(&grad), &s, want);
            if let (Some(node), Some(dx)) = (node_x, dx) {
                grads.register::<Flex>(node.id, tensor(dx, shape_of(&x)));
            }
            if let (Some(node), Some(dw)) = (node_weight, dw) {
                grads.register::<Flex>(node.id, tensor(dw, shape_of(&weight)));
            }
        });
    }
}

#[derive(Debug)]
struct BatchNormBackward;

impl Backward<Flex, 3> for BatchNormBackward {
    /// The input, γ, β, the forward's statistics, and whether ReLU followed.
    type State = (
        FlexTensor,
        FlexTensor,
        FlexTensor,
        Arc<BatchNormStats>,
        bool,
    );

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_x, node_gamma, node_beta] = ops.parents;
        let grad = grads.consume::<Flex>(&ops.node);
        let (x, gamma, beta, stats, relu) = ops.state;
        let s: BatchNormShape = batch_norm_shape(&x);
        let mut g = into_values(grad);
        let (dgamma, dbeta) = timed(OpClass::Norm, || {
            let (gamma, beta) = (values(&gamma), values(&beta));
            batch_norm_backward(&mut g, &values(&x), &gamma, &beta, &stats, s, relu)
        });
        if let Some(node) = node_x {
            grads.register::<Flex>(node.id, tensor(g, shape_of(&x)));
        }
        for (node, d) in [(node_gamma, dgamma), (node_beta, dbeta)] {
            if let Some(node) = node {
                let len = d.len();
                grads.register::<Flex>(node.id, tensor(d, Shape::new([len])));
            }
        }
    }
}

/// `op`'s graph step, prepared before its forward pass runs (the inputs'
/// guards keep their nodes alive until the step is registered).
fn prepare<C, O, const N: usize>(op: O, nodes: [NodeGuard; N]) -> OpsKind<O, Flex, O::State, C, N>
where
    O: Backward<Flex, N>,
    C: CheckpointStrategy,
{
    op.prepare::<C>(nodes).compute_bound().stateful()
}

/// The forward output `out` registered as `prep`'s step: `state` makes
/// what the backward pass keeps (from `out` where that is kept), only when
/// some input is tracked.
fn finish<O, C, const N: usize>(
    prep: OpsKind<O, Flex, O::State, C, N>,
    out: FlexTensor,
    state: impl FnOnce(&FlexTensor) -> O::State,
) -> FloatTensor<Autodiff<Flex, C>>
where
    O: Backward<Flex, N>,
    C: CheckpointStrategy,
{
    match prep {
        OpsKind::Tracked(prep) => prep.finish(state(&out), out),
        OpsKind::UnTracked(prep) => prep.finish(out),
    }
}

impl<C: CheckpointStrategy> FusedOps for Autodiff<Flex, C> {
    fn fused_layer_norm(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        eps: f32,
    ) -> FloatTensor<Self> {
        let prep = prepare::<C, _, _>(LayerNormBackward, [x.node(), gamma.node(), beta.node()]);
        let (y, stats) = timed(OpClass::Norm, || {
            layer_norm(x.primitive(), gamma.primitive(), beta.primitive(), eps)
        });
        finish(prep, y, |_| {
            let (x, gamma) = (x.primitive().clone(), gamma.primitive().clone());
            (x, gamma, Arc::new(stats))
        })
    }

    fn fused_dense_gelu(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let prep = prepare::<C, _, _>(DenseGeluBackward, [x.node(), weight.node(), bias.node()]);
        let (out, h) = dense_gelu(x.primitive(), weight.primitive(), bias.primitive());
        finish(prep, out, |_| {
            let (x, weight) = (x.primitive().clone(), weight.primitive().clone());
            (x, weight, h, bias.primitive().clone())
        })
    }

    fn fused_dropout(x: FloatTensor<Self>, prob: f32, key: u64) -> FloatTensor<Self> {
        let Some(mask) = mask(prob, key) else {
            return x;
        };
        let prep = prepare::<C, _, _>(DropoutBackward, [x.node()]);
        let out = timed(OpClass::Dropout, || dropout(x.primitive().clone(), &mask));
        finish(prep, out, |_| mask)
    }

    fn fused_cross_entropy(logits: FloatTensor<Self>, labels: FlexTensor) -> FloatTensor<Self> {
        let prep = prepare::<C, _, _>(CrossEntropyBackward, [logits.node()]);
        let labels = labels_of(&labels);
        let (loss, lse) = timed(OpClass::Loss, || cross_entropy(logits.primitive(), &labels));
        finish(prep, loss, |_| {
            (logits.primitive().clone(), Arc::new(labels), Arc::new(lse))
        })
    }

    fn fused_linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        transposed: bool,
    ) -> FloatTensor<Self> {
        let prep = prepare::<C, _, _>(LinearBackward, [x.node(), weight.node(), bias.node()]);
        let (x_values, w_values) = (x.primitive(), weight.primitive());
        let out = linear(x_values, w_values, Some(bias.primitive()), transposed);
        finish(prep, out, |_| {
            (x_values.clone(), w_values.clone(), transposed)
        })
    }

    fn fused_embedding(weights: FloatTensor<Self>, ids: FlexTensor) -> FloatTensor<Self> {
        let prep = prepare::<C, _, _>(EmbeddingBackward, [weights.node()]);
        let out = timed(OpClass::Embedding, || {
            Flex::embedding(weights.primitive().clone(), ids.clone())
        });
        finish(prep, out, |_| (weights.primitive().clone(), ids))
    }

    fn fused_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        heads: usize,
        scale: f32,
        prob: f32,
        key: u64,
    ) -> FloatTensor<Self> {
        // The additive mask is a constant: q, k and v get gradients.
        let prep = prepare::<C, _, _>(AttentionBackward, [q.node(), k.node(), v.node()]);
        let mask = mask(prob, key);
        let s = heads_shape(q.primitive(), heads);
        let qkv = [q.primitive(), k.primitive(), v.primitive()];
        let (context, probs) = attention(qkv, bias.primitive(), &s, scale, mask.as_ref());
        finish(prep, context, |_| {
            (qkv.map(|t| t.clone()), probs, s, scale, mask)
        })
    }

    fn fused_add_relu(a: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self> {
        let prep = prepare::<C, _, _>(AddReluBackward, [a.node(), b.node()]);
        // a's storage becomes the output (no copy when nothing else holds it).
        let out = add_relu(a.into_primitive(), b.primitive());
        finish(prep, out, |out| out.clone())
    }

    fn fused_conv2d(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        stride: usize,
        padding: usize,
    ) -> FloatTensor<Self> {
        let prep = prepare::<C, _, _>(Conv2dBackward, [x.node(), weight.node()]);
        let s = conv_shape(x.primitive(), weight.primitive(), stride, padding);
        let out = conv2d(x.primitive(), weight.primitive(), &s);
        finish(prep, out, |_| {
            (x.primitive().clone(), weight.primitive().clone(), s)
        })
    }

    fn fused_batch_norm(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        eps: f32,
        relu: bool,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let prep = prepare::<C, _, _>(BatchNormBackward, [x.node(), gamma.node(), beta.node()]);
        let (gamma_values, beta_values) = (gamma.primitive(), beta.primitive());
        let (out, stats) = batch_norm(x.primitive(), gamma_values, beta_values, eps, relu);
        // The statistics leave the graph: they only feed running averages.
        let untracked = |v: &[f32]| {
            Self::float_from_data(TensorData::new(v.to_vec(), [v.len()]), &Default::default())
        };
        let (mean, var) = (untracked(&stats.mean), untracked(&stats.var));
        let out = finish(prep, out, |_| {
            let (gamma, beta) = (gamma_values.clone(), beta_values.clone());
            (x.primitive().clone(), gamma, beta, Arc::new(stats), relu)
        });
        (out, mean, var)
    }
}
