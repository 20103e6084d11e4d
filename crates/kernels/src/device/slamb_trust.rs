//! SLAMB's trust ratios computed on the device (terse-optim's
//! `slamb::trust_ratios` is the reference): each chunk's norms split by
//! the step's selection stay there, one cube per segment totals its
//! chunks' and writes the segment's `[φ_max, φ_min, lo, hi]`, which the
//! update ([`super::slamb::apply`]) reads there. The host used to read the
//! partials, total them in f64 and upload the ratios: a wait for the
//! device inside every SLAMB step.
//!
//! The totals are f32 (the partials are f32 either way), in a fixed order
//! (each unit's strided share in chunk order, then the cube's tree); the
//! element counts are totalled as f32 too, which is exact for the only
//! question asked of them, whether a count is zero.

use cubecl::prelude::*;
use cubecl::server::Handle;

use super::cube::{CUBE, buffer};
use super::optim::{
    DeviceChunks, MomentCoefficients, clipped_trust_ratio, f32_arg, flags_arg, segment_reduce,
    trust_ratio,
};
use super::slamb::queue_split_norms;

// Indices into the kernel's constants.
const PHI_MIN: usize = 0;
const PHI_MAX: usize = 1;
const UNBOUNDED: usize = 2;

/// One cube per segment: the six sums of its chunks' partials (`Σx²`,
/// `Σu²` of the selected elements, the same of the others, the two counts;
/// six f32 per chunk), then, by unit 0, the segment's ratios and bounds
/// into `phi[4s..4s + 4]`:
/// - paper: each ratio clipped to `[φ_min, φ_max]`, a segment with only one
///   kind using that kind's for both, unbounded blend;
/// - authors: unclipped ratios with the blend clipped to `[φ_min, φ_max]`;
///   a 1-D segment one plain ratio of all its elements, unbounded.
#[cube(launch_unchecked)]
fn slamb_trust_kernel(
    partials: &[f32],
    first_chunk: &[u32],
    one_dimensional: &[f32],
    constants: &[f32],
    phi: &mut [f32],
    #[comptime] authors: bool,
) {
    let mut shared = Shared::<[f32]>::new_slice(6 * CUBE);
    let segment = segment_reduce(partials, first_chunk, &mut shared, 6usize, false);
    if UNIT_POS == 0 {
        let (x_sel, u_sel) = (shared[0], shared[CUBE]);
        let (x_rest, u_rest) = (shared[2 * CUBE], shared[3 * CUBE]);
        let (selected, rest) = (shared[4 * CUBE], shared[5 * CUBE]);
        let (phi_min, phi_max) = (constants[PHI_MIN], constants[PHI_MAX]);
        let mut lo = 0.0f32;
        let mut hi = constants[UNBOUNDED];
        let mut fresh = trust_ratio(x_sel, u_sel);
        let mut stale = trust_ratio(x_rest, u_rest);
        if authors {
            if one_dimensional[segment] != 0.0 {
                fresh = trust_ratio(x_sel + x_rest, u_sel + u_rest);
                stale = fresh;
            } else {
                lo = phi_min;
                hi = phi_max;
            }
        } else {
            fresh = clipped_trust_ratio(x_sel, u_sel, phi_min, phi_max);
            stale = clipped_trust_ratio(x_rest, u_rest, phi_min, phi_max);
            if rest == 0.0 {
                stale = fresh;
            } else if selected == 0.0 {
                fresh = stale;
            }
        }
        phi[4 * segment] = fresh;
        phi[4 * segment + 1] = stale;
        phi[4 * segment + 2] = lo;
        phi[4 * segment + 3] = hi;
    }
}

/// How SLAMB turns a segment's split norms into its ratios.
#[derive(Debug, Clone, Copy)]
pub struct SlambTrust<'a> {
    /// The authors' form (unclipped ratios, clipped blend, 1-D segments
    /// one plain ratio) rather than the paper's.
    pub authors: bool,
    /// The clip range's lower end, φ_min.
    pub phi_min: f32,
    /// Its upper end, φ_max.
    pub phi_max: f32,
    /// Per segment: whether it is 1-D (a bias, a norm's scale).
    pub one_dimensional: &'a [bool],
}

/// Each segment's `[φ_max, φ_min, lo, hi]` (four f32 per segment, in a new
/// device buffer, not read) from the norms of `x` and of Adam's direction
/// split by `selection`.
///
/// # Panics
/// If `trust.one_dimensional` has not one entry per segment.
#[allow(clippy::too_many_arguments)]
pub fn trust_ratios(
    client: &Client,
    chunks: &DeviceChunks,
    [x, m, v]: [&Handle; 3],
    selection: &Handle,
    coefficients: &MomentCoefficients,
    inside: bool,
    trust: &SlambTrust<'_>,
) -> Handle {
    let segments = chunks.segment_count();
    assert_eq!(
        trust.one_dimensional.len(),
        segments,
        "one flag per segment"
    );
    let Some(partials) =
        queue_split_norms(client, chunks, [x, m, v], selection, coefficients, inside)
    else {
        // No elements: every ratio 1, unbounded (as a host with no norms).
        let phi: Vec<f32> = (0..segments.max(1))
            .flat_map(|_| [1.0, 1.0, 0.0, f32::MAX])
            .collect();
        return client.create_from_slice(f32::as_bytes(&phi));
    };
    let phi = client.empty(4 * segments * size_of::<f32>());
    let ((count, dim), first_chunk) = chunks.segment_launch(client);
    // SAFETY: `partials` holds six f32 per chunk, `first_chunk` one u32 per
    // segment plus one (each at most the chunk count), the flags one f32
    // per segment, `phi` four; one cube per segment, and cubes past the
    // last segment terminate.
    unsafe {
        slamb_trust_kernel::launch_unchecked(
            client,
            count,
            dim,
            buffer(&partials, 6 * chunks.count()),
            first_chunk,
            flags_arg(client, trust.one_dimensional),
            f32_arg(client, &[trust.phi_min, trust.phi_max, f32::MAX]),
            buffer(&phi, 4 * segments),
            trust.authors,
        );
    }
    phi
}

#[cfg(test)]
crate::device::cuda_source::cuda_sources![
    slamb_trust_kernel::SlambTrustKernel(b(), b(), b(), b(), b(), true),
    slamb_trust_kernel::SlambTrustKernel(b(), b(), b(), b(), b(), false),
];
