//! The collective-communication interface optimizers are written against.

use crate::CommError;

/// How [`Communicator::allreduce_f32`] combines the ranks' buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    /// Element-wise sum over ranks.
    Sum,
    /// Element-wise mean over ranks (sum divided by the world size).
    Mean,
}

/// A group of `world_size` ranks that run collectives together.
///
/// Every rank calls the same collectives in the same order with buffers of the
/// same length; a backend detects length mismatches and reports them instead of
/// corrupting memory. Buffers live on the host: device-resident compression
/// hands only packed bits to a communicator.
pub trait Communicator: Send + Sync {
    /// This process's (or thread's) rank, `0..world_size`.
    fn rank(&self) -> usize;

    /// How many ranks take part.
    fn world_size(&self) -> usize;

    /// Reduce `buf` over all ranks in place; every rank ends with the result.
    fn allreduce_f32(&self, buf: &mut [f32], op: ReduceOp) -> Result<(), CommError>;

    /// Copy `root`'s `buf` to every rank.
    fn broadcast_f32(&self, buf: &mut [f32], root: usize) -> Result<(), CommError>;

    /// Concatenate every rank's `send` in rank order into `recv`
    /// (`recv.len() == world_size * send.len()`).
    fn all_gather_u32(&self, send: &[u32], recv: &mut [u32]) -> Result<(), CommError>;

    /// Rank `i` sends `send[j*c..(j+1)*c]` to rank `j` and receives rank `j`'s
    /// chunk `i` into `recv[j*c..(j+1)*c]`, with `c = send.len() / world_size`.
    fn all_to_all_u32(&self, send: &[u32], recv: &mut [u32]) -> Result<(), CommError>;

    /// Return once every rank has called it.
    fn barrier(&self) -> Result<(), CommError>;
}
