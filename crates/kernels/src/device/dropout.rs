//! Counter-based dropout masks on the device: the factor of element `j`
//! (0, or `1/(1 − p)` when `mix32(mix32(j + key0) ^ key1) ≥ threshold`)
//! computed in a kernel with the same 32-bit hash as
//! [`terse_compress::dropout::SiteMask`] on the CPU, so a run on a GPU drops exactly
//! the elements the same run on the CPU drops, and no mask crosses from the
//! host.

use cubecl::prelude::*;
use cubecl::server::Handle;

use super::cube::{buffer, launch_units, unit_item};
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
crate::device::cuda_source::cuda_sources![factors_kernel::FactorsKernel(b(), b(), b(), ()),];
