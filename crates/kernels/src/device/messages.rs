//! The compressed allreduce's messages on the device
//! (`terse_compress::messages`): chunks' packed signs and scales laid into
//! the messages that are sent, and the gathered messages dequantised where
//! they were received, so the exchanges move device buffers.

use cubecl::prelude::*;
use cubecl::server::Handle;

use super::cube::{bit, buffer, launch_units, unit_item};
use super::onebit::DeviceCompressed;
use crate::messages::MessageGeometry;
use crate::onebit::words_for;

/// Message word `k` of `out`: in message `j = k / message`, chunk `j`'s
/// sign word (`bits[j · sign_words + r]`) or scale slot (`scales[j · slots
/// + r - sign_words]`, its f32 bits), zero past either buffer's end and in
/// the padding. One unit per word of `out`.
/// The counts are arguments: a kernel's `len()` is its handle's size,
/// which may be longer.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn pack_kernel(
    bits: &[u32],
    scales: &[f32],
    out: &mut [u32],
    words: usize,
    slot_count: usize,
    total: usize,
    #[comptime] message: usize,
    #[comptime] sign_words: usize,
    #[comptime] slots: usize,
) {
    let k = unit_item(total);
    let j = k / message;
    let r = k % message;
    let mut word = 0u32;
    if r < sign_words {
        let w = j * sign_words + r;
        if w < words {
            word = bits[w];
        }
    } else if r < sign_words + slots {
        let s = j * slots + (r - sign_words);
        if s < slot_count {
            word = u32::reinterpret(scales[s]);
        }
    }
    out[k] = word;
}

/// `out[i] = ±scale` from the messages of every chunk: element `i` of chunk
/// `j = i / chunk` reads message `j`'s sign word and scale slot. One unit
/// per sign word of `out`.
#[cube(launch_unchecked)]
fn decompress_kernel(
    messages: &[u32],
    out: &mut [f32],
    len: usize,
    #[comptime] chunk: usize,
    #[comptime] block: usize,
    #[comptime] message: usize,
) {
    // `div_ceil` has no cubecl expansion.
    #[allow(clippy::manual_div_ceil)]
    let w = unit_item((len + 31) / 32);
    let sign_words = comptime!(chunk / 32);
    let j = w / sign_words;
    let first = j * message;
    let word = messages[first + w % sign_words];
    #[unroll]
    for b in 0..32usize {
        let i = w * 32 + b;
        if i < len {
            let s = f32::reinterpret(messages[first + sign_words + (i % chunk) / block]);
            if bit(word, b) {
                out[i] = s;
            } else {
                out[i] = -s;
            }
        }
    }
}

/// Lays `count` chunks of `compressed` (sign words at `sign_words` a chunk,
/// `words` in all; scale slots at `slots` a chunk, `slot_count` in all)
/// into `count` messages of `geometry.message` words at `out`.
pub fn pack_messages(
    client: &Client,
    compressed: &DeviceCompressed,
    (words, slot_count): (usize, usize),
    geometry: &MessageGeometry,
    count: usize,
    out: &Handle,
) {
    let sign_words = geometry.sign_words();
    let slots = geometry.layout.slots_per_chunk();
    let total = count * geometry.message;
    assert!(sign_words + slots <= geometry.message, "message too short");
    assert!(words > 0 && slot_count > 0, "nothing to pack");
    // SAFETY: `compressed` holds `words` words and `slot_count` scales (the
    // caller's sizes), `out` at least `count` messages; the kernel bounds
    // every read by those counts and writes one word per unit.
    unsafe {
        launch_units!(
            client,
            total,
            pack_kernel(
                buffer(&compressed.bits, words),
                buffer(&compressed.scales, slot_count),
                buffer(out, total),
                words,
                slot_count,
                total,
                geometry.message,
                sign_words,
                slots
            )
        );
    }
}

/// Dequantises the `geometry.ranks` messages at `messages` (message `j`:
/// chunk `j`) into the f32 buffer `out` of `geometry.len` elements.
pub fn decompress_messages(
    client: &Client,
    messages: &Handle,
    geometry: &MessageGeometry,
    out: &Handle,
) {
    let len = geometry.len;
    if len == 0 {
        return;
    }
    // SAFETY: `messages` holds `ranks` messages covering every chunk of
    // `len` elements and `out` `len` floats; the kernel reads only the
    // words and slots of real elements.
    unsafe {
        launch_units!(
            client,
            words_for(len),
            decompress_kernel(
                buffer(messages, geometry.all_messages()),
                buffer(out, len),
                len,
                geometry.layout.chunk,
                geometry.layout.block,
                geometry.message
            )
        );
    }
}

#[cfg(test)]
crate::device::cuda_source::cuda_sources![
    pack_kernel::PackKernel(b(), b(), b(), (), (), (), 8196, 8192, 4),
    pack_kernel::PackKernel(b(), b(), b(), (), (), (), 8193, 8192, 1),
    decompress_kernel::DecompressKernel(b(), b(), (), 262_144, 65_536, 8196),
    decompress_kernel::DecompressKernel(b(), b(), (), 262_144, 262_144, 8193),
];
