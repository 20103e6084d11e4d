//! Collectives on GPU memory. A communicator whose transport reads and
//! writes the GPU (NCCL) takes a CUDA buffer's address, so a gradient that
//! lives on the device is averaged there, and the compressed allreduce's
//! messages are exchanged there, with nothing copied to the host; the
//! others have none ([`crate::Communicator::gpu_collectives`] is
//! `None`) and their callers go through the host.

use crate::CommError;

/// `len` f32 at CUDA device address `ptr` (a `CUdeviceptr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuF32 {
    /// The device address of the first element.
    pub ptr: u64,
    /// How many f32 it holds.
    pub len: usize,
}

/// `len` bytes at CUDA device address `ptr` (a `CUdeviceptr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuBytes {
    /// The device address of the first byte.
    pub ptr: u64,
    /// How many bytes it holds.
    pub len: usize,
}

/// The collectives a communicator runs on GPU buffers. Each is the GPU
/// twin of the typed collective of the same name: the same result, the
/// same cross-rank checks, counted alike.
///
/// # Safety (every method)
/// The buffers must be live allocations of at least their length in the
/// primary CUDA context of the communicator's GPU, that nothing else
/// writes while the call runs; every write to a buffer the call reads must
/// have completed before the call (the caller synchronises its own
/// stream); the call returns when its output is written.
pub trait GpuCollectives: Sync {
    /// `recv` becomes the sum over ranks of every rank's `send`, computed
    /// on the GPU. Every rank calls it with the same length, in the same
    /// order as its other collectives (checked like them); it returns when
    /// `recv` is written, and is counted as an allreduce of `send`'s bytes.
    ///
    /// # Safety
    /// `send` and `recv` must be live allocations of at least `len` f32 in
    /// the primary CUDA context of the communicator's GPU, that nothing
    /// else writes while the call runs; every write to `send` must have
    /// completed before the call (the caller synchronises its own stream).
    unsafe fn allreduce_sum_f32_gpu(&self, send: GpuF32, recv: GpuF32) -> Result<(), CommError>;

    /// [`crate::Communicator::all_to_all_u8`] of `send` into `recv` (equal
    /// lengths, a multiple of the world size).
    ///
    /// # Safety
    /// As the trait says.
    unsafe fn all_to_all_gpu(&self, send: GpuBytes, recv: GpuBytes) -> Result<(), CommError>;

    /// [`crate::Communicator::all_gather_u8`] of `send` into `recv`
    /// (`world_size` times as long).
    ///
    /// # Safety
    /// As the trait says.
    unsafe fn all_gather_gpu(&self, send: GpuBytes, recv: GpuBytes) -> Result<(), CommError>;
}
