//! 0/1 Adam's synchronisation (ALGORITHMS.md "0/1 Adam"): the two passes
//! around the 1-bit allreduce of what each rank's local steps applied
//! since the last synchronisation, `x − x_sync` (the local steps
//! themselves are the compression stage's `accumulate_momentum` and
//! `frozen_apply`).
//!
//! Where v is exactly zero (no gradient ever reached the coordinate) x
//! stays at `x_sync` and m is zeroed, as in the compression stage, when
//! the caller holds such coordinates (`hold`).

use cubecl::prelude::*;
use cubecl::server::Handle;

use super::chunks::*;

/// Before the allreduce: `x = (x − x_sync)·denom(v)`, the applied updates
/// as momentum times rate, in x's buffer (which the synchronisation
/// rewrites from `x_sync` afterwards).
#[cube(launch_unchecked)]
fn sync_scale_kernel(
    x: &mut [f32],
    synced: &[f32],
    v: &[f32],
    table: &ChunkTable,
    c: &[f32],
    #[comptime] inside: bool,
) {
    let (mut i, end) = table.range();
    while i < end {
        x[i] = (x[i] - synced[i]) * denominator(v[i], c, inside);
        i += CUBE;
    }
}

/// After the allreduce of `ū` (in x's buffer): `m = −(ū/Σlr)` (`c[LR]`
/// holds the sum of the rates since the last synchronisation), `x =
/// x_sync + ū/denom(v)`, and `x_sync = x`.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn sync_apply_kernel(
    x: &mut [f32],
    synced: &mut [f32],
    m: &mut [f32],
    v: &[f32],
    table: &ChunkTable,
    c: &[f32],
    #[comptime] inside: bool,
    #[comptime] hold: bool,
) {
    let (mut i, end) = table.range();
    while i < end {
        let vi = v[i];
        let ui = x[i];
        let mut xi = synced[i];
        if hold && vi <= 0.0 {
            m[i] = 0.0;
        } else {
            m[i] = -(ui / c[LR]);
            xi += ui / denominator(vi, c, inside);
        }
        x[i] = xi;
        synced[i] = xi;
        i += CUBE;
    }
}

/// The pass before a synchronisation's allreduce.
pub fn sync_scale(
    client: &Client,
    chunks: &DeviceChunks,
    [x, synced, v]: [&Handle; 3],
    coefficients: &MomentCoefficients,
    inside: bool,
) {
    if chunks.is_empty() {
        return;
    }
    let c = chunks.coefficients(client, coefficients, 0.0);
    // SAFETY: every handle holds `chunks.len()` f32 (`DeviceChunks::flat`).
    unsafe {
        launch_chunks!(client, chunks, sync_scale_kernel([x, synced, v], c, inside));
    }
}

/// The pass after a synchronisation's allreduce; `lr_sum` is the sum of
/// the rates of the local steps it closes.
pub fn sync_apply(
    client: &Client,
    chunks: &DeviceChunks,
    [x, synced, m, v]: [&Handle; 4],
    coefficients: &MomentCoefficients,
    lr_sum: f32,
    inside: bool,
    hold: bool,
) {
    if chunks.is_empty() {
        return;
    }
    let c = chunks.coefficients(client, coefficients, lr_sum);
    // SAFETY: as in `sync_scale`.
    unsafe {
        launch_chunks!(
            client,
            chunks,
            sync_apply_kernel([x, synced, m, v], c, inside, hold)
        );
    }
}

#[cfg(test)]
crate::device::cuda_source::cuda_sources![
    sync_scale_kernel::SyncScaleKernel(b(), b(), b(), table(), b(), true),
    sync_scale_kernel::SyncScaleKernel(b(), b(), b(), table(), b(), false),
    sync_apply_kernel::SyncApplyKernel(b(), b(), b(), b(), table(), b(), true, true),
    sync_apply_kernel::SyncApplyKernel(b(), b(), b(), b(), table(), b(), false, false),
];
