//! Where each packed selection word's selected elements start among all
//! the selected ones (the exclusive prefix sums of the words'
//! populations), and how many are selected, computed on the device: SLAMB's
//! gather and scatter need the offsets there and the host needs only the
//! count (to size the gathered values and their exchanges). Reading the
//! words back instead moved one word per 32 elements to the host and the
//! offsets back (2 × 13.6 MB per step at BERT-base's 110M parameters).
//!
//! Three levels of sequential sums in unsigned integers, so the result is
//! exact and does not depend on the device: a unit counts the population
//! of a group of [`GROUP`] words; a unit scans the counts of a block of
//! [`BLOCK`] groups; one unit scans the blocks' totals (≈830 for BERT-base,
//! 2 600 for BERT-large) and writes the count; a unit per group then walks
//! its words from its block's and its own start. No shared memory or plane
//! instructions: it runs wherever cubecl does (lavapipe has no planes).

use cubecl::prelude::*;
use cubecl::server::Handle;

use super::cube::{buffer, launch_units, unit_item};
use crate::host_reads;

/// Words one unit counts and walks.
const GROUP: usize = 64;
/// Groups one unit scans.
const BLOCK: usize = 64;

/// `counts[g]`: the set bits in words `GROUP·g ..` of the first `n` of
/// `words` (its handle may be longer: a kernel's `len()` is the handle's).
#[cube(launch_unchecked)]
fn group_counts_kernel(words: &[u32], counts: &mut [u32], n: usize) {
    let g = unit_item(counts.len());
    let mut sum = 0u32;
    for k in 0..GROUP {
        let w = g * GROUP + k;
        if w < n {
            sum += u32::count_ones(words[w]);
        }
    }
    counts[g] = sum;
}

/// `starts[g]`: the counts of the groups before `g` in its block;
/// `totals[b]`: block `b`'s sum.
#[cube(launch_unchecked)]
fn block_scan_kernel(counts: &[u32], starts: &mut [u32], totals: &mut [u32]) {
    let b = unit_item(totals.len());
    let mut run = 0u32;
    for k in 0..BLOCK {
        let g = b * BLOCK + k;
        if g < counts.len() {
            starts[g] = run;
            run += counts[g];
        }
    }
    totals[b] = run;
}

/// One unit: `block_starts[b]`, the totals of the blocks before `b`, and
/// `count[0]`, all of them.
#[cube(launch_unchecked)]
fn top_scan_kernel(totals: &[u32], block_starts: &mut [u32], count: &mut [u32]) {
    let _ = unit_item(1usize);
    let mut run = 0u32;
    for b in 0..totals.len() {
        block_starts[b] = run;
        run += totals[b];
    }
    count[0] = run;
}

/// `offsets[w]`: the set bits in the words before `w`, for the first `n`.
#[cube(launch_unchecked)]
fn word_offsets_kernel(
    words: &[u32],
    starts: &[u32],
    block_starts: &[u32],
    offsets: &mut [u32],
    n: usize,
) {
    let g = unit_item(starts.len());
    let mut at = block_starts[g / BLOCK] + starts[g];
    for k in 0..GROUP {
        let w = g * GROUP + k;
        if w < n {
            offsets[w] = at;
            at += u32::count_ones(words[w]);
        }
    }
}

/// The exclusive prefix sums of the populations of the `n` words in
/// `words` (a new buffer of `n` words, one at least) and their total: the
/// one read to the host.
pub fn word_offsets(client: &Client, words: &Handle, n: usize) -> (Handle, usize) {
    let offsets = client.empty(n.max(1) * 4);
    if n == 0 {
        return (offsets, 0);
    }
    let groups = n.div_ceil(GROUP);
    let blocks = groups.div_ceil(BLOCK);
    let [counts, starts] = [groups; 2].map(|len| client.empty(len * 4));
    let [totals, block_starts] = [blocks; 2].map(|len| client.empty(len * 4));
    let count = client.empty(4);
    // SAFETY: every buffer holds the length it is passed with (`words` `n`
    // words, the caller's contract); each kernel bounds its accesses by
    // those lengths, and a group's block `g / BLOCK` is below `blocks`.
    unsafe {
        launch_units!(
            client,
            groups,
            group_counts_kernel(buffer(words, n), buffer(&counts, groups), n)
        );
        launch_units!(
            client,
            blocks,
            block_scan_kernel(
                buffer(&counts, groups),
                buffer(&starts, groups),
                buffer(&totals, blocks)
            )
        );
        launch_units!(
            client,
            1,
            top_scan_kernel(
                buffer(&totals, blocks),
                buffer(&block_starts, blocks),
                buffer(&count, 1)
            )
        );
        launch_units!(
            client,
            groups,
            word_offsets_kernel(
                buffer(words, n),
                buffer(&starts, groups),
                buffer(&block_starts, blocks),
                buffer(&offsets, n),
                n
            )
        );
    }
    let total = host_reads::read_u32(client, count)[0] as usize;
    (offsets, total)
}

#[cfg(test)]
crate::device::cuda_source::cuda_sources![
    group_counts_kernel::GroupCountsKernel(b(), b(), ()),
    block_scan_kernel::BlockScanKernel(b(), b(), b()),
    top_scan_kernel::TopScanKernel(b(), b(), b()),
    word_offsets_kernel::WordOffsetsKernel(b(), b(), b(), b(), ()),
];
