//! f32 matrix products by NVIDIA's cuBLAS on a CUDA device, queued on the
//! stream cubecl queues the calling thread's kernels on, so that they run
//! in order with those kernels and nothing waits on the host.
//!
//! Why: cubek's matmul routines took 57 ms of a 176 ms BERT-base step on
//! an H100 where PyTorch's cuBLAS products took 15 ms
//! (`results/gpu-cuda-profile/`), and cubek stages f32 operands as TF32
//! wherever the device has it, so terse had no full-f32 product on CUDA.
//! cuBLAS is what PyTorch multiplies with, in both of its f32 modes
//! ([`F32Math`]).
//!
//! The stream: cubecl-cuda keeps its streams private; terse's patch of it
//! (`vendor/cubecl-cuda`, `GpuResource::stream`) hands out, with a
//! buffer's device address, the stream that address was resolved on. A
//! product queued there comes after every kernel queued before it and
//! before every kernel queued after it, as one of cubecl's own would.
//!
//! cudarc opens `libcublas` at run time; a machine without it has
//! [`library_present`] false and the products stay cubek's.

use std::cell::RefCell;
use std::ffi::c_void;
use std::sync::{Arc, OnceLock};

use cubecl::prelude::*;
use cubecl::server::Handle;
use cudarc::cublas::{result as blas, sys as blas_sys};
use cudarc::driver::CudaContext;

use super::cuda_memory::cuda_buffer;

/// How cuBLAS multiplies f32 matrices: PyTorch's two modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum F32Math {
    /// f32 arithmetic (`CUBLAS_COMPUTE_32F`): PyTorch's default,
    /// `torch.backends.cuda.matmul.allow_tf32 = False`.
    Full,
    /// TF32 tensor cores (`CUBLAS_COMPUTE_32F_FAST_TF32`): PyTorch's
    /// `allow_tf32 = True`.
    Tf32,
}

/// A row-major `rows × cols` f32 matrix operand at `handle` with element
/// strides `[row, column]`: contiguous (`[cols, 1]`, or a longer row
/// stride) or a transposed view (`[1, rows]`, or longer).
#[derive(Debug, Clone, Copy)]
pub struct Operand<'a> {
    /// The buffer (its offset included).
    pub handle: &'a Handle,
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// Element strides of a row and of a column.
    pub strides: [usize; 2],
}

/// Why cuBLAS did not take a product (the caller multiplies another way).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Declined {
    /// The buffers are not CUDA memory (a wgpu device).
    NotCuda,
    /// An operand is neither row- nor column-major, or too large for
    /// cuBLAS's 32-bit sizes.
    Layout,
    /// No `libcublas` on this machine.
    NoLibrary,
    /// cuBLAS or the driver refused (its message).
    Failed(String),
}

/// Whether `libcublas` can be opened (cudarc looks it up by name through
/// the linker's paths and `LD_LIBRARY_PATH`); looked up once a process,
/// not at every product.
pub fn library_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to open the library by its names.
    *PRESENT.get_or_init(|| unsafe { blas_sys::is_culib_present() })
}

/// One column-major GEMM call, `C = op(A)·op(B)` with `C` `m × n` (BLAS's
/// names), that computes a row-major product: see [`gemm_call`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmCall {
    /// Whether BLAS's A (terse's right operand) is transposed.
    pub transpose_a: bool,
    /// Whether BLAS's B (terse's left operand) is transposed.
    pub transpose_b: bool,
    /// BLAS's m, n, k.
    pub m: usize,
    /// See `m`.
    pub n: usize,
    /// See `m`.
    pub k: usize,
    /// Leading dimensions of A, B and C.
    pub lda: usize,
    /// See `lda`.
    pub ldb: usize,
    /// See `lda`.
    pub ldc: usize,
}

/// How a row-major operand reads as BLAS's transposed-or-not column-major
/// operand of the transposed product: `(transposed, leading dimension)`.
///
/// Row-major `X` (`r × c`, strides `[s, 1]`) is, in column-major terms,
/// `Xᵀ` with leading dimension `s`: used as is. A transposed view (strides
/// `[1, s]`) is column-major `X` with leading dimension `s`: used
/// transposed. A one-row or one-column operand takes the first reading
/// that fits (either describes the same elements).
fn as_column_major(rows: usize, cols: usize, [row, col]: [usize; 2]) -> Option<(bool, usize)> {
    if col == 1 || cols == 1 {
        let ld = if rows == 1 { cols.max(1) } else { row };
        if ld >= cols.max(1) {
            return Some((false, ld));
        }
    }
    if row == 1 || rows == 1 {
        let ld = if cols == 1 { rows.max(1) } else { col };
        if ld >= rows.max(1) {
            return Some((true, ld));
        }
    }
    None
}

/// The column-major call computing the row-major `out = lhs · rhs`
/// (`lhs` `m × k`, `rhs` `k × n`, `out` `m × n` row-major at
/// `out_strides`, its rows possibly padded, as cubecl's pitched CUDA
/// allocations are): row-major `out` is column-major `outᵀ` with leading
/// dimension its row stride, and `outᵀ = rhsᵀ · lhsᵀ`, so BLAS's A is
/// `rhs`, its B `lhs`, its `m × n` terse's `n × m`. `None` when an operand
/// is neither row- nor column-major, or `out` is not row-major.
pub fn gemm_call(
    (m, k): (usize, usize),
    lhs_strides: [usize; 2],
    n: usize,
    rhs_strides: [usize; 2],
    out_strides: [usize; 2],
) -> Option<GemmCall> {
    let (transpose_a, lda) = as_column_major(k, n, rhs_strides)?;
    let (transpose_b, ldb) = as_column_major(m, k, lhs_strides)?;
    let (false, ldc) = as_column_major(m, n, out_strides)? else {
        return None;
    };
    Some(GemmCall {
        transpose_a,
        transpose_b,
        m: n,
        n: m,
        k,
        lda,
        ldb,
        ldc,
    })
}

/// This thread's cuBLAS handle, made under the GPU's primary context (the
/// one cubecl uses), for one device.
struct ThreadBlas {
    ordinal: usize,
    _context: Arc<CudaContext>,
    handle: blas_sys::cublasHandle_t,
}

impl Drop for ThreadBlas {
    fn drop(&mut self) {
        // SAFETY: made by `create_handle` below and dropped once.
        unsafe {
            let _ = blas::destroy_handle(self.handle);
        }
    }
}

thread_local! {
    /// cuBLAS handles are not to be shared between threads; one per thread
    /// (a rank's thread keeps its own).
    static BLAS: RefCell<Option<ThreadBlas>> = const { RefCell::new(None) };
}

fn failed(what: &str, e: impl std::fmt::Debug) -> Declined {
    Declined::Failed(format!("{what}: {e:?}"))
}

/// Runs `call` with this thread's cuBLAS handle for device `ordinal`, made
/// (with its context bound to the thread) the first time.
fn with_handle<R>(
    ordinal: usize,
    call: impl FnOnce(blas_sys::cublasHandle_t) -> Result<R, Declined>,
) -> Result<R, Declined> {
    BLAS.with(|cell| {
        let mut state = cell.borrow_mut();
        if state.as_ref().is_none_or(|s| s.ordinal != ordinal) {
            *state = None;
            let context = CudaContext::new(ordinal).map_err(|e| failed("the GPU's context", e))?;
            context
                .bind_to_thread()
                .map_err(|e| failed("binding the GPU's context", e))?;
            let handle = blas::create_handle().map_err(|e| failed("cublasCreate", e))?;
            *state = Some(ThreadBlas {
                ordinal,
                _context: context,
                handle,
            });
        }
        let blas = state.as_ref().expect("made above");
        blas._context
            .bind_to_thread()
            .map_err(|e| failed("binding the GPU's context", e))?;
        call(blas.handle)
    })
}

/// `out = lhs · rhs` (f32; `out` a row-major `lhs.rows × rhs.cols`
/// matrix) by cuBLAS on CUDA device `ordinal`, queued on the stream of the
/// calling thread's cubecl work: returns once queued, waits for nothing.
///
/// # Errors
/// [`Declined`]: the caller multiplies another way.
pub fn matmul_f32(
    client: &Client,
    ordinal: usize,
    (lhs, rhs): (Operand<'_>, Operand<'_>),
    out: Operand<'_>,
    math: F32Math,
) -> Result<(), Declined> {
    assert_eq!(lhs.cols, rhs.rows, "inner dimensions differ");
    assert_eq!(
        (out.rows, out.cols),
        (lhs.rows, rhs.cols),
        "the product's shape"
    );
    // An empty product (never a linear layer's) allocates no operand
    // cubecl could hand out: burn's matmul makes it.
    if out.rows == 0 || out.cols == 0 || lhs.cols == 0 {
        return Err(Declined::Layout);
    }
    let call = gemm_call(
        (lhs.rows, lhs.cols),
        lhs.strides,
        rhs.cols,
        rhs.strides,
        out.strides,
    )
    .ok_or(Declined::Layout)?;
    let int = |v: usize| i32::try_from(v).map_err(|_| Declined::Layout);
    let (m, n, k) = (int(call.m)?, int(call.n)?, int(call.k)?);
    let (lda, ldb, ldc) = (int(call.lda)?, int(call.ldb)?, int(call.ldc)?);
    if !library_present() {
        return Err(Declined::NoLibrary);
    }
    // The addresses, and the stream they were resolved on; a buffer of
    // another runtime is refused here. The resources keep the allocations
    // in place until the product is queued; after that the stream orders
    // any reuse behind it.
    let [lhs_at, rhs_at, out_at] = [lhs.handle, rhs.handle, out.handle].map(|h| {
        match cuda_buffer(client, h) {
            Ok(Some(buffer)) => Ok(buffer),
            Ok(None) => Err(Declined::NotCuda),
            // A buffer cubecl could not hand out (a failed kernel wrote
            // it, or its allocation failed): say so.
            Err(e) => Err(failed("cubecl's buffer", e)),
        }
    });
    let (lhs_at, rhs_at, out_at) = (lhs_at?, rhs_at?, out_at?);
    let stream = out_at.resource().stream;
    // No stream is CUDA's legacy default stream, which cubecl's
    // non-blocking streams neither wait for nor are waited for by: the
    // product would race the kernels around it (only a cubecl-cuda without
    // vendor/cubecl-cuda's patch hands out no stream).
    if stream.is_null() {
        return Err(failed("cubecl's buffer", "resolved on no CUDA stream"));
    }
    let op = |t: bool| {
        if t {
            blas_sys::cublasOperation_t::CUBLAS_OP_T
        } else {
            blas_sys::cublasOperation_t::CUBLAS_OP_N
        }
    };
    let compute = match math {
        F32Math::Full => blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        F32Math::Tf32 => blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
    };
    let (alpha, beta) = (1.0f32, 0.0f32);
    let f32_type = blas_sys::cudaDataType::CUDA_R_32F;
    with_handle(ordinal, |handle| {
        // SAFETY: `stream` is the live stream cubecl resolved the buffers
        // on; the three addresses are live CUDA allocations holding the
        // operands' and the output's elements at the strides `gemm_call`
        // read (the caller's `Operand`s), held by the three resources
        // until the product is queued; alpha and beta are host scalars.
        // BLAS's A is the right operand, its B the left one.
        unsafe {
            blas::set_stream(handle, stream as blas_sys::cudaStream_t)
                .map_err(|e| failed("cublasSetStream", e))?;
            blas::gemm_ex(
                handle,
                op(call.transpose_a),
                op(call.transpose_b),
                m,
                n,
                k,
                (&raw const alpha).cast::<c_void>(),
                rhs_at.resource().ptr as *const c_void,
                f32_type,
                lda,
                lhs_at.resource().ptr as *const c_void,
                f32_type,
                ldb,
                (&raw const beta).cast::<c_void>(),
                out_at.resource().ptr as *mut c_void,
                f32_type,
                ldc,
                compute,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
            .map_err(|e| failed("cublasGemmEx", e))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// BLAS's `sgemm` as its reference documentation defines it (column-
    /// major, `C = op(A)·op(B)`), written out: the independent reading of
    /// what a [`GemmCall`] computes.
    fn reference_sgemm(call: &GemmCall, a: &[f64], b: &[f64], c: &mut [f64]) {
        // cuBLAS's own checks (CUBLAS_STATUS_INVALID_VALUE otherwise): a
        // leading dimension at least the rows of the operand as stored.
        let rows_a = if call.transpose_a { call.k } else { call.m };
        let rows_b = if call.transpose_b { call.n } else { call.k };
        assert!(call.lda >= rows_a.max(1), "lda {call:?}");
        assert!(call.ldb >= rows_b.max(1), "ldb {call:?}");
        assert!(call.ldc >= call.m.max(1), "ldc {call:?}");
        let at = |i: usize, p: usize| {
            if call.transpose_a {
                a[p + i * call.lda]
            } else {
                a[i + p * call.lda]
            }
        };
        let bt = |p: usize, j: usize| {
            if call.transpose_b {
                b[j + p * call.ldb]
            } else {
                b[p + j * call.ldb]
            }
        };
        for i in 0..call.m {
            for j in 0..call.n {
                c[i + j * call.ldc] = (0..call.k).map(|p| at(i, p) * bt(p, j)).sum();
            }
        }
    }

    /// `rows × cols` values laid out at `strides` (padding between rows or
    /// columns holds NaN, which must not be read).
    fn laid_out(
        rows: usize,
        cols: usize,
        strides: [usize; 2],
        seed: usize,
    ) -> (Vec<f64>, Vec<f64>) {
        let value = |i: usize, j: usize| ((i * 31 + j * 17 + seed) % 23) as f64 - 11.0;
        let span = if rows * cols == 0 {
            0
        } else {
            (rows - 1) * strides[0] + (cols - 1) * strides[1] + 1
        };
        let mut storage = vec![f64::NAN; span];
        let mut dense = vec![0.0; rows * cols];
        for i in 0..rows {
            for j in 0..cols {
                storage[i * strides[0] + j * strides[1]] = value(i, j);
                dense[i * cols + j] = value(i, j);
            }
        }
        (storage, dense)
    }

    #[test]
    fn the_call_computes_the_row_major_product_in_every_layout() {
        // Shapes with 1s (vectors), and strides longer than the rows or
        // columns (views into wider buffers), each operand contiguous or
        // a transposed view.
        for (m, k, n) in [
            (3, 4, 5),
            (1, 4, 5),
            (3, 1, 5),
            (3, 4, 1),
            (1, 1, 1),
            (6, 2, 7),
        ] {
            let lhs_layouts = [[k, 1], [k + 3, 1], [1, m], [1, m + 2]];
            let rhs_layouts = [[n, 1], [n + 2, 1], [1, k], [1, k + 5]];
            for lhs_strides in lhs_layouts {
                for rhs_strides in rhs_layouts {
                    let (a_store, a) = laid_out(m, k, lhs_strides, 1);
                    let (b_store, b) = laid_out(k, n, rhs_strides, 2);
                    for out_row in [n, n + 4] {
                        let call = gemm_call((m, k), lhs_strides, n, rhs_strides, [out_row, 1])
                            .unwrap_or_else(|| panic!("{lhs_strides:?} {rhs_strides:?} declined"));
                        // The output's padding must stay as it was (NaN).
                        let mut c = vec![f64::NAN; m * out_row];
                        // BLAS's A is the right operand, its B the left one.
                        reference_sgemm(&call, &b_store, &a_store, &mut c);
                        let what = format!(
                            "{m}x{k}x{n}, lhs {lhs_strides:?}, rhs {rhs_strides:?}, out row {out_row}"
                        );
                        for i in 0..m {
                            for j in 0..out_row {
                                let got = c[i * out_row + j];
                                if j >= n {
                                    assert!(got.is_nan(), "{what}: padding ({i}, {j}) written");
                                    continue;
                                }
                                let want: f64 = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
                                assert_eq!(got, want, "{what}: ({i}, {j})");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn operands_neither_row_nor_column_major_are_declined() {
        let out = [5, 1];
        // A broadcast row (stride 0) and a doubly strided view.
        assert_eq!(gemm_call((3, 4), [0, 1], 5, [5, 1], out), None);
        assert_eq!(gemm_call((3, 4), [8, 2], 5, [5, 1], out), None);
        assert_eq!(gemm_call((3, 4), [4, 1], 5, [2, 3], out), None);
        // A row stride shorter than a row.
        assert_eq!(gemm_call((3, 4), [3, 1], 5, [5, 1], out), None);
        // An output that is a transposed view, or with short rows.
        assert_eq!(gemm_call((3, 4), [4, 1], 5, [5, 1], [1, 3]), None);
        assert_eq!(gemm_call((3, 4), [4, 1], 5, [5, 1], [4, 1]), None);
    }
}
