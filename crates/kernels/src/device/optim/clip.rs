//! Global-norm clipping on the device (`train.max_grad_norm`): the
//! gradient's squared norm totalled there from its chunks' partial sums,
//! and the gradient scaled by `max_norm / norm` there when the norm exceeds
//! `max_norm`. The host then reads the norm only to log it, once the step's
//! work is queued, as PyTorch's `clip_grad_norm_` leaves it on the device.

use cubecl::prelude::*;
use cubecl::server::Handle;

use super::buffers::QueuedSums;
use super::chunks::{CUBE, DeviceChunks, f32_arg};
use crate::device::cube::{buffer, cube_reduce, launch_units, unit_item};

/// One cube: `total[0]` is the sum of `partials`, each unit's strided share
/// summed in order, then the cube's fixed tree (the same bits every run).
#[cube(launch_unchecked)]
fn total_kernel(partials: &[f32], total: &mut [f32], count: usize) {
    let mut acc = 0.0f32;
    let mut i = UNIT_POS as usize;
    while i < count {
        acc += partials[i];
        i += CUBE;
    }
    let sum = cube_reduce(acc, false);
    if UNIT_POS == 0 {
        total[0] = sum;
    }
}

/// `x *= max_norm / norm` with `norm = √squares[0]`, where `norm >
/// max_norm`, over the first `len` elements (a padded buffer's padding
/// is left alone); one unit per element.
#[cube(launch_unchecked)]
fn clip_kernel(x: &mut [f32], squares: &[f32], max_norm: &[f32], len: usize) {
    let i = unit_item(len);
    let norm = f32::sqrt(squares[0]);
    let max = max_norm[0];
    if norm > max {
        x[i] *= max / norm;
    }
}

impl QueuedSums {
    /// The sum over every chunk, as one f32 in a new device buffer (not
    /// read: [`clip_to_norm`] and a GPU allreduce take it there).
    pub fn total(self, client: &Client, chunks: &DeviceChunks) -> Handle {
        let total = client.create_from_slice(f32::as_bytes(&[0.0]));
        let Some(partials) = self.partials else {
            return total;
        };
        // SAFETY: `partials` holds one f32 per chunk, `total` one; the
        // kernel is one cube and bounds its reads by the partials' count.
        unsafe {
            launch_units!(
                client,
                CUBE,
                total_kernel(
                    buffer(&partials, chunks.count()),
                    buffer(&total, 1),
                    chunks.count()
                )
            );
        }
        total
    }
}

/// Scales the `len` f32 at `x` by `max_norm / √squares[0]` where that norm
/// exceeds `max_norm` (`squares`: one f32 on the device, the squared norm
/// the clipping is judged on).
pub fn clip_to_norm(client: &Client, x: &Handle, len: usize, squares: &Handle, max_norm: f32) {
    if len == 0 {
        return;
    }
    let max_norm = f32_arg(client, &[max_norm]);
    // SAFETY: `x` holds `len` f32 (the caller's contract), `squares` one.
    unsafe {
        launch_units!(
            client,
            len,
            clip_kernel(buffer(x, len), buffer(squares, 1), max_norm, len)
        );
    }
}

#[cfg(test)]
crate::device::cuda_source::cuda_sources![
    total_kernel::TotalKernel(b(), b(), ()),
    clip_kernel::ClipKernel(b(), b(), b(), ()),
];
