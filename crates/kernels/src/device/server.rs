//! The server side of the compressed allreduce on the device: the `n`
//! received compressed copies of a chunk, read from the received messages
//! where they lie, are unpacked and averaged in one launch (summed in copy
//! order from zero, then scaled by `1/n`, exactly as the CPU does, so the
//! average is bit-identical), then recompressed with the server error by
//! the worker kernels. The compressed allreduce reaches it through
//! [`crate::device_messages::DeviceMessages`] in a device run.

use cubecl::prelude::*;
use cubecl::server::Handle;

use super::cube::{bit, buffer, launch_units, unit_item};
use super::onebit::{DeviceCompressed, compress};
use crate::onebit::{Scale, blocks_for, effective_block, words_for};

/// `avg[i] = (Σ_c ±scale_c(i)) · inv_n[0]` over the `copies` messages in
/// `messages` (copy `c` at `c · message` words: its sign words, then its
/// scales' f32 bits from word `sign_words`); one unit per sign word.
#[cube(launch_unchecked)]
fn average_kernel(
    messages: &[u32],
    inv_n: &[f32],
    avg: &mut [f32],
    #[comptime] copies: usize,
    #[comptime] message: usize,
    #[comptime] sign_words: usize,
    #[comptime] block: usize,
    len: usize,
) {
    // `div_ceil` has no cubecl expansion.
    #[allow(clippy::manual_div_ceil)]
    let w = unit_item((len + 31) / 32);
    #[unroll]
    for b in 0..32usize {
        let i = w * 32 + b;
        if i < len {
            let mut acc = 0.0f32;
            #[unroll]
            for c in 0..copies {
                let word = messages[c * message + w];
                let s = f32::reinterpret(messages[c * message + sign_words + i / block]);
                if bit(word, b) {
                    acc += s;
                } else {
                    acc -= s;
                }
            }
            if copies > 1 {
                acc *= inv_n[0];
            }
            avg[i] = acc;
        }
    }
}

/// `copies` compressed copies of one `len`-element chunk on the device, as
/// the compressed allreduce's messages: copy `c` at word `c · message`,
/// its sign words first, its scales' f32 bits from word `sign_words`.
pub struct ReceivedCopies<'a> {
    /// The messages, `copies · message` u32 words.
    pub messages: &'a Handle,
    /// Number of copies (ranks).
    pub copies: usize,
    /// Words from one copy to the next.
    pub message: usize,
    /// Words before a copy's scales (≥ `words_for(len)`).
    pub sign_words: usize,
}

/// The device twin of [`crate::server::average_and_recompress`]: `average`
/// (f32, `len`) receives the plain average, `server_error` is updated, and
/// `out` gets the recompressed chunk.
#[allow(clippy::too_many_arguments)]
pub fn average_and_recompress(
    client: &Client,
    received: &ReceivedCopies<'_>,
    len: usize,
    block: usize,
    scale: Scale,
    average: &Handle,
    server_error: &Handle,
    out: &DeviceCompressed,
) {
    assert!(received.copies > 0, "at least one copy to average");
    if len == 0 {
        return;
    }
    let block = effective_block(block, len);
    assert!(
        received.sign_words >= words_for(len)
            && received.message >= received.sign_words + blocks_for(len, block),
        "messages too small for {len} elements in blocks of {block}"
    );
    let inv_n = client.create_from_slice(f32::as_bytes(&[1.0 / received.copies as f32]));
    // SAFETY: `messages` holds `copies` messages whose sign words and
    // scales fit (the caller's layout, bounds asserted above), `average`
    // holds `len` floats, and the kernel bounds every access by those.
    unsafe {
        launch_units!(
            client,
            words_for(len),
            average_kernel(
                buffer(received.messages, received.copies * received.message),
                buffer(&inv_n, 1),
                buffer(average, len),
                received.copies,
                received.message,
                received.sign_words,
                block,
                len
            )
        );
    }
    compress(client, average, server_error, len, block, scale, out);
}

#[cfg(test)]
crate::device::cuda_source::cuda_sources![
    average_kernel::AverageKernel(b(), b(), b(), (), 4, 8196, 8192, 65_536),
    average_kernel::AverageKernel(b(), b(), b(), (), 1, 8193, 8192, 262_144),
];
