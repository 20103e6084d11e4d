//! DeepSpeed's geometry for the compressed allreduce: what
//! `NcclBackend.compressed_allreduce` (deepspeed/runtime/comm/nccl.py,
//! 0.19.6, the last release with its 1-bit optimizers) computes, for runs
//! that must reproduce DeepSpeed's 1-bit Adam, 1-bit LAMB and 0/1 Adam
//! (`scale = "deepspeed"` in the optimizer configs; ALGORITHMS.md
//! "Compressed allreduce", "DeepSpeed's geometry").
//!
//! Where it differs from terse's own chunks ([`super::compressed`]):
//! - the buffer is zero-padded to a multiple of `n·lcm(n, 8)` elements, and
//!   the padding is part of the worker's error feedback: a padded element's
//!   error is `−scale` after the first call, so it is no longer zero and
//!   counts in the next scale;
//! - the worker has one scale for its whole padded buffer, `‖y‖/√padded`;
//! - the chunks are `padded/n` elements each (a multiple of 8, not of 32),
//!   and each server scales its chunk by one L2 RMS.
//!
//! It runs on host slices; a device buffer is copied to the host for it.

use terse_compress::onebit::{self, Scale, words_for};
use terse_compress::resident::filled;
use terse_compress::server::{Compressed, average_and_recompress};

use crate::error::check_len;
use crate::{CommError, Communicator};

/// One rank's state for DeepSpeed's compressed allreduce over buffers of a
/// fixed length: the geometry and the scratch.
#[derive(Debug, Clone)]
pub(crate) struct DeepSpeedGeometry {
    len: usize,
    padded: usize,
    chunk: usize,
    rank: usize,
    world_size: usize,
    /// The padded buffer `x ‖ 0`, compressed with the worker error.
    y: Vec<f32>,
    /// Its signs, contiguous (chunk boundaries fall inside words).
    bits: Vec<u32>,
    send: Vec<u32>,
    recv: Vec<u32>,
    average: Vec<f32>,
}

/// DeepSpeed's `corrected_tensor_size`: `len` rounded up to a multiple of
/// `n·lcm(n, 8)` (its optimizers' `size * divider`).
pub(crate) fn padded_len(len: usize, world_size: usize) -> usize {
    let unit = world_size * lcm(world_size, 8);
    len.div_ceil(unit) * unit
}

fn lcm(a: usize, b: usize) -> usize {
    let gcd = |mut a: usize, mut b: usize| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    a / gcd(a, b) * b
}

impl DeepSpeedGeometry {
    /// The state for buffers of `len` elements on rank `rank` of
    /// `world_size` (above 1: one worker never compresses).
    pub(crate) fn new(len: usize, rank: usize, world_size: usize) -> DeepSpeedGeometry {
        let padded = padded_len(len, world_size);
        let chunk = padded / world_size;
        let message = words_for(chunk) + 1;
        DeepSpeedGeometry {
            len,
            padded,
            chunk,
            rank,
            world_size,
            y: filled(padded, 0.0),
            bits: filled(words_for(padded), 0),
            send: filled(message * world_size, 0),
            recv: filled(message * world_size, 0),
            average: filled(chunk, 0.0),
        }
    }

    /// The lengths of the worker error (the padded buffer) and of the
    /// server error (one chunk).
    pub(crate) fn error_lens(&self) -> (usize, usize) {
        (self.padded, self.chunk)
    }

    /// u32 words in one message: a chunk's sign words, then one scale.
    fn message(&self) -> usize {
        words_for(self.chunk) + 1
    }

    /// Replaces `x` with DeepSpeed's compressed mean over ranks, with this
    /// rank's errors (lengths [`DeepSpeedGeometry::error_lens`]).
    pub(crate) fn reduce(
        &mut self,
        comm: &dyn Communicator,
        x: &mut [f32],
        worker_error: &mut [f32],
        server_error: &mut [f32],
    ) -> Result<(), CommError> {
        for (op, expected, actual) in [
            ("compressed allreduce", self.len, x.len()),
            ("worker error", self.padded, worker_error.len()),
            ("server error", self.chunk, server_error.len()),
        ] {
            check_len(op, expected, actual)?;
        }
        let (chunk, message) = (self.chunk, self.message());
        let words = words_for(chunk);

        // 1. Worker: y = (x ‖ 0) + e, one L2 scale over all of it (the
        //    padding counts), e = y − scale·sign(y).
        self.y[..self.len].copy_from_slice(x);
        self.y[self.len..].fill(0.0);
        let mut scale = [0.0f32];
        onebit::compress(
            &self.y,
            worker_error,
            self.padded,
            Scale::L2,
            &mut self.bits,
            &mut scale,
        );
        for (j, out) in self.send.chunks_mut(message).enumerate() {
            copy_bits(&self.bits, j * chunk, &mut out[..words], chunk);
            out[words] = scale[0].to_bits();
        }

        // 2. Chunk j to rank j (DeepSpeed: an all-to-all of the signs and
        //    an all-gather of the scales, the same numbers).
        comm.all_to_all_u32(&self.send, &mut self.recv)?;

        // 3. Server: z = Σ_i ±scale_i / n + E, one L2 scale over the chunk.
        let received: Vec<Compressed<'_>> = self
            .recv
            .chunks(message)
            .map(|m| Compressed {
                bits: &m[..words],
                scales: bytemuck::cast_slice(&m[words..]),
            })
            .collect();
        let (out_bits, out_scale) = self.send[..message].split_at_mut(words);
        average_and_recompress(
            &received,
            chunk,
            Scale::L2,
            &mut self.average,
            server_error,
            out_bits,
            bytemuck::cast_slice_mut(out_scale),
        );

        // 4. Every server's chunk to every rank; x gets the unpadded part.
        comm.all_gather_u32(&self.send[..message], &mut self.recv)?;
        for (j, m) in self.recv.chunks(message).enumerate() {
            let start = (j * chunk).min(self.len);
            let end = ((j + 1) * chunk).min(self.len);
            if start == end {
                continue;
            }
            let real = end - start;
            let scale: &[f32] = bytemuck::cast_slice(&m[words..]);
            onebit::decompress(&m[..words_for(real)], scale, real, &mut x[start..end]);
        }
        debug_assert_eq!(self.rank, comm.rank());
        debug_assert_eq!(self.world_size, comm.world_size());
        Ok(())
    }
}

/// Copies `len` bits of `src` starting at bit `from` into `dst` from bit 0;
/// the bits of `dst` past `len` are zero.
fn copy_bits(src: &[u32], from: usize, dst: &mut [u32], len: usize) {
    let (word, shift) = (from / 32, from % 32);
    for (w, out) in dst.iter_mut().enumerate() {
        let lo = src.get(word + w).copied().unwrap_or(0) >> shift;
        let hi = match shift {
            0 => 0,
            _ => src.get(word + w + 1).copied().unwrap_or(0) << (32 - shift),
        };
        let left = len.saturating_sub(w * 32);
        let keep = if left >= 32 {
            u32::MAX
        } else {
            (1 << left) - 1
        };
        *out = (lo | hi) & keep;
    }
}

#[cfg(test)]
mod tests {
    use super::{copy_bits, padded_len};

    #[test]
    fn padding_is_deepspeeds_corrected_tensor_size() {
        // DeepSpeed: size * (size * 8 / gcd(size, 8)).
        assert_eq!(padded_len(1003, 2), 1008); // unit 2·8 = 16
        assert_eq!(padded_len(1003, 4), 1024); // unit 4·8 = 32
        assert_eq!(padded_len(1003, 3), 1008); // unit 3·24 = 72: 14·72
        assert_eq!(padded_len(1003, 16), 1024); // unit 16·16 = 256
        assert_eq!(padded_len(1024, 4), 1024);
        assert_eq!(padded_len(0, 4), 0);
    }

    #[test]
    fn copied_bits_start_anywhere() {
        let src = [0b1011_0000_0000_0000_0000_0000_0000_0001u32, 0xFFFF_0000];
        let mut dst = [0u32; 2];
        copy_bits(&src, 28, &mut dst, 24);
        // Bits 28..32 of word 0 (1011 → 0b1011), then bits 0..20 of word 1.
        assert_eq!(dst, [0b1011 | 0xF0_0000, 0]);
        copy_bits(&src, 0, &mut dst, 33);
        assert_eq!(dst, [src[0], 0]);
    }
}
