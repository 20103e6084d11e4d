//! The matmul routine terse's linear layers may name on cubecl devices,
//! chosen once per process (`model_step --matmul NAME`), so that one GPU
//! call can time cubek's routines on the real training step.
//!
//! Why: without `autotune`, burn-cubecl launches cubek's `Auto` strategy
//! for every matmul (`SimpleCyclicCmma`, else `SimpleUnit` where the
//! device has no matrix instructions). On an H100 BERT-base's matmuls took
//! 57 ms of a step where PyTorch's TF32 matmuls took 15 ms
//! (`results/gpu-cuda-profile/`), and burn's autotune picked other
//! routines for most of the step's shapes (`ordered_double_mma`,
//! `simple_tma_mma`, `specialized_*`; `call2/autotune-full.log.xz`).
//! Autotune itself stays off (docs/ARCHITECTURE.md): which routine wins
//! varies between runs, and each routine sums in its own order, so a
//! resumed run would not repeat its bits. A named routine is one fixed
//! order, chosen from measurements.
//!
//! On CUDA a run may also name NVIDIA's cuBLAS, PyTorch's matmul library:
//! `cublas` (f32 arithmetic, PyTorch's default) or `cublas_tf32` (TF32
//! tensor cores, PyTorch's `allow_tf32`), queued in order with cubecl's
//! kernels (`terse_kernels::device::cublas`). cubek has no full-f32
//! product there: it stages f32 as TF32 from sm_80.
//!
//! With no routine named (the default) nothing changes: the layers run
//! burn's own matmul, fused with its neighbours under `fusion`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{LazyLock, Mutex, RwLock};

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::ops::FloatTensorOps;
use burn::backend::tensor::FloatTensor;
use burn::backend::wgpu::{CubeBackend, CubeTensor};
use burn::backend::{Backend, DType, TensorMetadata, backend_extension};
use burn::tensor::Shape;
use burn_cubecl::CubeDevice;
use burn_cubecl::cubecl::ir::{ElemType, FloatKind};
use burn_cubecl::kernel::matmul::init_matmul_output;
use cubek::matmul::definition::{MatmulElems, MatmulGlobalElems, MatmulSetupError};
use cubek::matmul::launch::launch_ref;
use cubek::matmul::multi_level::Strategy as Routine;
use cubek::matmul::strategy::Strategy;
use cubek::std::InputBinding;
use terse_kernels::device::cublas::{self, Declined, F32Math, Operand};

/// Builds a routine's strategy (cubek's strategies are not `const`).
type MakeStrategy = fn() -> Strategy;

/// What a named routine launches.
#[derive(Debug, Clone, Copy)]
enum Launch {
    /// One of cubek's strategies.
    Cubek(MakeStrategy),
    /// cuBLAS in one of PyTorch's f32 modes (CUDA only).
    Cublas(F32Math),
}

/// The names a run can give of cubek's routines (the rest of `ROUTINES`
/// are cuBLAS's).
const CUBEK_ROUTINES: &[(&str, MakeStrategy)] = &[
    ("auto", || Strategy::Auto),
    ("simple_unit", || {
        Routine::SimpleUnit(Default::default()).into()
    }),
    ("double_unit", || {
        Routine::DoubleUnit(Default::default()).into()
    }),
    ("simple_cyclic_cmma", || {
        Routine::SimpleCyclicCmma(Default::default()).into()
    }),
    ("simple_cyclic_mma", || {
        Routine::SimpleCyclicMma(Default::default()).into()
    }),
    ("simple_tma_cmma", || {
        Routine::SimpleTmaCmma(Default::default()).into()
    }),
    ("simple_tma_mma", || {
        Routine::SimpleTmaMma(Default::default()).into()
    }),
    ("double_cyclic_mma", || {
        Routine::DoubleCyclicMma(Default::default()).into()
    }),
    ("double_tma_mma", || {
        Routine::DoubleTmaMma(Default::default()).into()
    }),
    ("ordered_double_cmma", || {
        Routine::OrderedDoubleCmma(Default::default()).into()
    }),
    ("ordered_double_mma", || {
        Routine::OrderedDoubleMma(Default::default()).into()
    }),
    ("specialized_cyclic_mma", || {
        Routine::SpecializedCyclicMma(Default::default()).into()
    }),
    ("specialized_tma_mma", || {
        Routine::SpecializedTmaMma(Default::default()).into()
    }),
];

/// The routines a run can name: cubek's own names without `matmul_` (the
/// spelling of burn's autotune log; `auto` is burn's choice without
/// autotune, launched through this path, a check that the path adds
/// nothing), then cuBLAS's.
static ROUTINES: LazyLock<Vec<(&'static str, Launch)>> = LazyLock::new(|| {
    CUBEK_ROUTINES
        .iter()
        .map(|&(name, make)| (name, Launch::Cubek(make)))
        .chain([
            ("cublas", Launch::Cublas(F32Math::Full)),
            ("cublas_tf32", Launch::Cublas(F32Math::Tf32)),
        ])
        .collect()
});

/// Whether routine `name` is cuBLAS's (CUDA only; it needs `libcublas`).
pub fn is_cublas_routine(name: &str) -> bool {
    ROUTINES
        .iter()
        .any(|(known, launch)| *known == name && matches!(launch, Launch::Cublas(_)))
}

/// Whether this machine has `libcublas` (what the cuBLAS routines need).
pub fn cublas_present() -> bool {
    cublas::library_present()
}

/// The routine named for this process (its entry of [`ROUTINES`]), `None`
/// for burn's own matmul.
static NAMED: RwLock<Option<&'static (&'static str, Launch)>> = RwLock::new(None);

/// Products the named routine could not take (on this device, or in a
/// half type) and burn's matmul ran instead.
static DECLINED: AtomicUsize = AtomicUsize::new(0);

/// Why the named routine first declined a product since it was named.
static FIRST_REASON: Mutex<Option<String>> = Mutex::new(None);

/// How many products the named routine has declined so far in this
/// process, each run by burn's matmul instead: a timing of a routine is
/// only that routine's where this stayed 0.
pub fn declined_matmuls() -> usize {
    DECLINED.load(Ordering::Relaxed)
}

/// Why the named routine first declined a product since it was named (a
/// half type, what the device lacks, cuBLAS's error), if it has.
pub fn first_decline_reason() -> Option<String> {
    FIRST_REASON
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
}

/// Counts a declined product, keeping the first reason.
fn decline(reason: impl FnOnce() -> String) {
    DECLINED.fetch_add(1, Ordering::Relaxed);
    FIRST_REASON
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(reason);
}

/// The names [`name_linear_matmul`] takes.
pub fn matmul_routine_names() -> impl Iterator<Item = &'static str> {
    ROUTINES.iter().map(|(name, _)| *name)
}

/// Names the matmul routine of the linear layers on cubecl devices for the
/// rest of the process; `None` goes back to burn's matmul.
///
/// # Errors
/// A name that is not one of [`matmul_routine_names`], listing them.
pub fn name_linear_matmul(name: Option<&str>) -> Result<(), String> {
    let named = match name {
        None => None,
        Some(name) => Some(
            ROUTINES
                .iter()
                .find(|(known, _)| *known == name)
                .ok_or_else(|| {
                    let known = matmul_routine_names().collect::<Vec<_>>().join(", ");
                    format!("unknown matmul routine `{name}`; known: {known}")
                })?,
        ),
    };
    *NAMED.write().unwrap_or_else(|p| p.into_inner()) = named;
    *FIRST_REASON.lock().unwrap_or_else(|p| p.into_inner()) = None;
    Ok(())
}

/// The routine named for this process, if any.
pub fn named_linear_matmul() -> Option<&'static str> {
    named().map(|(name, _)| *name)
}

fn named() -> Option<&'static (&'static str, Launch)> {
    *NAMED.read().unwrap_or_else(|p| p.into_inner())
}

/// A 2-D matmul with the named routine.
#[backend_extension(Cube, Fusion, Autodiff)]
pub trait NamedMatmulOps: Backend {
    /// `lhs` `[m, k]` times `rhs` `[k, n]` (either may be a transposed
    /// view), `[m, n]`.
    #[fusion(dtype = lhs, shape = product_shape(lhs, rhs))]
    fn named_matmul(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::float_matmul(lhs, rhs)
    }
}

/// `[m, n]` for `[m, k]` times `[k, n]`.
fn product_shape(lhs: &Shape, rhs: &Shape) -> Shape {
    Shape::new([lhs[0], rhs[1]])
}

impl<B: NamedMatmulOps, C: CheckpointStrategy> NamedMatmulOps for Autodiff<B, C> {}

impl NamedMatmulOps for CubeBackend {
    fn named_matmul(lhs: CubeTensor, rhs: CubeTensor) -> CubeTensor {
        let Some((name, launch)) = named() else {
            return Self::float_matmul(lhs, rhs);
        };
        // The routines are named for f32 steps; a half-precision product
        // (the trainer's autocast) keeps burn's matmul, counted.
        if lhs.dtype != DType::F32 || rhs.dtype != DType::F32 {
            decline(|| format!("a {:?} product (the routines take f32)", lhs.dtype));
            return Self::float_matmul(lhs, rhs);
        }
        let strategy = match launch {
            Launch::Cubek(strategy) => strategy,
            Launch::Cublas(math) => {
                return match by_cublas(&lhs, &rhs, *math) {
                    Ok(out) => out,
                    // Not CUDA, no libcublas, a layout it cannot read, or
                    // an error: burn's matmul, counted (a run checks the
                    // device and the library before it starts).
                    Err(why) => {
                        decline(|| format!("cuBLAS: {why:?}"));
                        Self::float_matmul(lhs, rhs)
                    }
                };
            }
        };
        match launch_with(strategy(), lhs.clone(), rhs.clone()) {
            Ok(out) => out,
            // The routine needs what this device lacks (tensor cores, TMA,
            // planes), or refuses these operands (TMA and async copies need
            // rows 16-byte aligned: not the NSP head's [768, 2] weight nor
            // the MLM's 30522 logits' gradient on CUDA, where lavapipe has
            // no TMA to refuse them with): burn's matmul, as without a
            // name, counted and the first reason named.
            Err(e) => {
                decline(|| match e {
                    MatmulSetupError::Unavailable(why) => format!("{name}: {why:?}"),
                    e => format!("{name} on {:?} x {:?}: {e:?}", lhs.shape(), rhs.shape()),
                });
                Self::float_matmul(lhs, rhs)
            }
        }
    }
}

/// `lhs · rhs` (f32) launched with `strategy`.
fn launch_with(
    strategy: Strategy,
    lhs: CubeTensor,
    rhs: CubeTensor,
) -> Result<CubeTensor, MatmulSetupError> {
    let out = init_matmul_output(&lhs, &rhs, DType::F32);
    let f32 = ElemType::Float(FloatKind::F32);
    let mut dtypes = MatmulElems::from_globals(&MatmulGlobalElems {
        lhs: f32,
        rhs: f32,
        out: f32,
    });
    let client = out.client.clone();
    launch_ref(
        &strategy,
        &client,
        InputBinding::new(lhs.binding(), f32),
        InputBinding::new(rhs.binding(), f32),
        out.clone().binding(),
        &mut dtypes,
    )?;
    Ok(out)
}

/// `lhs · rhs` (f32, 2-D) by cuBLAS on a CUDA device, queued behind the
/// kernels that wrote the operands.
fn by_cublas(lhs: &CubeTensor, rhs: &CubeTensor, math: F32Math) -> Result<CubeTensor, Declined> {
    let CubeDevice::Cuda(device) = &lhs.device else {
        return Err(Declined::NotCuda);
    };
    // Plain 2-D matrices only (a storage-tiled tensor's strides are its
    // tiles'); burn's matmul takes the rest.
    if [lhs, rhs]
        .iter()
        .any(|t| t.meta.is_tiled() || t.meta.shape().len() != 2)
    {
        return Err(Declined::Layout);
    }
    // On CUDA cubecl pads the output's rows (pitched allocations): its
    // strides travel with it.
    let out = init_matmul_output(lhs, rhs, DType::F32);
    let operand = |t: &'_ CubeTensor| {
        let (shape, strides) = (t.meta.shape(), t.meta.strides());
        (shape[0], shape[1], [strides[0], strides[1]])
    };
    let ((m, k, lhs_strides), (_, n, rhs_strides)) = (operand(lhs), operand(rhs));
    let (_, _, out_strides) = operand(&out);
    cublas::matmul_f32(
        &out.client,
        device.index,
        (
            Operand {
                handle: &lhs.handle,
                rows: m,
                cols: k,
                strides: lhs_strides,
            },
            Operand {
                handle: &rhs.handle,
                rows: k,
                cols: n,
                strides: rhs_strides,
            },
        ),
        Operand {
            handle: &out.handle,
            rows: m,
            cols: n,
            strides: out_strides,
        },
        math,
    )?;
    Ok(out)
}

/// `lhs · rhs` with the named routine on a cubecl device (burn's matmul
/// with none named, or elsewhere): the products `matmul_routines` times.
pub fn named_matmul(
    lhs: burn::tensor::Tensor<2>,
    rhs: burn::tensor::Tensor<2>,
) -> burn::tensor::Tensor<2> {
    burn::tensor::Tensor::from_dispatch(<burn::backend::Dispatch as NamedMatmulOps>::named_matmul(
        lhs.into_dispatch(),
        rhs.into_dispatch(),
    ))
}
