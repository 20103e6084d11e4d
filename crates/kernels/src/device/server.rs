//! The server side of the compressed allreduce on the device: the `n`
//! received compressed copies of a chunk are unpacked and averaged in one
//! launch (summed in copy order from zero, then scaled by `1/n`, exactly as
//! the CPU does, so the average is bit-identical), then recompressed with
//! the server error by the worker kernels. The compressed allreduce reaches
//! it through [`crate::tensor::TensorServer`] in a device run.

use cubecl::prelude::*;
use cubecl::server::Handle;

use super::cube::{bit, buffer, launch_units, unit_item};
use super::onebit::{DeviceCompressed, compress};
use crate::onebit::{Scale, blocks_for, effective_block, words_for};

/// `avg[i] = (Σ_c ±scales[c][i / block]) · inv_n[0]`; one unit per word.
#[cube(launch_unchecked)]
fn average_kernel(
    bits: &[u32],
    scales: &[f32],
    inv_n: &[f32],
    avg: &mut [f32],
    #[comptime] copies: usize,
    #[comptime] words_stride: usize,
    #[comptime] scales_stride: usize,
    #[comptime] block: usize,
) {
    let w = unit_item(words_stride);
    let len = avg.len();
    #[unroll]
    for b in 0..32usize {
        let i = w * 32 + b;
        if i < len {
            let mut acc = 0.0f32;
            #[unroll]
            for c in 0..copies {
                let word = bits[c * words_stride + w];
                let s = scales[c * scales_stride + i / block];
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

/// `copies` compressed copies of one `len`-element chunk, laid out on the
/// device copy after copy.
pub struct ReceivedCopies<'a> {
    /// Sign words: copy `c` at `c · words_stride`.
    pub bits: &'a Handle,
    /// Scales: copy `c` at `c · scales_stride`.
    pub scales: &'a Handle,
    /// Number of copies (ranks).
    pub copies: usize,
    /// Words between consecutive copies (≥ `words_for(len)`).
    pub words_stride: usize,
    /// Scales between consecutive copies (≥ `blocks_for(len, block)`).
    pub scales_stride: usize,
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
        received.words_stride >= words_for(len),
        "words_stride too small"
    );
    assert!(
        received.scales_stride >= blocks_for(len, block),
        "scales_stride too small"
    );
    let inv_n = client.create_from_slice(f32::as_bytes(&[1.0 / received.copies as f32]));
    // SAFETY: the buffers hold `copies` strides of bits and scales (the
    // caller's layout, bounds asserted above), `average` holds `len` floats,
    // and the kernel bounds every access by those counts.
    unsafe {
        launch_units!(
            client,
            received.words_stride,
            average_kernel(
                buffer(received.bits, received.copies * received.words_stride),
                buffer(received.scales, received.copies * received.scales_stride),
                buffer(&inv_n, 1),
                buffer(average, len),
                received.copies,
                received.words_stride,
                received.scales_stride,
                block
            )
        );
    }
    compress(client, average, server_error, len, block, scale, out);
}
