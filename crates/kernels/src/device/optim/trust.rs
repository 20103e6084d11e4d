//! LAMB's step with its trust coefficients computed on the device: the
//! first pass leaves each chunk's `Σx²` and `Σu²` there, one cube per
//! segment totals its chunks' and turns them into the segment's rate
//! `lr·c`, and the second pass reads the rates there. The host waits for
//! nothing between the passes (it used to read the partials, total them
//! in f64 and upload the rates, an idle gap on a GPU); it reads the
//! coefficients afterwards only where it keeps them (1-bit LAMB's running
//! average), once the update is queued.
//!
//! The totals are f32 (the chunks' own partials are f32 either way), each
//! cube's units summing their strided share in chunk order and then the
//! cube's fixed tree, so the bits do not vary between runs; the host's
//! reference totals the same partials in f64 (terse-optim's
//! `pass::lamb::TrustRule`), a difference of f32 rounding in `c`.

use cubecl::prelude::*;
use cubecl::server::Handle;

use super::chunks::*;
use super::uncompressed::{lamb_norms_kernel, rate_update_arg};
use crate::device::cube::{buffer, launch_units, unit_item};
use crate::host_reads;

// Indices into the trust kernel's constants.
const LR: usize = 0;
const C_MIN: usize = 1;
const C_MAX: usize = 2;

/// `‖x‖/‖u‖` from the squared norms; exactly 1 where either is 0, the
/// rule LAMB's and SLAMB's ratios share (terse-optim's
/// `trust_coefficient` without its clip).
#[cube]
pub(crate) fn trust_ratio(xx: f32, uu: f32) -> f32 {
    let mut r = 1.0f32;
    if xx != 0.0 && uu != 0.0 {
        r = f32::sqrt(xx) / f32::sqrt(uu);
    }
    r
}

/// [`trust_ratio`] clipped to `[lo, hi]`, the 1 of a zero norm left
/// unclipped (terse-optim's `trust_coefficient`).
#[cube]
pub(crate) fn clipped_trust_ratio(xx: f32, uu: f32, lo: f32, hi: f32) -> f32 {
    let mut r = trust_ratio(xx, uu);
    if xx != 0.0 && uu != 0.0 {
        r = f32::min(f32::max(r, lo), hi);
    }
    r
}

/// One cube per segment: `Σx²` and `Σu²` over the segment's chunks
/// (`partials` at `2·chunk` and `2·chunk + 1`, chunks
/// `first_chunk[s]..first_chunk[s + 1]`), then, by unit 0, the coefficient
/// `c = clamp(‖x‖/‖u‖, c_min, c_max)` — exactly 1 where a norm is 0
/// (marked degenerate) or where the segment takes no trust ratio
/// (`trusted[s] == 0`) — into `trusts[2s]` with the mark in `trusts[2s + 1]`,
/// and the rate `lr·c` into `rates[s]`.
#[cube(launch_unchecked)]
fn trust_kernel(
    partials: &[f32],
    first_chunk: &[u32],
    trusted: &[f32],
    constants: &[f32],
    rates: &mut [f32],
    trusts: &mut [f32],
) {
    let mut shared = Shared::<[f32]>::new_slice(2 * CUBE);
    let segment = segment_reduce(partials, first_chunk, &mut shared, 2usize, false);
    if UNIT_POS == 0 {
        let (xx, uu) = (shared[0], shared[CUBE]);
        let mut c = 1.0f32;
        let mut degenerate = 0.0f32;
        if trusted[segment] != 0.0 {
            c = clipped_trust_ratio(xx, uu, constants[C_MIN], constants[C_MAX]);
            if xx == 0.0 || uu == 0.0 {
                degenerate = 1.0;
            }
        }
        rates[segment] = constants[LR] * c;
        trusts[2 * segment] = c;
        trusts[2 * segment + 1] = degenerate;
    }
}

/// What LAMB's trust coefficients take besides the norms.
#[derive(Debug, Clone, Copy)]
pub struct TrustConstants<'a> {
    /// The step's learning rate.
    pub lr: f32,
    /// The coefficient's lower clip.
    pub c_min: f32,
    /// The coefficient's upper clip.
    pub c_max: f32,
    /// Per segment: whether it takes a trust ratio (false: a coefficient
    /// of exactly 1, FusedLAMB's no-decay group).
    pub trusted: &'a [bool],
}

/// LAMB's step over `chunks`: `m` and `v` take `g`, each segment's trust
/// coefficient is computed on the device, and `x -= lr·c·u`; nothing is
/// read back. The coefficients can be read afterwards
/// ([`QueuedTrusts::read`]).
///
/// # Panics
/// If `trust.trusted` has not one entry per segment.
#[allow(clippy::too_many_arguments)]
pub fn lamb_step(
    client: &Client,
    chunks: &DeviceChunks,
    [x, m, v, g]: [&Handle; 4],
    coefficients: &MomentCoefficients,
    inside: bool,
    trust: &TrustConstants<'_>,
) -> QueuedTrusts {
    assert_eq!(trust.trusted.len(), chunks.segments, "one flag per segment");
    let segments = chunks.segments;
    let queued = |trusts| QueuedTrusts {
        client: client.clone(),
        trusts,
        segments,
    };
    if chunks.is_empty() {
        // Every segment is empty: its norms are 0, its coefficient 1 (a
        // degenerate one where a ratio would apply). Padded to one entry:
        // a zero-sized buffer cannot be made.
        let mut marks: Vec<f32> = trust
            .trusted
            .iter()
            .flat_map(|&t| [1.0, f32::from(u8::from(t))])
            .collect();
        marks.resize(marks.len().max(2), 0.0);
        return queued(client.create_from_slice(f32::as_bytes(&marks)));
    }
    let trusts = client.empty(2 * segments * size_of::<f32>());
    let c = chunks.coefficients(client, coefficients, 0.0);
    let (partials, partials_arg) = chunks.partials(client, 2);
    // SAFETY: as in `adam_step`; `partials` holds two f32 per chunk.
    unsafe {
        launch_chunks!(
            client,
            chunks,
            lamb_norms_kernel([x, m, v, g], c, partials_arg, inside)
        );
    }
    let constants = f32_arg(client, &[trust.lr, trust.c_min, trust.c_max]);
    let rates = client.empty(segments * size_of::<f32>());
    let ((count, dim), first_chunk) = chunks.segment_launch(client);
    // SAFETY: `partials` holds two f32 per chunk, `first_chunk` one u32
    // per segment plus one (each below or at the chunk count), the flags
    // and rates one f32 per segment, `trusts` two; one cube per segment,
    // and cubes past the last segment terminate.
    unsafe {
        trust_kernel::launch_unchecked(
            client,
            count,
            dim,
            buffer(&partials, 2 * chunks.count()),
            first_chunk,
            flags_arg(client, trust.trusted),
            constants,
            buffer(&rates, segments),
            buffer(&trusts, 2 * segments),
        );
    }
    // SAFETY: `rates` holds one f32 per segment, what the update reads.
    let rates = unsafe { buffer(&rates, segments) };
    rate_update_arg(
        client,
        chunks,
        [x, m, v],
        coefficients,
        rates,
        inside,
        false,
    );
    queued(trusts)
}

/// 1-bit LAMB's running trust average, one unit per segment:
/// `c_avg = β3·c_avg + (1-β3)·c` where the coefficient is not degenerate
/// (`trusts` as [`trust_kernel`] writes them; `beta_3` holds β3). The
/// count is an argument: `c_avg` is the first part of a larger buffer,
/// and a kernel's `len()` is its buffer's whole size.
#[cube(launch_unchecked)]
fn average_trust_kernel(trusts: &[f32], beta_3: &[f32], c_avg: &mut [f32], segments: usize) {
    let s = unit_item(segments);
    if trusts[2 * s + 1] == 0.0 {
        c_avg[s] = beta_3[0] * c_avg[s] + (1.0 - beta_3[0]) * trusts[2 * s];
    }
}

/// LAMB's trust coefficients as computed on the device, not yet read.
#[must_use = "the coefficients are only computed, not read"]
pub struct QueuedTrusts {
    client: Client,
    trusts: Handle,
    segments: usize,
}

impl QueuedTrusts {
    /// Each segment's coefficient and whether one of its norms was 0
    /// (coefficient 1 by that rule): waits for the device.
    pub fn read(self) -> Vec<(f32, bool)> {
        if self.segments == 0 {
            return Vec::new();
        }
        let values = host_reads::read_f32(&self.client, self.trusts);
        values[..2 * self.segments]
            .chunks_exact(2)
            .map(|pair| (pair[0], pair[1] != 0.0))
            .collect()
    }
}

impl QueuedTrusts {
    /// Queues 1-bit LAMB's running average of the coefficients into
    /// `c_avg` (its first f32 per segment): `c_avg = β3·c_avg + (1-β3)·c`
    /// for each segment whose coefficient is not degenerate (a norm of 0).
    /// Nothing is read: the average stays on the device.
    ///
    /// # Panics
    /// If `c_avg` holds fewer f32 than there are segments (the caller's
    /// contract: it was created with at least that many).
    pub fn average_into(&self, c_avg: &Handle, beta_3: f32) {
        let p = self.segments;
        if p == 0 {
            return;
        }
        assert!(
            c_avg.size_in_used() as usize >= p * size_of::<f32>(),
            "one average per segment"
        );
        let beta_3 = f32_arg(&self.client, &[beta_3]);
        // SAFETY: `trusts` holds two f32 per segment (written by
        // `lamb_step` for `segments` segments), `c_avg` at least one per
        // segment (checked above); one unit per segment.
        unsafe {
            launch_units!(
                &self.client,
                p,
                average_trust_kernel(buffer(&self.trusts, 2 * p), beta_3, buffer(c_avg, p), p)
            );
        }
    }
}

impl std::fmt::Debug for QueuedTrusts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "QueuedTrusts({} segments)", self.segments)
    }
}

#[cfg(test)]
crate::device::cuda_source::cuda_sources![
    trust_kernel::TrustKernel(b(), b(), b(), b(), b(), b()),
    average_trust_kernel::AverageTrustKernel(b(), b(), b(), ()),
];
