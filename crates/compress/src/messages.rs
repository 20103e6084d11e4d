//! The compressed allreduce with its messages kept where its buffers live
//! (a GPU's memory): the worker compresses straight into the `n` messages
//! it sends, the server reads the copies it received and writes its own
//! message, the worker dequantises the messages it gathered, and the two
//! exchanges in between move the message buffers themselves. A
//! communicator that reads and writes GPU memory (NCCL) is handed their
//! device addresses, so nothing crosses to the host; any other takes a
//! host copy of the sent words and hands back the received ones.
//!
//! The messages are those of the host path, word for word: message `j`
//! holds chunk `j`'s sign words (`chunk / 32` slots, the chunk's real words
//! first) followed by its scale slots (the f32 bits of each block's scale),
//! zero wherever the chunk has no data.

use crate::onebit::{ChunkLayout, Scale};

/// How the compressed allreduce's buffer is cut into messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageGeometry {
    /// Elements of the whole buffer `x`.
    pub len: usize,
    /// Ranks taking part: messages per exchange.
    pub ranks: usize,
    /// Chunks and scale blocks (blocks restart at every chunk).
    pub layout: ChunkLayout,
    /// u32 words in one message: `layout.chunk / 32` sign words, then
    /// `layout.slots_per_chunk()` scale slots.
    pub message: usize,
    /// How a block's scale is computed.
    pub scale: Scale,
}

impl MessageGeometry {
    /// Sign words at the start of every message.
    pub fn sign_words(&self) -> usize {
        self.layout.chunk / 32
    }

    /// Words in a buffer of every rank's message.
    pub fn all_messages(&self) -> usize {
        self.ranks * self.message
    }
}

/// The send and receive buffers' device addresses (`CUdeviceptr`s), each
/// [`MessageGeometry::all_messages`] words, valid while the closure given
/// to [`MessageBuffers::with_device_addresses`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageAddresses {
    /// The send buffer's first word.
    pub send: u64,
    /// The receive buffer's first word.
    pub recv: u64,
}

/// A worker (`x` and its error), this rank's server error, and a send and
/// a receive buffer of [`MessageGeometry::all_messages`] words, all in one
/// memory: the four phases of the compressed allreduce as that memory's
/// kernels.
pub trait MessageBuffers {
    /// Elements in `x`.
    fn len(&self) -> usize;

    /// Whether `x` is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Elements in this rank's server error (its chunk).
    fn server_len(&self) -> usize;

    /// Phase 1: `y = x + e` compressed with error feedback in the layout's
    /// chunks, chunk `j` into message `j` of the send buffer.
    fn compress(&mut self, geometry: &MessageGeometry);

    /// Phase 3: the receive buffer's `ranks` messages (every rank's copy of
    /// this rank's chunk, in rank order) averaged, the server error added,
    /// and the result compressed with error feedback into message 0 of the
    /// send buffer.
    fn serve(&mut self, geometry: &MessageGeometry);

    /// Phase 4: `x` overwritten by the receive buffer's messages (server
    /// chunk `j` from rank `j`), dequantised.
    fn decompress(&mut self, geometry: &MessageGeometry);

    /// Runs `exchange` with the buffers' device addresses, once every
    /// write to them has completed, and returns true; returns false without
    /// running it when the buffers are not CUDA memory.
    fn with_device_addresses(&mut self, exchange: &mut dyn FnMut(MessageAddresses)) -> bool;

    /// The send buffer's first `words` words, on the host.
    fn read_send(&mut self, words: usize) -> Vec<u32>;

    /// The receive buffer's words from the host (all of it).
    fn write_recv(&mut self, words: &[u32]);
}
