//! Mean cross-entropy from logits on cubecl devices, as one autodiff step
//! whose reductions over each row (its maximum, its sum of exponentials)
//! run the routine `reduce_routine.rs` names, and whose backward pass has
//! no reduction at all: `(softmax(x) − onehot(label)) · g / n` from the
//! kept log-sum-exp.
//!
//! burn's `CrossEntropyLoss` takes `log_softmax` through autodiff: a row
//! maximum and a row sum forward and another row sum backward, each with
//! the `Unit` routine, one thread per row. The MLM loss has ~640 rows of
//! 30 522 logits at batch 32, and those three reductions took 2.1–2.4 ms
//! each of an H100's 176 ms BERT-base step (`results/gpu-cuda-profile/`).
//! Flex keeps its fused kernel (`cross_entropy.rs`).

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, unary};
use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::backend::wgpu::CubeBackend;
use burn::backend::{Dispatch, TensorMetadata, backend_extension};
use burn::tensor::ops::IndexingUpdateOp;
use burn::tensor::{Int, Shape, Tensor};

use crate::reduce_routine::ParallelReduceOps;

/// Mean cross-entropy from logits.
#[backend_extension(Cube, Fusion, Autodiff)]
pub trait CrossEntropyOps: ParallelReduceOps {
    /// Mean cross-entropy of `logits` `[n, c]` against `labels` `[n]`,
    /// shape `[1]`.
    #[fusion(default)]
    fn mean_cross_entropy(logits: FloatTensor<Self>, labels: IntTensor<Self>) -> FloatTensor<Self> {
        let lse = log_sum_exp::<Self>(logits.clone());
        mean_loss::<Self>(logits, labels, lse)
    }
}

/// `log Σ_j exp(x_ij)` of each row, `[n, 1]`, shifted by the row maximum.
fn log_sum_exp<B: ParallelReduceOps>(x: FloatTensor<B>) -> FloatTensor<B> {
    let max = B::row_max(x.clone());
    let sums = B::row_sums(B::float_exp(B::float_sub(x, max.clone())));
    B::float_add(B::float_log(sums), max)
}

/// `mean_i (lse_i − x_i,label_i)`, shape `[1]`.
fn mean_loss<B: ParallelReduceOps>(
    x: FloatTensor<B>,
    labels: IntTensor<B>,
    lse: FloatTensor<B>,
) -> FloatTensor<B> {
    let n = lse.shape()[0];
    let picked = B::float_gather(1, x, B::int_reshape(labels, Shape::new([n, 1])));
    B::float_mean(B::float_sub(lse, picked))
}

impl CrossEntropyOps for CubeBackend {}

#[derive(Debug)]
struct CrossEntropyBackward;

impl<B: CrossEntropyOps> Backward<B, 1> for CrossEntropyBackward {
    /// The logits, their rows' log-sum-exp and the labels.
    type State = (FloatTensor<B>, FloatTensor<B>, IntTensor<B>);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (x, lse, labels) = ops.state;
        unary::<B, _>(ops.parents, ops.node, grads, |grad| {
            let n = lse.shape()[0];
            let probs = B::float_exp(B::float_sub(x, lse));
            let labels = B::int_reshape(labels, Shape::new([n, 1]));
            let ones = B::float_ones(Shape::new([n, 1]), &probs.device(), probs.dtype().into());
            let delta =
                B::float_scatter(1, probs, labels, B::float_neg(ones), IndexingUpdateOp::Add);
            let scale = B::float_div_scalar(
                B::float_reshape(grad, Shape::new([1, 1])),
                (n as f64).into(),
            );
            B::float_mul(delta, scale)
        });
    }
}

impl<B: CrossEntropyOps, C: CheckpointStrategy> CrossEntropyOps for Autodiff<B, C> {
    fn mean_cross_entropy(logits: FloatTensor<Self>, labels: IntTensor<Self>) -> FloatTensor<Self> {
        let prep = CrossEntropyBackward
            .prepare::<C>([logits.node()])
            .compute_bound()
            .stateful();
        let x = logits.into_primitive();
        let lse = log_sum_exp::<B>(x.clone());
        let loss = mean_loss::<B>(x.clone(), labels.clone(), lse.clone());
        match prep {
            OpsKind::Tracked(prep) => prep.finish((x, lse, labels), loss),
            OpsKind::UnTracked(prep) => prep.finish(loss),
        }
    }
}

/// Mean cross-entropy of `logits` `[n, c]` against `labels` `[n]` through
/// [`CrossEntropyOps::mean_cross_entropy`], shape `[1]`.
pub(crate) fn mean_cross_entropy(logits: Tensor<2>, labels: Tensor<1, Int>) -> Tensor<1> {
    Tensor::from_dispatch(<Dispatch as CrossEntropyOps>::mean_cross_entropy(
        logits.into_dispatch(),
        labels.into_dispatch(),
    ))
}
