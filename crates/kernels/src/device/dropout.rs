//! Counter-based dropout masks on the device: the factor of element `j`
//! (0, or `1/(1 − p)` when `mix32(mix32(j + key0) ^ key1) ≥ threshold`)
//! computed in a kernel with the same 32-bit hash as
//! [`terse_compress::dropout::SiteMask`] on the CPU, so a run on a GPU drops exactly
//! the elements the same run on the CPU drops, and no mask crosses from the
//! host. [`dropped`] applies the factors where it computes them (with a
//! residual added, when given), so that neither pass keeps a tensor of
//! them: the backward pass of `x·f` is `g·f`, the same kernel on `g`.

use cubecl::prelude::*;
use cubecl::server::Handle;

use super::cube::{buffer, check_lengths, launch_units, unit_item};
use super::mask::mix32;
use terse_compress::dropout::SiteMask;

/// The dropout factor of element `i`: 0, or `keep_scale` (`1/(1 − p)`)
/// when its hash is at least `threshold` (`SiteMask::parts`' values). Also
/// computed inside the attention softmax's kernels (`softmax.rs`).
#[cube]
pub(crate) fn dropout_factor(
    i: usize,
    key0: u32,
    key1: u32,
    threshold: u32,
    keep_scale: f32,
) -> f32 {
    let h = mix32(mix32(u32::cast_from(i) + key0) ^ key1);
    let mut factor = 0.0f32;
    if h >= threshold {
        factor = keep_scale;
    }
    factor
}

/// `out[j]` = the factor of element `j`; `keys` is `[key0, key1,
/// threshold]`, `scale` `[1/(1 − p)]`.
#[cube(launch_unchecked)]
fn factors_kernel(keys: &[u32], scale: &[f32], out: &mut [f32], len: usize) {
    let j = unit_item(len);
    out[j] = dropout_factor(j, keys[0], keys[1], keys[2], scale[0]);
}

/// `y = x·f` for each element, `f` its factor.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn dropped_kernel(
    x: &[f32],
    y: &mut [f32],
    len: usize,
    key0: u32,
    key1: u32,
    threshold: u32,
    keep_scale: f32,
) {
    let i = unit_item(len);
    y[i] = x[i] * dropout_factor(i, key0, key1, threshold, keep_scale);
}

/// `y = x·f + r` for each element, `f` its factor.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn dropped_add_kernel(
    x: &[f32],
    r: &[f32],
    y: &mut [f32],
    len: usize,
    key0: u32,
    key1: u32,
    threshold: u32,
    keep_scale: f32,
) {
    let i = unit_item(len);
    y[i] = x[i] * dropout_factor(i, key0, key1, threshold, keep_scale) + r[i];
}

/// The bytes of an f32.
const F32_BYTES: usize = size_of::<f32>();

/// What [`dropped`], [`dropped_half_add`] and [`dropped_half_grad`] check
/// and make before a launch:
/// `x` holds `len` elements of `x_bytes` each and `residual` (if any) `len`
/// f32; the output buffer of `len` elements of `y_bytes`, and the mask's
/// parts, `None` when there is nothing to launch.
///
/// # Panics
/// When a buffer is shorter, or `len` does not fit the kernels' u32
/// element index.
fn prepare(
    client: &Client,
    mask: &SiteMask,
    (x, x_bytes): (&Handle, usize),
    residual: Option<&Handle>,
    len: usize,
    y_bytes: usize,
) -> (Handle, Option<(u32, u32, u32, f32)>) {
    assert!(
        u32::try_from(len).is_ok(),
        "{len} elements: indices are u32"
    );
    assert!(
        x.size_in_used() >= (len * x_bytes) as u64,
        "x: fewer than {len} elements"
    );
    if let Some(residual) = residual {
        check_lengths(&[("residual", residual, len)]);
    }
    let y = client.empty(len.max(1) * y_bytes);
    (y, (len > 0).then(|| mask.parts()))
}

/// `y = f32(F(f32(x)·f)) + r` for a half activation `x` of type `F`:
/// dropped in f32 and rounded to its type once (as PyTorch's dropout of a
/// half tensor), then widened for the f32 residual stream and added.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn dropped_half_add_kernel<F: Float>(
    x: &[F],
    r: &[f32],
    y: &mut [f32],
    len: usize,
    key0: u32,
    key1: u32,
    threshold: u32,
    keep_scale: f32,
    #[define(F)] _half: ElemType,
) {
    let i = unit_item(len);
    let dropped =
        F::cast_from(f32::cast_from(x[i]) * dropout_factor(i, key0, key1, threshold, keep_scale));
    y[i] = f32::cast_from(dropped) + r[i];
}

/// The gradient of [`dropped_half_add_kernel`]'s `x` from the f32 upstream
/// `g`: `F(f32(F(g))·f)`, the widening's gradient rounded to `F` first.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn dropped_half_grad_kernel<F: Float>(
    g: &[f32],
    dx: &mut [F],
    len: usize,
    key0: u32,
    key1: u32,
    threshold: u32,
    keep_scale: f32,
    #[define(F)] _half: ElemType,
) {
    let i = unit_item(len);
    let narrowed = f32::cast_from(F::cast_from(g[i]));
    dx[i] = F::cast_from(narrowed * dropout_factor(i, key0, key1, threshold, keep_scale));
}

/// A new buffer of `len` f32, `f32(half(f32(x)·f)) + r`: `x` holds `len`
/// elements of the half type `half`, `residual` `len` f32.
///
/// # Panics
/// When a buffer is shorter, `half` is not a float type, or `len` does
/// not fit the kernel's u32 element index.
pub fn dropped_half_add(
    client: &Client,
    mask: &SiteMask,
    x: &Handle,
    half: cubecl::ir::ElemType,
    residual: &Handle,
    len: usize,
) -> Handle {
    let half_bytes = half_size(half);
    let (y, parts) = prepare(
        client,
        mask,
        (x, half_bytes),
        Some(residual),
        len,
        F32_BYTES,
    );
    let Some((key0, key1, threshold, scale)) = parts else {
        return y;
    };
    // SAFETY: `x` holds `len` elements of `half`, `residual` and `y` `len`
    // f32 (`prepare` checked and made them); the kernel bounds every
    // access by `len`.
    unsafe {
        launch_units!(
            client,
            len,
            dropped_half_add_kernel(
                buffer(x, len),
                buffer(residual, len),
                buffer(&y, len),
                len,
                key0,
                key1,
                threshold,
                scale,
                half
            )
        );
    }
    y
}

/// The gradient of [`dropped_half_add`]'s `x` from the f32 upstream `g`
/// (`len` f32): a new buffer of `len` elements of `half`,
/// `half(f32(half(g))·f)`.
///
/// # Panics
/// As [`dropped_half_add`].
pub fn dropped_half_grad(
    client: &Client,
    mask: &SiteMask,
    g: &Handle,
    half: cubecl::ir::ElemType,
    len: usize,
) -> Handle {
    let half_bytes = half_size(half);
    let (dx, parts) = prepare(client, mask, (g, F32_BYTES), None, len, half_bytes);
    let Some((key0, key1, threshold, scale)) = parts else {
        return dx;
    };
    // SAFETY: `g` holds `len` f32 and `dx` `len` elements of `half`
    // (`prepare` checked and made them); the kernel bounds every access
    // by `len`.
    unsafe {
        launch_units!(
            client,
            len,
            dropped_half_grad_kernel(
                buffer(g, len),
                buffer(&dx, len),
                len,
                key0,
                key1,
                threshold,
                scale,
                half
            )
        );
    }
    dx
}

/// The bytes of an element of the float type `half`.
///
/// # Panics
/// When `half` is not a float type.
fn half_size(half: cubecl::ir::ElemType) -> usize {
    assert!(
        matches!(half, cubecl::ir::ElemType::Float(_)),
        "{half:?} is not a float type"
    );
    half.size()
}

/// A new buffer of `len` f32: element `j` of `x` times its factor in
/// `mask`, plus element `j` of `residual` when given (`x` and `residual`
/// hold at least `len` f32).
///
/// # Panics
/// When a buffer is shorter, or `len` does not fit the kernel's u32
/// element index.
pub fn dropped(
    client: &Client,
    mask: &SiteMask,
    x: &Handle,
    residual: Option<&Handle>,
    len: usize,
) -> Handle {
    let (y, parts) = prepare(client, mask, (x, F32_BYTES), residual, len, F32_BYTES);
    let Some((key0, key1, threshold, scale)) = parts else {
        return y;
    };
    // SAFETY: `x`, `residual` and `y` hold `len` f32 (`prepare` checked
    // and made them); the kernels bound every access by `len`.
    unsafe {
        match residual {
            Some(r) => launch_units!(
                client,
                len,
                dropped_add_kernel(
                    buffer(x, len),
                    buffer(r, len),
                    buffer(&y, len),
                    len,
                    key0,
                    key1,
                    threshold,
                    scale
                )
            ),
            None => launch_units!(
                client,
                len,
                dropped_kernel(
                    buffer(x, len),
                    buffer(&y, len),
                    len,
                    key0,
                    key1,
                    threshold,
                    scale
                )
            ),
        }
    }
    y
}

/// Writes the factors of elements `0..len` of `mask` into `out` (`len`
/// f32 on the device).
///
/// # Panics
/// When `len` does not fit the kernel's u32 element index.
pub fn dropout_factors(client: &Client, mask: &SiteMask, out: &Handle, len: usize) {
    assert!(
        u32::try_from(len).is_ok(),
        "{len} elements: indices are u32"
    );
    if len == 0 {
        return;
    }
    let (key0, key1, threshold, scale) = mask.parts();
    let keys = client.create_from_slice(u32::as_bytes(&[key0, key1, threshold]));
    let scale = client.create_from_slice(f32::as_bytes(&[scale]));
    // SAFETY: `out` holds `len` f32 (the caller's contract), `keys` three
    // words and `scale` one float; the kernel bounds its writes by `len`.
    unsafe {
        launch_units!(
            client,
            len,
            factors_kernel(buffer(&keys, 3), buffer(&scale, 1), buffer(out, len), len)
        );
    }
}

// The half kernels in each element type a run makes them with: bf16 and
// fp16 (`train.precision`, whose sources include `cuda_bf16.h` and
// `cuda_fp16.h`, the `cuda-headers` dataset in the test) and f32.
#[cfg(test)]
crate::device::cuda_source::cuda_sources![
    factors_kernel::FactorsKernel(b(), b(), b(), ()),
    dropped_kernel::DroppedKernel(b(), b(), (), (), (), (), ()),
    dropped_add_kernel::DroppedAddKernel(b(), b(), b(), (), (), (), (), ()),
    dropped_half_add_kernel::DroppedHalfAddKernel(
        b(),
        b(),
        b(),
        (),
        (),
        (),
        (),
        (),
        cubecl::ir::ElemType::Float(cubecl::ir::FloatKind::F32)
    ),
    dropped_half_add_kernel::DroppedHalfAddKernel(
        b(),
        b(),
        b(),
        (),
        (),
        (),
        (),
        (),
        cubecl::ir::ElemType::Float(cubecl::ir::FloatKind::BF16)
    ),
    dropped_half_add_kernel::DroppedHalfAddKernel(
        b(),
        b(),
        b(),
        (),
        (),
        (),
        (),
        (),
        cubecl::ir::ElemType::Float(cubecl::ir::FloatKind::F16)
    ),
    dropped_half_grad_kernel::DroppedHalfGradKernel(
        b(),
        b(),
        (),
        (),
        (),
        (),
        (),
        cubecl::ir::ElemType::Float(cubecl::ir::FloatKind::F32)
    ),
    dropped_half_grad_kernel::DroppedHalfGradKernel(
        b(),
        b(),
        (),
        (),
        (),
        (),
        (),
        cubecl::ir::ElemType::Float(cubecl::ir::FloatKind::BF16)
    ),
    dropped_half_grad_kernel::DroppedHalfGradKernel(
        b(),
        b(),
        (),
        (),
        (),
        (),
        (),
        cubecl::ir::ElemType::Float(cubecl::ir::FloatKind::F16)
    ),
];
