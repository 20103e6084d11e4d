//! Attention's scale, padding bias, softmax and dropout on cubecl devices,
//! as one autodiff step: `out = softmax(z·scale + bias)·f` over the key
//! axis of the scores `[batch·heads, seq, seq]`, the bias `[batch, seq]`
//! read per sequence and the dropout factors `f` hashed where they are
//! used, and its backward pass `∂z = scale·p·(g·f − Σ g·f·p)` with `p`
//! recomputed from the kept scores, one kernel each way for f32
//! (`terse_kernels::device::masked_softmax`, `masked_softmax_grad`: a
//! segment of a cube's units per row, two rows per cube at seq 128).
//!
//! burn's `softmax` is composed of ops (a detached maximum, the shifted
//! exponential, a sum, a division) that autodiff runs back one by one; the
//! bias had to be repeated per head (a copy) to be added, and the dropout
//! factors were a tensor of the scores' size, made by a kernel and kept for
//! the backward pass. On lavapipe that was 8 dispatches forward (a copy,
//! two row reductions, the factors, and element-wise steps burn's fusion
//! cannot fuse across the reductions) and 3 backward (two of them
//! reductions); now 1 and 1 (`tests/device_softmax.rs`). Between the
//! passes a layer keeps 2 tensors of the scores' size, the scores and the
//! output, where it kept 4 (measured on lavapipe, the same test): at
//! BERT-base's batch 32 and seq 128 a score-sized tensor is 25 MB, so 12
//! layers hold 604 MB less. Other dtypes run the kernels in f32 (in
//! training the scores are f32, widened under mixed precision). Flex keeps
//! its fused attention (`attention_core.rs`).

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, unary};
use burn::backend::ops::FloatTensorOps;
use burn::backend::tensor::FloatTensor;
use burn::backend::wgpu::{CubeBackend, CubeTensor};
use burn::backend::{Backend, DType, Dispatch, TensorMetadata, backend_extension};
use burn::tensor::{FloatDType, Shape, Tensor};
use burn_cubecl::cubecl::server::Handle;
use burn_cubecl::kernel::into_contiguous;
use terse_compress::dropout::SiteMask;
use terse_kernels::device::{self, ScoreRows};

use crate::device_dropout::host_factors;
use crate::reduce_routine::same_shape;

/// Attention probabilities from scaled, biased scores, with dropout.
#[backend_extension(Cube, Fusion, Autodiff)]
pub trait DeviceSoftmaxOps: Backend {
    /// `softmax(z·scale + bias)` over the last axis of `z` `[rows, n]`,
    /// row `r` biased by row `r / rows_per_bias` of `bias`
    /// `[rows / rows_per_bias, n]`, times the factors of the dropout mask
    /// `SiteMask::new(prob, key)` by position in `z`.
    #[fusion(dtype = z, shape = same_shape(z))]
    fn masked_softmax(
        z: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        rows_per_bias: usize,
        scale: f64,
        prob: f32,
        key: u64,
    ) -> FloatTensor<Self> {
        dropped_softmax_ops::<Self>(z, bias, rows_per_bias, scale, &SiteMask::new(prob, key))
    }

    /// `masked_softmax`'s gradient of `z` from the upstream `g` `[rows, n]`
    /// and the same inputs.
    #[fusion(dtype = g, shape = same_shape(g))]
    fn masked_softmax_grad(
        g: FloatTensor<Self>,
        z: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        rows_per_bias: usize,
        scale: f64,
        prob: f32,
        key: u64,
    ) -> FloatTensor<Self> {
        let mask = SiteMask::new(prob, key);
        softmax_grad_ops::<Self>(g, z, bias, rows_per_bias, scale, &mask)
    }
}

/// `softmax(z·scale + bias)` as burn's ops (the kernel's arithmetic:
/// maximum subtracted, the sum's reciprocal multiplied).
fn softmax_ops<B: Backend>(
    z: FloatTensor<B>,
    bias: FloatTensor<B>,
    rows_per_bias: usize,
    scale: f64,
) -> FloatTensor<B> {
    let [rows, n] = z.shape().dims();
    let bias = B::float_reshape(bias, Shape::new([rows / rows_per_bias, 1, n]));
    let bias = B::float_expand(bias, Shape::new([rows / rows_per_bias, rows_per_bias, n]));
    let bias = B::float_reshape(bias, Shape::new([rows, n]));
    let scores = B::float_add(B::float_mul_scalar(z, scale.into()), bias);
    let max = B::float_max_dim(scores.clone(), 1);
    let exp = B::float_exp(B::float_sub(scores, max));
    let inv = B::float_recip(B::float_sum_dim(exp.clone(), 1));
    B::float_mul(exp, inv)
}

/// [`DeviceSoftmaxOps::masked_softmax`] as burn's ops, the factors made
/// on the host (the reference, and where the kernels do not run).
fn dropped_softmax_ops<B: Backend>(
    z: FloatTensor<B>,
    bias: FloatTensor<B>,
    rows_per_bias: usize,
    scale: f64,
    mask: &SiteMask,
) -> FloatTensor<B> {
    let factors = host_factors::<B>(&z, mask);
    B::float_mul(softmax_ops::<B>(z, bias, rows_per_bias, scale), factors)
}

/// [`DeviceSoftmaxOps::masked_softmax_grad`] as burn's ops: with `h = g·f`,
/// `scale·p·(h − Σ h·p)`.
fn softmax_grad_ops<B: Backend>(
    g: FloatTensor<B>,
    z: FloatTensor<B>,
    bias: FloatTensor<B>,
    rows_per_bias: usize,
    scale: f64,
    mask: &SiteMask,
) -> FloatTensor<B> {
    let h = B::float_mul(g, host_factors::<B>(&z, mask));
    let p = softmax_ops::<B>(z, bias, rows_per_bias, scale);
    let dot = B::float_sum_dim(B::float_mul(h.clone(), p.clone()), 1);
    let dz = B::float_mul(p, B::float_sub(h, dot));
    B::float_mul_scalar(dz, scale.into())
}

/// What the kernels take for `z` `[rows, n]`.
fn score_rows(z: &CubeTensor, rows_per_bias: usize, scale: f64) -> ScoreRows {
    let [rows, n] = z.shape().dims();
    ScoreRows {
        rows,
        n,
        rows_per_bias,
        scale: scale as f32,
    }
}

/// `t` contiguous in f32, the kernels' layout and type (the scores are
/// f32 in training: widened under mixed precision).
fn contiguous_f32(t: CubeTensor) -> CubeTensor {
    let t = if t.dtype == DType::F32 {
        t
    } else {
        CubeBackend::float_cast(t, FloatDType::F32)
    };
    into_contiguous(t)
}

/// The kernel's f32 `out` as a tensor of `like`'s shape and dtype.
fn result_like(like: &CubeTensor, out: Handle) -> CubeTensor {
    let (client, device) = (like.client.clone(), like.device.clone());
    let out = CubeTensor::new_contiguous(client, device, like.shape(), out, DType::F32);
    match like.dtype {
        DType::F32 => out,
        dtype => CubeBackend::float_cast(out, dtype.into()),
    }
}

impl DeviceSoftmaxOps for CubeBackend {
    fn masked_softmax(
        z: CubeTensor,
        bias: CubeTensor,
        rows_per_bias: usize,
        scale: f64,
        prob: f32,
        key: u64,
    ) -> CubeTensor {
        let (z32, bias) = (contiguous_f32(z.clone()), contiguous_f32(bias));
        let shape = score_rows(&z32, rows_per_bias, scale);
        let handles = [&z32.handle, &bias.handle];
        let out = device::masked_softmax(&z32.client, handles, shape, &SiteMask::new(prob, key));
        result_like(&z, out)
    }

    fn masked_softmax_grad(
        g: CubeTensor,
        z: CubeTensor,
        bias: CubeTensor,
        rows_per_bias: usize,
        scale: f64,
        prob: f32,
        key: u64,
    ) -> CubeTensor {
        let [g32, z, bias] = [g.clone(), z, bias].map(contiguous_f32);
        let shape = score_rows(&z, rows_per_bias, scale);
        let handles = [&g32.handle, &z.handle, &bias.handle];
        let dz = device::masked_softmax_grad(&z.client, handles, shape, &SiteMask::new(prob, key));
        result_like(&g, dz)
    }
}

#[derive(Debug)]
struct MaskedSoftmaxBackward;

/// What the backward pass keeps: the scores and the bias (the
/// probabilities are recomputed from them, so no `[rows, n]` tensor is
/// kept beyond the scores), and the op's scalars.
#[derive(Debug, Clone)]
struct Kept<B: Backend> {
    z: FloatTensor<B>,
    bias: FloatTensor<B>,
    rows_per_bias: usize,
    scale: f64,
    prob: f32,
    key: u64,
}

impl<B: DeviceSoftmaxOps> Backward<B, 1> for MaskedSoftmaxBackward {
    type State = Kept<B>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let Kept {
            z,
            bias,
            rows_per_bias,
            scale,
            prob,
            key,
        } = ops.state;
        unary::<B, _>(ops.parents, ops.node, grads, |grad| {
            B::masked_softmax_grad(grad, z, bias, rows_per_bias, scale, prob, key)
        });
    }
}

impl<B: DeviceSoftmaxOps, C: CheckpointStrategy> DeviceSoftmaxOps for Autodiff<B, C> {
    fn masked_softmax(
        z: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        rows_per_bias: usize,
        scale: f64,
        prob: f32,
        key: u64,
    ) -> FloatTensor<Self> {
        // The bias is a constant of the batch (no gradient flows to it).
        let prep = MaskedSoftmaxBackward
            .prepare::<C>([z.node()])
            .compute_bound()
            .stateful();
        let (z, bias) = (z.into_primitive(), bias.into_primitive());
        let out = B::masked_softmax(z.clone(), bias.clone(), rows_per_bias, scale, prob, key);
        match prep {
            OpsKind::Tracked(prep) => {
                let kept = Kept {
                    z,
                    bias,
                    rows_per_bias,
                    scale,
                    prob,
                    key,
                };
                prep.finish(kept, out)
            }
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }
}

/// Attention probabilities `softmax(z·scale + bias)` of the scores `z`
/// `[batch·heads, seq, keys]` with the padding bias `[batch, keys]`, times
/// `dropout`'s factors by position in `z` (none: no dropout), as one
/// [`DeviceSoftmaxOps::masked_softmax`] step.
pub(crate) fn attention_probs(
    z: Tensor<3>,
    bias: Tensor<2>,
    scale: f64,
    dropout: Option<(f32, u64)>,
) -> Tensor<3> {
    let [heads_batch, seq, keys] = z.dims();
    let batch = bias.dims()[0];
    let (prob, key) = dropout.unwrap_or((0.0, 0));
    let p = <Dispatch as DeviceSoftmaxOps>::masked_softmax(
        z.reshape([heads_batch * seq, keys]).into_dispatch(),
        bias.into_dispatch(),
        heads_batch / batch * seq,
        scale,
        prob,
        key,
    );
    Tensor::<2>::from_dispatch(p).reshape([heads_batch, seq, keys])
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Device, DeviceKind, TensorData};

    use super::*;

    /// `n` values in [-4, 4) on `device`, shaped `dims`.
    fn tensor<const D: usize>(n: usize, dims: [usize; D], seed: u64, device: &Device) -> Tensor<D> {
        let mut rng = terse_rng::SplitMix64::new(seed);
        let values: Vec<f32> = (0..n).map(|_| 4.0 * rng.symmetric()).collect();
        Tensor::from_data(TensorData::new(values, dims), device)
    }

    fn host(t: FloatTensor<Dispatch>) -> Vec<f32> {
        Tensor::<2>::from_dispatch(t)
            .into_data()
            .try_to_vec::<f32>()
            .unwrap()
    }

    /// The kernels (through burn's fusion, on lavapipe) and the trait's
    /// default bodies (burn's ops with the factors made on the host, what a
    /// backend without the kernels runs) agree within 1e-6 forward and
    /// backward, with padding and dropout.
    #[test]
    fn kernels_and_burn_ops_agree() {
        let device = Device::wgpu(DeviceKind::Cpu);
        let (batch, rows_per_bias, n) = (2, 6, 37);
        let rows = batch * rows_per_bias;
        let z = tensor(rows * n, [rows, n], 1, &device).into_dispatch();
        let g = tensor(rows * n, [rows, n], 2, &device).into_dispatch();
        let mut bias = vec![0.0f32; batch * n];
        bias[n + 30..].fill(f32::MIN);
        let bias =
            Tensor::<2>::from_data(TensorData::new(bias, [batch, n]), &device).into_dispatch();
        let (scale, prob, key) = (0.3, 0.2, 99);
        let mask = SiteMask::new(prob, key);
        let pairs = [
            (
                "forward",
                host(<Dispatch as DeviceSoftmaxOps>::masked_softmax(
                    z.clone(),
                    bias.clone(),
                    rows_per_bias,
                    scale,
                    prob,
                    key,
                )),
                host(dropped_softmax_ops::<Dispatch>(
                    z.clone(),
                    bias.clone(),
                    rows_per_bias,
                    scale,
                    &mask,
                )),
            ),
            (
                "backward",
                host(<Dispatch as DeviceSoftmaxOps>::masked_softmax_grad(
                    g.clone(),
                    z.clone(),
                    bias.clone(),
                    rows_per_bias,
                    scale,
                    prob,
                    key,
                )),
                host(softmax_grad_ops::<Dispatch>(
                    g,
                    z,
                    bias,
                    rows_per_bias,
                    scale,
                    &mask,
                )),
            ),
        ];
        for (what, kernels, ops) in pairs {
            let largest = ops.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let worst = kernels
                .iter()
                .zip(&ops)
                .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(
                worst <= 1e-6 * largest,
                "{what}: kernels and burn's ops {worst:e} apart (largest {largest:e})"
            );
            if what == "forward" {
                assert!(ops.contains(&0.0), "no element dropped");
            }
        }
    }
}
