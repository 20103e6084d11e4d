//! The compressed allreduce of ALGORITHMS.md: 1-bit compression with
//! two-level error feedback in three phases over any [`Communicator`].
//!
//! 1. Worker compress: `y = x + e`, one compressed message per chunk `j`.
//! 2. All-to-all: chunk `j` goes to its owner, rank `j`.
//! 3. Server: `z = (1/n)·Σ_i dequant_i + E`, compressed again with `E`.
//! 4. All-gather of the server messages; every rank dequantises them all, so
//!    the result is bit-identical on every rank.
//!
//! At world size 1 there is nothing to average: the allreduce returns its
//! input unchanged and holds no error buffers (DeepSpeed skips compression
//! for one worker too). Quantising twice there would only add noise and,
//! through sign(0) = +1, move coordinates whose input is zero.
//!
//! Where the buffers live: the phases here run over a [`Worker`] (`x` and
//! the worker error) and a [`Server`] (this rank's server error), host
//! slices or a device's buffers (terse-kernels' `TensorWorker` and
//! `TensorServer`, whose compress, server and dequantise steps are cubecl
//! kernels); only packed signs and scales pass through the host, where the
//! [`Communicator`] sends them.
//!
//! Geometry: the buffer is cut into `n` chunks of `c = ⌈⌈d/n⌉/32⌉·32`
//! elements (the last ones shorter, possibly empty). A message is the chunk's
//! sign words followed by its scales (as f32 bits), padded to the same size
//! for every chunk; padding is zero, carries no scale and is never read back.

use std::ops::Range;

use terse_compress::messages::{MessageBuffers, MessageGeometry};
use terse_compress::onebit::{ChunkLayout, Scale, blocks_for, words_for};
use terse_compress::resident::filled;
use terse_compress::server::{Compressed, HostServer, Server, ServerStep};
use terse_compress::worker::{HostWorker, Worker};

use crate::deepspeed_geometry::DeepSpeedGeometry;
use crate::error::check_len;
use crate::{CommError, Communicator, GpuBytes};

/// Where the chunks and the scales of the compressed allreduce lie.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Geometry {
    /// terse's: chunks of whole sign words, a scale per chunk (or per
    /// `scale_block`) on the worker and on the server.
    #[default]
    Chunks,
    /// DeepSpeed's (`deepspeed_geometry`): the buffer padded to a multiple
    /// of `n·lcm(n, 8)`, one L2 scale over the worker's whole padded
    /// buffer, one per chunk on the server. Host buffers only; `scale` must
    /// be L2 and `scale_block` unset.
    DeepSpeed,
}

/// How the compressed allreduce quantises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CompressionOptions {
    /// How a block's scale is computed (`l1` default, `l2` DeepSpeed parity).
    pub scale: Scale,
    /// One scale per this many elements (a multiple of 32); `None`: one per
    /// chunk, the papers' choice.
    pub scale_block: Option<usize>,
    /// Where chunks and scales lie.
    pub geometry: Geometry,
}

impl CompressionOptions {
    /// Checks the options: a `scale_block` must be a positive multiple of
    /// 32, so a block's signs fill whole words. The one statement of the
    /// rule: the compressed allreduce checks it, and so do the optimizer
    /// configs (naming their own field).
    pub fn check(&self) -> Result<(), CommError> {
        if self.geometry == Geometry::DeepSpeed {
            if let Some(block) = self.scale_block {
                return Err(CommError::BadOption {
                    option: "scale_block",
                    value: block.to_string(),
                    reason: "DeepSpeed's geometry has one scale per worker buffer and per server \
                             chunk; remove scale_block",
                });
            }
            if self.scale != Scale::L2 {
                return Err(CommError::BadOption {
                    option: "scale",
                    value: format!("{:?}", self.scale),
                    reason: "DeepSpeed's geometry scales by the L2 RMS",
                });
            }
        }
        match self.scale_block {
            Some(block) if block == 0 || !block.is_multiple_of(32) => Err(CommError::BadOption {
                option: "scale_block",
                value: block.to_string(),
                reason: "needs a positive multiple of 32 (its signs fill whole words)",
            }),
            _ => Ok(()),
        }
    }
}

/// One rank's geometry and scratch for the compressed allreduce over
/// buffers of a fixed length. Its two error-feedback buffers (the worker's,
/// the whole buffer; the server's, this rank's chunk) belong to the caller,
/// who saves them with the rest of its state and may keep the worker's on a
/// device: each call takes them ([`CompressedAllreduce::zeroed_errors`]
/// makes a pair).
#[derive(Debug, Clone)]
pub struct CompressedAllreduce {
    len: usize,
    rank: usize,
    world_size: usize,
    options: CompressionOptions,
    chunk: usize,
    /// u32 words in one message: sign words, then the scale slots.
    message: usize,
    send: Vec<u32>,
    recv: Vec<u32>,
    average: Vec<f32>,
    /// Every chunk's sign words and scale slots, as the worker reads and
    /// writes them.
    bits: Vec<u32>,
    scales: Vec<f32>,
    /// DeepSpeed's geometry in place of the above, when asked for.
    deepspeed: Option<DeepSpeedGeometry>,
    /// A world of one that compresses and exchanges with itself anyway
    /// ([`CompressedAllreduce::compressing_alone`]).
    alone: bool,
}

impl CompressedAllreduce {
    /// State for buffers of `len` elements on `comm`'s rank, errors at zero.
    ///
    /// # Errors
    /// A `scale_block` that is zero or not a multiple of 32 (its signs must
    /// fill whole words).
    pub fn new(
        len: usize,
        comm: &dyn Communicator,
        options: CompressionOptions,
    ) -> Result<CompressedAllreduce, CommError> {
        if comm.world_size() == 1 {
            options.check()?;
            return Ok(CompressedAllreduce::passthrough(len, options));
        }
        CompressedAllreduce::compressing_alone(len, comm, options)
    }

    /// As [`CompressedAllreduce::new`], except that a world of one
    /// compresses and exchanges its messages with itself (every phase and
    /// both exchanges, as for several ranks), where `new` moves nothing:
    /// for checking the exchanges on one GPU (`terse-gpu-exchange-check`),
    /// never for training.
    ///
    /// # Errors
    /// As [`CompressedAllreduce::new`].
    pub fn compressing_alone(
        len: usize,
        comm: &dyn Communicator,
        options: CompressionOptions,
    ) -> Result<CompressedAllreduce, CommError> {
        options.check()?;
        let (rank, world_size) = (comm.rank(), comm.world_size());
        if options.geometry == Geometry::DeepSpeed {
            return Ok(CompressedAllreduce {
                rank,
                world_size,
                deepspeed: Some(DeepSpeedGeometry::new(len, rank, world_size)),
                alone: world_size == 1,
                ..CompressedAllreduce::passthrough(len, options)
            });
        }
        let chunk = len.div_ceil(world_size).div_ceil(32) * 32;
        let message = words_for(chunk) + blocks_for(chunk, block_of(options, chunk));
        let mine = chunk_range(len, chunk, rank).len();
        Ok(CompressedAllreduce {
            len,
            rank,
            world_size,
            options,
            chunk,
            message,
            send: filled(message * world_size, 0),
            recv: filled(message * world_size, 0),
            average: filled(mine, 0.0),
            bits: filled(words_for(len), 0),
            scales: filled(
                len.div_ceil(chunk.max(1)) * blocks_for(chunk, block_of(options, chunk)),
                0.0,
            ),
            deepspeed: None,
            alone: world_size == 1,
        })
    }

    /// The state of a world of one: no errors, no scratch.
    fn passthrough(len: usize, options: CompressionOptions) -> CompressedAllreduce {
        CompressedAllreduce {
            len,
            rank: 0,
            world_size: 1,
            options,
            chunk: len.div_ceil(32) * 32,
            message: 0,
            send: Vec::new(),
            recv: Vec::new(),
            average: Vec::new(),
            bits: Vec::new(),
            scales: Vec::new(),
            deepspeed: None,
            alone: false,
        }
    }

    /// Whether this allreduce takes host buffers only
    /// ([`Geometry::DeepSpeed`]): a device buffer goes through the host.
    pub fn host_only(&self) -> bool {
        self.deepspeed.is_some()
    }

    /// Whether this state compresses at all: world size above 1 (or made
    /// [`CompressedAllreduce::compressing_alone`]) and something to send (a
    /// 1-bit optimizer whose every parameter is kept out of compression has
    /// an empty compressed part).
    pub fn compresses(&self) -> bool {
        (self.world_size > 1 || self.alone) && self.len > 0
    }

    /// The buffer length this state is for.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffers are empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The elements rank `rank` owns as server.
    pub fn chunk_range(&self, rank: usize) -> std::ops::Range<usize> {
        chunk_range(self.len, self.chunk, rank)
    }

    /// The lengths of the worker error `e` (`len`) and of this rank's
    /// server error `E` (its chunk); both zero at world size 1, which holds
    /// no errors.
    pub fn error_lens(&self) -> (usize, usize) {
        if self.world_size == 1 && !self.alone {
            return (0, 0);
        }
        if let Some(deepspeed) = &self.deepspeed {
            return deepspeed.error_lens();
        }
        (self.len, self.chunk_range(self.rank).len())
    }

    /// A zeroed pair of errors (worker, server) of [`CompressedAllreduce::error_lens`],
    /// resident now: first used in a compression stage, whose first step
    /// would otherwise pay for faulting them in.
    pub fn zeroed_errors(&self) -> (Vec<f32>, Vec<f32>) {
        let (worker, server) = self.error_lens();
        (filled(worker, 0.0), filled(server, 0.0))
    }

    /// Replaces `buf` (this rank's `x`) with the compressed mean over ranks,
    /// with this rank's errors (see [`CompressedAllreduce::error_lens`]); at
    /// world size 1 leaves it unchanged.
    pub fn allreduce_mean(
        &mut self,
        comm: &dyn Communicator,
        buf: &mut [f32],
        worker_error: &mut [f32],
        server_error: &mut [f32],
    ) -> Result<(), CommError> {
        let whole = 0..buf.len();
        self.allreduce_mean_part(comm, buf, worker_error, server_error, whole)
    }

    /// [`CompressedAllreduce::allreduce_mean`] for a rank that reads only
    /// `wanted` of the mean afterwards (ranks that split the update between
    /// them): `wanted` gets the mean's bits, the rest of `buf` may keep its
    /// own values. Dequantising only a part saves each such rank a pass
    /// over the whole buffer; what is sent is the same.
    pub fn allreduce_mean_part(
        &mut self,
        comm: &dyn Communicator,
        buf: &mut [f32],
        worker_error: &mut [f32],
        server_error: &mut [f32],
        wanted: std::ops::Range<usize>,
    ) -> Result<(), CommError> {
        let compresses = self.compresses();
        if let Some(deepspeed) = &mut self.deepspeed {
            if !compresses {
                return Ok(());
            }
            return deepspeed.reduce(comm, buf, worker_error, server_error);
        }
        check_len("worker error", self.error_lens().0, worker_error.len())?;
        let mut worker = HostWorker {
            x: buf,
            error: worker_error,
        };
        let mut server = HostServer {
            error: server_error,
        };
        self.reduce(comm, &mut worker, &mut server, wanted)
    }

    /// The compressed mean with the worker side in `worker`, which holds `x`
    /// and its own error, and the server side in `server`, which holds this
    /// rank's server error, wherever they live (host slices, or burn tensors
    /// on a GPU through terse-kernels' `TensorWorker` and `TensorServer`:
    /// then only packed signs and scales reach the host).
    pub fn allreduce_mean_on(
        &mut self,
        comm: &dyn Communicator,
        worker: &mut dyn Worker,
        server: &mut dyn Server,
    ) -> Result<(), CommError> {
        if self.host_only() {
            return Err(host_only_error());
        }
        let whole = 0..worker.len();
        self.reduce(comm, worker, server, whole)
    }

    /// The compressed mean with the worker, the server and their messages
    /// all in `buffers`' memory (a GPU's: terse-kernels' `DeviceMessages`):
    /// the phases are its kernels, and the two exchanges move its message
    /// buffers, by their device addresses where `comm` moves GPU memory
    /// (NCCL), else through a host copy of the words. The same messages,
    /// exchanges and bytes as [`CompressedAllreduce::allreduce_mean_on`].
    pub fn allreduce_mean_in(
        &mut self,
        comm: &dyn Communicator,
        buffers: &mut dyn MessageBuffers,
    ) -> Result<(), CommError> {
        if self.host_only() {
            return Err(host_only_error());
        }
        check_len("server error", self.error_lens().1, buffers.server_len())?;
        check_len("compressed allreduce", self.len, buffers.len())?;
        self.check_comm(comm);
        if !self.compresses() {
            return Ok(());
        }
        let geometry = self.message_geometry();
        buffers.compress(&geometry);
        exchange(comm, buffers, &geometry, Exchange::AllToAll)?;
        buffers.serve(&geometry);
        exchange(comm, buffers, &geometry, Exchange::AllGather)?;
        buffers.decompress(&geometry);
        Ok(())
    }

    /// The messages' geometry, as [`CompressedAllreduce::allreduce_mean_on`]
    /// lays them out.
    pub fn message_geometry(&self) -> MessageGeometry {
        MessageGeometry {
            len: self.len,
            ranks: self.world_size,
            layout: self.layout(),
            message: self.message,
            scale: self.options.scale,
        }
    }

    fn check_comm(&self, comm: &dyn Communicator) {
        assert_eq!(
            (comm.rank(), comm.world_size()),
            (self.rank, self.world_size),
            "compressed allreduce state used with another communicator"
        );
    }

    /// The four phases; the worker dequantises at least `wanted`.
    fn reduce(
        &mut self,
        comm: &dyn Communicator,
        worker: &mut dyn Worker,
        server: &mut dyn Server,
        wanted: std::ops::Range<usize>,
    ) -> Result<(), CommError> {
        check_len("server error", self.error_lens().1, server.len())?;
        check_len("compressed allreduce", self.len, worker.len())?;
        self.check_comm(comm);
        if !self.compresses() {
            return Ok(());
        }
        let block = block_of(self.options, self.chunk);
        let scale = self.options.scale;
        let layout = self.layout();
        let messages = Messages {
            message: self.message,
            len: self.len,
            chunk: self.chunk,
            block,
            slots: layout.slots_per_chunk(),
        };

        // 1. Worker compress, one message per destination.
        worker.compress(layout, scale, &mut self.bits, &mut self.scales);
        self.send.fill(0);
        for (bits, scales, words, chunk_slots) in messages.split(&mut self.send) {
            bits.copy_from_slice(&self.bits[words]);
            scales.copy_from_slice(&self.scales[chunk_slots]);
        }

        // 2. Chunk j to rank j.
        comm.all_to_all_u32(&self.send, &mut self.recv)?;

        // 3. Server average + recompress into this rank's outgoing message.
        let mine = chunk_range(self.len, self.chunk, self.rank).len();
        let words = words_for(mine);
        let scales_len = blocks_for(mine, block);
        let received: Vec<Compressed<'_>> = self
            .recv
            .chunks(self.message)
            .map(|m| Compressed {
                bits: &m[..words],
                scales: bytemuck::cast_slice(&m[self.chunk / 32..self.chunk / 32 + scales_len]),
            })
            .collect();
        let outgoing = &mut self.send[..self.message];
        outgoing.fill(0);
        let (bits, scales) = split_message(outgoing, self.chunk, mine, block);
        let step = ServerStep {
            received: &received,
            block,
            scale,
            bits,
            scales,
        };
        server.average_and_recompress(step, &mut self.average);

        // 4. Every server chunk to every rank, then dequantise all of them.
        comm.all_gather_u32(&self.send[..self.message], &mut self.recv)?;
        self.scales.fill(0.0);
        for (bits, scales, words, chunk_slots) in messages.split(&mut self.recv) {
            self.bits[words].copy_from_slice(bits);
            self.scales[chunk_slots].copy_from_slice(scales);
        }
        if wanted == (0..self.len) {
            worker.decompress(layout, &self.bits, &self.scales);
        } else {
            worker.decompress_part(layout, &self.bits, &self.scales, wanted);
        }
        Ok(())
    }

    /// The worker's chunk layout: blocks restart at every chunk.
    pub fn layout(&self) -> ChunkLayout {
        let chunk = self.chunk.max(32);
        ChunkLayout::new(chunk, block_of(self.options, chunk))
    }
}

/// DeepSpeed's geometry has no device kernels.
fn host_only_error() -> CommError {
    CommError::BadOption {
        option: "geometry",
        value: "deepspeed".into(),
        reason: "takes host buffers (copy a device buffer to the host for it)",
    }
}

/// The two exchanges of the compressed allreduce.
#[derive(Clone, Copy)]
enum Exchange {
    /// Phase 2: chunk `j`'s message to rank `j`.
    AllToAll,
    /// Phase 4: every rank's server message to every rank.
    AllGather,
}

/// Moves `buffers`' send buffer into its receive buffer as `kind` does:
/// on the GPU where the communicator and the buffers both can, else
/// through the host (the same typed collective, so the same bytes).
fn exchange(
    comm: &dyn Communicator,
    buffers: &mut dyn MessageBuffers,
    geometry: &MessageGeometry,
    kind: Exchange,
) -> Result<(), CommError> {
    let received = geometry.all_messages();
    let sent = match kind {
        Exchange::AllToAll => received,
        Exchange::AllGather => geometry.message,
    };
    if let Some(gpu) = comm.gpu_collectives() {
        let mut result = None;
        buffers.with_device_addresses(&mut |at| {
            let send = GpuBytes {
                ptr: at.send,
                len: sent * 4,
            };
            let recv = GpuBytes {
                ptr: at.recv,
                len: received * 4,
            };
            // SAFETY: `with_device_addresses` hands over live buffers of
            // `all_messages` words each (at least `sent` and `received`),
            // their writes completed, held by `buffers` for this call.
            result = Some(unsafe {
                match kind {
                    Exchange::AllToAll => gpu.all_to_all_gpu(send, recv),
                    Exchange::AllGather => gpu.all_gather_gpu(send, recv),
                }
            });
        });
        if let Some(result) = result {
            return result;
        }
    }
    let send = buffers.read_send(sent);
    let mut recv = vec![0u32; received];
    match kind {
        Exchange::AllToAll => comm.all_to_all_u32(&send, &mut recv)?,
        Exchange::AllGather => comm.all_gather_u32(&send, &mut recv)?,
    }
    buffers.write_recv(&recv);
    Ok(())
}

/// The scale block: `scale_block`, or the whole chunk.
fn block_of(options: CompressionOptions, chunk: usize) -> usize {
    options.scale_block.unwrap_or(chunk.max(1))
}

fn chunk_range(len: usize, chunk: usize, rank: usize) -> std::ops::Range<usize> {
    (rank * chunk).min(len)..((rank + 1) * chunk).min(len)
}

/// How the compressed allreduce's buffer of messages (`message` words a
/// rank) maps onto the worker's sign words and scale slots (`slots` a
/// chunk of `chunk` elements, `len` in all).
#[derive(Clone, Copy)]
struct Messages {
    message: usize,
    len: usize,
    chunk: usize,
    block: usize,
    slots: usize,
}

/// A chunk's sign words and scales inside its message, and the worker's
/// sign words and scale slots they stand for.
type MessagePart<'a> = (&'a mut [u32], &'a mut [f32], Range<usize>, Range<usize>);

impl Messages {
    /// Every non-empty chunk's message in `buf`, split by
    /// [`split_message`].
    fn split(self, buf: &mut [u32]) -> impl Iterator<Item = MessagePart<'_>> {
        let enumerated = buf.chunks_mut(self.message).enumerate();
        enumerated.filter_map(move |(j, message)| {
            let real = chunk_range(self.len, self.chunk, j).len();
            if real == 0 {
                return None;
            }
            let (bits, scales) = split_message(message, self.chunk, real, self.block);
            let (first_word, first_slot) = (j * self.chunk / 32, j * self.slots);
            let words = first_word..first_word + bits.len();
            let slots = first_slot..first_slot + scales.len();
            Some((bits, scales, words, slots))
        })
    }
}

/// The sign words and scales of a chunk of `real` elements inside a message
/// sized for `chunk` elements.
fn split_message(
    message: &mut [u32],
    chunk: usize,
    real: usize,
    block: usize,
) -> (&mut [u32], &mut [f32]) {
    let (bits, scales) = message.split_at_mut(chunk / 32);
    (
        &mut bits[..words_for(real)],
        bytemuck::cast_slice_mut(&mut scales[..blocks_for(real, block)]),
    )
}
