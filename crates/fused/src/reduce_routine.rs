//! The reduction routine terse names on cubecl devices where burn's default
//! is known to be slow.
//!
//! Without `autotune`, burn-cubecl (and its fused reduce) always launches
//! cubek's `Unit` routine: one thread per output, each walking the whole
//! reduced axis. That is fine for many short reductions and slow for few
//! long ones: BERT-base's bias gradients (768 sums of 4096 rows) took
//! 263–505 µs each on an H100 and the MLM loss's reductions over the
//! 30 522-word vocabulary 2.1–2.4 ms each (`results/gpu-cuda-profile/`).
//! In the same session burn's autotune chose cubek's plane routine for
//! both kinds (6.8 µs for the bias shape; `call2/autotune-full.log.xz`).
//! Autotune itself stays off (docs/ARCHITECTURE.md), so terse names the
//! routine: a fixed routine is also a fixed summation order, which keeps
//! resumed runs bit-identical.

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::ops::FloatTensorOps;
use burn::backend::tensor::FloatTensor;
use burn::backend::wgpu::{CubeBackend, CubeTensor};
use burn::backend::{Backend, TensorMetadata, backend_extension};
use burn::tensor::Shape;
use burn_cubecl::kernel::reduce::{KernelReduceStrategy, reduce_dim};
use cubek::reduce::ReduceStrategy;
use cubek::reduce::components::instructions::ReduceOperationConfig;
use cubek::reduce::launch::{RoutineStrategy, VectorizationStrategy};
use cubek::reduce::routines::BlueprintStrategy;
use cubek::reduce::routines::cube::CubeStrategy;
use cubek::reduce::routines::plane::PlaneStrategy;

/// Sums and maxima over the rows or columns of a `[n, d]` tensor with the
/// named routine (under autodiff: burn's differentiable reductions). The
/// ops of `device_linear.rs`, `device_layer_norm.rs` and
/// `device_cross_entropy.rs` take their reductions from here.
#[backend_extension(Cube, Fusion, Autodiff)]
pub trait ParallelReduceOps: Backend {
    /// The maximum of each row of `x` `[n, d]`, shape `[n, 1]`.
    #[fusion(dtype = x, shape = row_shape(x))]
    fn row_max(x: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::float_max_dim(x, 1)
    }

    /// The sum of each row of `x` `[n, d]`, shape `[n, 1]`.
    #[fusion(dtype = x, shape = row_shape(x))]
    fn row_sums(x: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::float_sum_dim(x, 1)
    }

    /// The sum of each column of `x` `[n, d]`, shape `[d]`.
    #[fusion(dtype = x, shape = column_shape(x))]
    fn column_sums(x: FloatTensor<Self>) -> FloatTensor<Self> {
        let d = x.shape()[1];
        Self::float_reshape(Self::float_sum_dim(x, 0), Shape::new([d]))
    }
}

/// `x` `[…, d]` as `[rows, d]`, the shape the reductions take.
pub(crate) fn rows<B: Backend>(x: FloatTensor<B>) -> FloatTensor<B> {
    let shape = x.shape();
    let d = shape[shape.num_dims() - 1];
    let rows = shape.num_elements() / d;
    B::float_reshape(x, Shape::new([rows, d]))
}

/// The mean of each row of `x` `[n, d]`, shape `[n, 1]`.
pub(crate) fn row_means<B: ParallelReduceOps>(x: FloatTensor<B>) -> FloatTensor<B> {
    let d = x.shape()[1] as f64;
    B::float_div_scalar(B::row_sums(x), d.into())
}

/// The shape of `x`: the output shape of an op that keeps its input's
/// (the `#[fusion(shape = …)]` of `device_layer_norm.rs` and
/// `device_softmax.rs`).
pub(crate) fn same_shape(x: &Shape) -> Shape {
    x.clone()
}

/// `[n, 1]` for `x` `[n, d]`.
fn row_shape(x: &Shape) -> Shape {
    Shape::new([x[0], 1])
}

/// `[d]` for `x` `[n, d]`.
fn column_shape(x: &Shape) -> Shape {
    Shape::new([x[1]])
}

impl<B: ParallelReduceOps, C: CheckpointStrategy> ParallelReduceOps for Autodiff<B, C> {}

impl ParallelReduceOps for CubeBackend {
    fn row_max(x: CubeTensor) -> CubeTensor {
        reduce_parallel(x, 1, ReduceOperationConfig::Max)
    }

    fn row_sums(x: CubeTensor) -> CubeTensor {
        reduce_parallel(x, 1, ReduceOperationConfig::Sum)
    }

    fn column_sums(x: CubeTensor) -> CubeTensor {
        let d = x.shape()[1];
        let sums = reduce_parallel(x, 0, ReduceOperationConfig::Sum);
        Self::float_reshape(sums, Shape::new([d]))
    }
}

/// `op` over `dim` of `x` (kept as a dimension of 1), launched with a
/// parallel routine: planes (warps), else a cube with shared memory, which
/// needs no plane instructions (lavapipe has none: cubek answers
/// `PlanesUnavailable` there and the cube runs); else burn's default.
fn reduce_parallel(x: CubeTensor, dim: usize, op: ReduceOperationConfig) -> CubeTensor {
    let plane = RoutineStrategy::Plane(BlueprintStrategy::Inferred(PlaneStrategy {
        independent: true,
    }));
    let cube = RoutineStrategy::Cube(BlueprintStrategy::Inferred(CubeStrategy {
        use_planes: false,
    }));
    [plane, cube]
        .into_iter()
        .find_map(|routine| {
            let strategy = KernelReduceStrategy::Specific(ReduceStrategy {
                routine,
                // cubek reads this flag only over a contiguous last axis
                // (its Parallel mode, cubek-reduce's launch/utils.rs), where
                // autotune timed both settings alike on the H100 (6.85 µs);
                // over a strided axis (the bias sums) it has no effect.
                vectorization: VectorizationStrategy {
                    parallel_output_vectorization: false,
                },
                autotune_level: Default::default(),
            });
            reduce_dim(x.clone(), None, dim, strategy, op).ok()
        })
        .unwrap_or_else(|| {
            reduce_dim(x, None, dim, KernelReduceStrategy::Unspecified, op)
                .expect("burn's default reduction of a valid axis")
        })
}
