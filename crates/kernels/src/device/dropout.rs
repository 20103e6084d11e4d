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
    assert!(
        u32::try_from(len).is_ok(),
        "{len} elements: indices are u32"
    );
    check_lengths(&[("x", x, len)]);
    if let Some(residual) = residual {
        check_lengths(&[("residual", residual, len)]);
    }
    let y = client.empty(len.max(1) * size_of::<f32>());
    if len == 0 {
        return y;
    }
    let (key0, key1, threshold, scale) = mask.parts();
    // SAFETY: `x`, `residual` and `y` hold `len` f32 (checked above, `y`
    // made to size); the kernels bound every access by `len`.
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

#[cfg(test)]
crate::device::cuda_source::cuda_sources![
    factors_kernel::FactorsKernel(b(), b(), b(), ()),
    dropped_kernel::DroppedKernel(b(), b(), (), (), (), (), ()),
    dropped_add_kernel::DroppedAddKernel(b(), b(), b(), (), (), (), (), ()),
];
