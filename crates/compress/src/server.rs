//! The server side of the compressed allreduce (ALGORITHMS.md phase 3): the
//! owner of a chunk averages the `n` compressed copies it received, adds its
//! server error and compresses the result again with error feedback —
//! wherever the server error lives: the allreduce hands a [`Server`] the
//! received messages and gets the recompressed one back on the host, as it
//! does with a [`crate::worker::Worker`]. [`HostServer`] runs the CPU loops
//! below; terse-kernels' `TensorServer` keeps the error on a device and runs
//! the same step as cubecl kernels.

use crate::onebit::{self, Scale};

/// One rank's compressed copy of a chunk: its sign words and block scales.
#[derive(Debug, Clone, Copy)]
pub struct Compressed<'a> {
    /// `words_for(len)` sign words.
    pub bits: &'a [u32],
    /// `blocks_for(len, block)` scales.
    pub scales: &'a [f32],
}

/// `z = (1/n)·Σ_i dequant(received[i]) + server_error`, then `z` compressed
/// into `bits`/`scales` with `server_error = z - dequant(z)`.
///
/// `average` is scratch of the chunk's length (its contents on return are the
/// plain average). Copies are summed in the order given (rank order), so the
/// result is the same on every machine.
pub fn average_and_recompress(
    received: &[Compressed<'_>],
    block: usize,
    scale: Scale,
    average: &mut [f32],
    server_error: &mut [f32],
    bits: &mut [u32],
    scales: &mut [f32],
) {
    assert!(!received.is_empty(), "at least one copy to average");
    average.fill(0.0);
    for copy in received {
        onebit::decompress_add(copy.bits, copy.scales, block, average);
    }
    let inv_n = 1.0 / received.len() as f32;
    if received.len() > 1 {
        average.iter_mut().for_each(|a| *a *= inv_n);
    }
    onebit::compress(average, server_error, block, scale, bits, scales);
}

/// One server step's work on the host side: the `n` received copies of
/// this rank's chunk (in rank order), how to recompress them, and where the
/// recompressed chunk goes.
#[derive(Debug)]
pub struct ServerStep<'r, 'c> {
    /// The copies, each `words_for(len)` sign words and its scales.
    pub received: &'r [Compressed<'c>],
    /// Elements per scale.
    pub block: usize,
    /// How a block's scale is computed.
    pub scale: Scale,
    /// The recompressed chunk's sign words.
    pub bits: &'r mut [u32],
    /// The recompressed chunk's scales.
    pub scales: &'r mut [f32],
}

/// This rank's server error `E` (its own chunk of the buffer, the chunk's
/// length), wherever it lives, and the server step over it.
pub trait Server {
    /// Elements in this rank's chunk (and `E`).
    fn len(&self) -> usize;

    /// Whether this rank owns no element.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// [`average_and_recompress`] of `step` with this server's error.
    /// `average` is host scratch of the chunk's length for a server that
    /// works on the host (a device server keeps its own and leaves it
    /// alone).
    fn average_and_recompress(&mut self, step: ServerStep<'_, '_>, average: &mut [f32]);
}

/// A server whose error is a host slice: the CPU loops of this module.
#[derive(Debug)]
pub struct HostServer<'a> {
    /// The server error `E` of this rank's chunk.
    pub error: &'a mut [f32],
}

impl Server for HostServer<'_> {
    fn len(&self) -> usize {
        self.error.len()
    }

    fn average_and_recompress(&mut self, step: ServerStep<'_, '_>, average: &mut [f32]) {
        average_and_recompress(
            step.received,
            step.block,
            step.scale,
            average,
            self.error,
            step.bits,
            step.scales,
        );
    }
}
