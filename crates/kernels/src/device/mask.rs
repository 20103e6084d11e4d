//! SLAMB's masks on the device: the selection computed in the kernel with
//! the same 32-bit arithmetic as [`crate::mask`] (the hash mask's hash, the
//! cyclic mask's Feistel permutation), and the masked gather and scatter of
//! the selected values.
//!
//! One launch packs each 32-element word's selection bits (the mask, or the
//! always-synchronised bitmap); the exclusive prefix sums of the words'
//! populations follow on the device ([`super::word_offsets`]), which reads
//! only the selected count back; gather and scatter then move each word's
//! selected values from or to its offset.

use cubecl::prelude::*;
use cubecl::server::Handle;

use super::cube::{bit, buffer, launch_units, unit_item};
use super::word_offsets::word_offsets;
use crate::mask::{Mask, StepMask};
use crate::onebit::words_for;

#[cube]
pub(crate) fn mix32(x: u32) -> u32 {
    let mut x = x;
    x ^= x >> 16u32;
    x *= 0x7feb_352du32;
    x ^= x >> 15u32;
    x *= 0x846c_a68bu32;
    x ^ (x >> 16u32)
}

/// `selection[w]`: bit `b` set iff element `32w + b` is selected. `keys` is
/// `[key0, key1, threshold, all]` (threshold as u32; `all` = 1 when k = 1).
#[cube(launch_unchecked)]
fn select_kernel(keys: &[u32], always: &[u32], selection: &mut [u32], #[comptime] len: usize) {
    let w = unit_item(selection.len());
    let (key0, key1, threshold, all) = (keys[0], keys[1], keys[2], keys[3]);
    let mut packed = always[w];
    #[unroll]
    for b in 0..32usize {
        let i = w * 32 + b;
        if i < len {
            let h = mix32(mix32(u32::cast_from(i) + key0) ^ key1);
            if all == 1u32 || h < threshold {
                packed |= 1u32 << u32::cast_from(b);
            }
        }
    }
    selection[w] = packed;
}

/// π(j), [`crate::mask::permute`]: a 4-round Feistel network over
/// `2·half_bits` bits, walked until it lands below `len`. (The rounds index
/// `keys`: a cube function cannot iterate a slice.)
#[allow(clippy::needless_range_loop)]
#[cube]
fn permute(j: u32, keys: &[u32], half_bits: u32, len: u32) -> u32 {
    let mask = (1u32 << half_bits) - 1u32;
    let mut x = j;
    loop {
        let mut left = x >> half_bits;
        let mut right = x & mask;
        #[unroll]
        for r in 0..4usize {
            let next = left ^ (mix32(right ^ keys[r]) & mask);
            left = right;
            right = next;
        }
        x = (left << half_bits) | right;
        if x < len {
            break;
        }
    }
    x
}

/// The cyclic mask's `selection[w]`: element `j` is selected iff π(j) lies
/// in this step's chunk `[lo, hi)`. `keys` is `[k0, k1, k2, k3, half_bits,
/// lo, hi]`; the chunk as a range of π(j) (not `⌊π(j)·chunks/len⌋`, a
/// 64-bit product WGSL lacks) is the host's choice, [`cyclic_keys`].
#[cube(launch_unchecked)]
fn select_cyclic_kernel(
    keys: &[u32],
    always: &[u32],
    selection: &mut [u32],
    #[comptime] len: usize,
) {
    let w = unit_item(selection.len());
    let (half_bits, lo, hi) = (keys[4], keys[5], keys[6]);
    let n = u32::cast_from(len);
    let mut packed = always[w];
    #[unroll]
    for b in 0..32usize {
        let i = w * 32 + b;
        if i < len {
            let p = permute(u32::cast_from(i), keys, half_bits, n);
            if p >= lo && p < hi {
                packed |= 1u32 << u32::cast_from(b);
            }
        }
    }
    selection[w] = packed;
}

/// The cyclic kernel's constants for one step: the permutation's keys and
/// width, and the step's chunk as a range of π(j)
/// ([`StepMask::chunk_bounds`]).
fn cyclic_keys(step: &StepMask) -> [u32; 7] {
    let (
        StepMask::Cyclic {
            keys, half_bits, ..
        },
        Some(chunk),
    ) = (*step, step.chunk_bounds())
    else {
        unreachable!("cyclic_keys takes a cyclic step");
    };
    [
        keys[0],
        keys[1],
        keys[2],
        keys[3],
        half_bits,
        chunk.start,
        chunk.end,
    ]
}

/// Gather (`to[offsets[w] + k] = from[k-th selected element of word w]`)
/// or, with `gather` false, its inverse scatter. One unit per word.
#[cube(launch_unchecked)]
fn move_selected_kernel(
    from: &[f32],
    selection: &[u32],
    offsets: &[u32],
    to: &mut [f32],
    #[comptime] gather: bool,
) {
    let w = unit_item(selection.len());
    let word = selection[w];
    let mut at = offsets[w] as usize;
    #[unroll]
    for b in 0..32usize {
        if bit(word, b) {
            if gather {
                to[at] = from[w * 32 + b];
            } else {
                to[w * 32 + b] = from[at];
            }
            at += 1;
        }
    }
}

/// One step's selection on the device.
pub struct DeviceSelection {
    /// Packed selection bits, one word per 32 elements.
    pub words: Handle,
    offsets: Handle,
    /// Number of selected elements.
    pub count: usize,
    len: usize,
}

/// The always-synchronised ranges as packed bits (upload once per run).
pub fn always_bitmap(len: usize, always: &[std::ops::Range<usize>]) -> Vec<u32> {
    let mut words = vec![0u32; words_for(len)];
    for r in always {
        for j in r.clone() {
            words[j / 32] |= 1 << (j % 32);
        }
    }
    words
}

/// The selection `words` (one per 32 of `len` elements, on the device)
/// with their offsets and count ([`word_offsets`]).
fn on_device(client: &Client, words: Handle, len: usize) -> DeviceSelection {
    let (offsets, count) = word_offsets(client, &words, words_for(len));
    DeviceSelection {
        words,
        offsets,
        count,
        len,
    }
}

/// Evaluates `mask` at step `t` over `len` elements on the device;
/// `always` is [`always_bitmap`] uploaded.
///
/// # Panics
/// For a cyclic mask over another length than `len`.
pub fn select(
    client: &Client,
    mask: &Mask,
    t: u64,
    len: usize,
    always: &Handle,
) -> DeviceSelection {
    let words = words_for(len);
    let selection = client.empty(words.max(1) * 4);
    let step = mask.at_step(t);
    // SAFETY (both launches): `always` and `selection` hold `words` words,
    // `keys` its length; the kernels bound their accesses by those counts
    // and by `len`.
    match step {
        StepMask::Hash {
            key0,
            key1,
            threshold,
        } => {
            let all = u32::from(threshold > u64::from(u32::MAX));
            let keys = [key0, key1, threshold.min(u64::from(u32::MAX)) as u32, all];
            let keys = client.create_from_slice(u32::as_bytes(&keys));
            unsafe {
                launch_units!(
                    client,
                    words,
                    select_kernel(
                        buffer(&keys, 4),
                        buffer(always, words),
                        buffer(&selection, words),
                        len
                    )
                );
            }
        }
        StepMask::Cyclic { len: over, .. } => {
            assert_eq!(
                over as usize, len,
                "the cyclic mask's permutation is over another length"
            );
            let keys = cyclic_keys(&step);
            let keys_dev = client.create_from_slice(u32::as_bytes(&keys));
            unsafe {
                launch_units!(
                    client,
                    words,
                    select_cyclic_kernel(
                        buffer(&keys_dev, keys.len()),
                        buffer(always, words),
                        buffer(&selection, words),
                        len
                    )
                );
            }
        }
    }
    on_device(client, selection, len)
}

impl DeviceSelection {
    /// `values[k] = x[index_k]` (`values` holds `count` floats).
    pub fn gather(&self, client: &Client, x: &Handle, values: &Handle) {
        self.launch(client, x, values, true);
    }

    /// `x[index_k] = values[k]`.
    pub fn scatter(&self, client: &Client, values: &Handle, x: &Handle) {
        self.launch(client, values, x, false);
    }

    fn launch(&self, client: &Client, from: &Handle, to: &Handle, gather: bool) {
        let words = words_for(self.len);
        if words == 0 {
            return;
        }
        let (x_len, v_len) = (self.len, self.count.max(1));
        let (from_len, to_len) = if gather {
            (x_len, v_len)
        } else {
            (v_len, x_len)
        };
        // SAFETY: `x` holds `len` floats, `values` `count` (offsets are the
        // exclusive prefix sums of the words' populations, so every access
        // lands below `count`), selection and offsets one word each per 32.
        unsafe {
            launch_units!(
                client,
                words,
                move_selected_kernel(
                    buffer(from, from_len),
                    buffer(&self.words, words),
                    buffer(&self.offsets, words),
                    buffer(to, to_len),
                    gather
                )
            );
        }
    }
}

#[cfg(test)]
crate::device::cuda_source::cuda_sources![
    select_kernel::SelectKernel(b(), b(), b(), 109_482_240),
    select_kernel::SelectKernel(b(), b(), b(), 1_000_003),
    select_cyclic_kernel::SelectCyclicKernel(b(), b(), b(), 109_482_240),
    select_cyclic_kernel::SelectCyclicKernel(b(), b(), b(), 1_000_003),
    move_selected_kernel::MoveSelectedKernel(b(), b(), b(), b(), true),
    move_selected_kernel::MoveSelectedKernel(b(), b(), b(), b(), false),
];
