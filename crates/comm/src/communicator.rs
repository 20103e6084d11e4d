//! The collective-communication interface optimizers are written against.
//!
//! Callers use the typed methods (`allreduce_f32`, `all_gather_u32`, …): they
//! check this rank's buffers, count the traffic and hand plain bytes to the
//! backend's `*_raw` primitives. Backends implement only the primitives, and
//! must check that every rank called the same collective with the same length
//! (reporting [`CommError::RankMismatch`] / [`CommError::CallMismatch`] on
//! every rank) instead of corrupting memory or hanging.

use std::any::Any;
use std::sync::Arc;
use std::time::Instant;

use crate::traffic::{Collective, Traffic, TrafficMeter, volume};
use crate::{CommError, GpuCollectives};

/// How [`Communicator::allreduce_f32`] combines the ranks' buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    /// Element-wise sum over ranks.
    Sum,
    /// Element-wise mean over ranks (the sum times `1/world_size`).
    Mean,
}

/// The element size a raw primitive moves (f32 travels as 4-byte words).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Width {
    /// 1-byte elements.
    Byte,
    /// 4-byte elements.
    Word,
}

impl Width {
    /// Bytes per element.
    pub fn bytes(self) -> usize {
        match self {
            Width::Byte => 1,
            Width::Word => 4,
        }
    }
}

/// A value one rank hands to the others of its process
/// ([`Communicator::hand_out`]).
pub type HandedValue = Arc<dyn Any + Send + Sync>;

/// A group of `world_size` ranks that run collectives together.
///
/// Every rank calls the same collectives in the same order with buffers of
/// the same length. Buffers live on the host (device-resident compression
/// hands only packed bits to a communicator), except through
/// [`Communicator::gpu_collectives`].
pub trait Communicator: Send + Sync {
    /// This process's (or thread's) rank, `0..world_size`.
    fn rank(&self) -> usize;

    /// How many ranks take part.
    fn world_size(&self) -> usize;

    /// The backend's name (`single`, `local`, `mpi`, `nccl`), for logs.
    fn backend(&self) -> &'static str;

    /// The meter the typed methods count into.
    fn meter(&self) -> &TrafficMeter;

    /// Tells every other rank this one is failing with `reason`, so their
    /// collectives fail promptly instead of waiting. The `mpi` backend ends
    /// the whole job (`MPI_Abort`) and does not return.
    fn abort(&self, reason: &str);

    /// How long this rank waits for the others in one collective before
    /// giving up with [`CommError::Timeout`](crate::CommError::Timeout),
    /// naming the ranks that did not arrive (`single` never waits).
    fn set_deadline(&self, _timeout: std::time::Duration) {}

    /// Backend primitive of [`Communicator::allreduce_f32`].
    fn allreduce_f32_raw(&self, buf: &mut [f32], op: ReduceOp) -> Result<(), CommError>;

    /// Backend primitive of the broadcasts; `buf` holds elements of `width`.
    fn broadcast_raw(&self, buf: &mut [u8], width: Width, root: usize) -> Result<(), CommError>;

    /// Backend primitive of the all-gathers (`recv.len() == n·send.len()`).
    fn all_gather_raw(&self, send: &[u8], recv: &mut [u8], width: Width) -> Result<(), CommError>;

    /// Backend primitive of the all-to-alls (`recv.len() == send.len()`, a
    /// multiple of `n` elements).
    fn all_to_all_raw(&self, send: &[u8], recv: &mut [u8], width: Width) -> Result<(), CommError>;

    /// Backend primitive of [`Communicator::barrier`].
    fn barrier_raw(&self) -> Result<(), CommError>;

    /// The collectives this communicator runs on GPU memory (NCCL's), for
    /// callers whose buffers live on a CUDA device; `None` for the
    /// backends that take host buffers only.
    fn gpu_collectives(&self) -> Option<&dyn GpuCollectives> {
        None
    }

    /// Bytes sent and received so far, per kind of collective.
    fn traffic(&self) -> Traffic {
        self.meter().reading()
    }

    /// Reduces `buf` over all ranks in place; every rank ends with the same
    /// result.
    fn allreduce_f32(&self, buf: &mut [f32], op: ReduceOp) -> Result<(), CommError> {
        let start = Instant::now();
        self.allreduce_f32_raw(buf, op)?;
        record(self, Collective::Allreduce, 0, size_of_val(buf), start);
        Ok(())
    }

    /// Whether the ranks of this world run on the same cores (threads of one
    /// process, or `mpi` processes of one node), so that work every rank
    /// repeats costs the machine `world_size` times and is worth splitting
    /// between them
    /// ([`Communicator::reduce_scatter_mean_f32`] and
    /// [`Communicator::share_ranges_f32`] are then cheap).
    fn shares_cores(&self) -> bool {
        false
    }

    /// Ranks that are threads of one process: the value `make` returns on
    /// rank 0, handed to every rank. `make` runs on rank 0 only, while the
    /// others wait (so it may use every core); for values every rank would
    /// otherwise build alike, once each. `None` on every rank where ranks
    /// cannot share memory (separate processes, a world of one): each then
    /// builds its own. A collective.
    fn hand_out(
        &self,
        make: &mut dyn FnMut() -> HandedValue,
    ) -> Result<Option<HandedValue>, CommError> {
        let _ = make;
        Ok(None)
    }

    /// The first half of an allreduce: rank `r` ends with the mean over
    /// ranks in `buf[ranges[r]]`, with the same bits as
    /// [`Communicator::allreduce_f32`] gives there; the rest of `buf` is
    /// left unspecified. `ranges` are disjoint, one per rank, the same on
    /// every rank. Counted as the whole allreduce of `buf` it stands for
    /// (its second half is [`Communicator::share_ranges_f32`] of the result
    /// an update made of it). The default is the whole allreduce.
    fn reduce_scatter_mean_f32(
        &self,
        buf: &mut [f32],
        ranges: &[std::ops::Range<usize>],
    ) -> Result<(), CommError> {
        check_ranges(self, buf.len(), ranges)?;
        self.allreduce_f32(buf, ReduceOp::Mean)
    }

    /// Every rank's `buf[ranges[rank]]` copied into the same range of every
    /// other rank's `buf`: work split between ranks that share cores made
    /// whole again. Such a backend does not count it as traffic (across
    /// machines the work would not be split and nothing would move; the
    /// bits are copied exactly, so any 32-bit payload travels). The default
    /// all-gathers padded copies, counted as that all-gather.
    fn share_ranges_f32(
        &self,
        buf: &mut [f32],
        ranges: &[std::ops::Range<usize>],
    ) -> Result<(), CommError> {
        share_ranges_by_all_gather(self, buf, ranges)
    }

    /// Copies `root`'s `buf` to every rank.
    fn broadcast_f32(&self, buf: &mut [f32], root: usize) -> Result<(), CommError> {
        broadcast(self, bytemuck::cast_slice_mut(buf), Width::Word, root)
    }

    /// Copies `root`'s `buf` to every rank.
    fn broadcast_u32(&self, buf: &mut [u32], root: usize) -> Result<(), CommError> {
        broadcast(self, bytemuck::cast_slice_mut(buf), Width::Word, root)
    }

    /// Copies `root`'s `buf` to every rank.
    fn broadcast_u8(&self, buf: &mut [u8], root: usize) -> Result<(), CommError> {
        broadcast(self, buf, Width::Byte, root)
    }

    /// Concatenates every rank's `send` in rank order into `recv`
    /// (`recv.len() == world_size · send.len()`).
    fn all_gather_f32(&self, send: &[f32], recv: &mut [f32]) -> Result<(), CommError> {
        let (s, r) = (bytemuck::cast_slice(send), bytemuck::cast_slice_mut(recv));
        all_gather(self, s, r, Width::Word)
    }

    /// Concatenates every rank's `send` in rank order into `recv`.
    fn all_gather_u32(&self, send: &[u32], recv: &mut [u32]) -> Result<(), CommError> {
        let (s, r) = (bytemuck::cast_slice(send), bytemuck::cast_slice_mut(recv));
        all_gather(self, s, r, Width::Word)
    }

    /// Concatenates every rank's `send` in rank order into `recv`.
    fn all_gather_u8(&self, send: &[u8], recv: &mut [u8]) -> Result<(), CommError> {
        all_gather(self, send, recv, Width::Byte)
    }

    /// Rank `i` sends `send[j·c..(j+1)·c]` to rank `j` and receives rank
    /// `j`'s chunk `i` into `recv[j·c..(j+1)·c]`, with `c = send.len() / n`.
    fn all_to_all_f32(&self, send: &[f32], recv: &mut [f32]) -> Result<(), CommError> {
        let (s, r) = (bytemuck::cast_slice(send), bytemuck::cast_slice_mut(recv));
        all_to_all(self, s, r, Width::Word)
    }

    /// As [`Communicator::all_to_all_f32`].
    fn all_to_all_u32(&self, send: &[u32], recv: &mut [u32]) -> Result<(), CommError> {
        let (s, r) = (bytemuck::cast_slice(send), bytemuck::cast_slice_mut(recv));
        all_to_all(self, s, r, Width::Word)
    }

    /// As [`Communicator::all_to_all_f32`].
    fn all_to_all_u8(&self, send: &[u8], recv: &mut [u8]) -> Result<(), CommError> {
        all_to_all(self, send, recv, Width::Byte)
    }

    /// Returns once every rank has called it.
    fn barrier(&self) -> Result<(), CommError> {
        let start = Instant::now();
        self.barrier_raw()?;
        record(self, Collective::Barrier, 0, 0, start);
        Ok(())
    }
}

pub(crate) fn record<C: Communicator + ?Sized>(
    comm: &C,
    kind: Collective,
    root: usize,
    bytes: usize,
    start: Instant,
) {
    let (sent, received) = volume(kind, comm.world_size(), comm.rank(), root, bytes);
    comm.meter().record(kind, sent, received, start.elapsed());
}

// A rank whose own buffers are wrong still takes part, with an empty buffer,
// so the others see a length mismatch instead of waiting for it forever.

fn broadcast<C: Communicator + ?Sized>(
    comm: &C,
    buf: &mut [u8],
    width: Width,
    root: usize,
) -> Result<(), CommError> {
    let n = comm.world_size();
    if root >= n {
        let _ = comm.broadcast_raw(&mut [], width, 0);
        return Err(CommError::BadRank {
            op: "broadcast",
            rank: root,
            world_size: n,
        });
    }
    let start = Instant::now();
    comm.broadcast_raw(buf, width, root)?;
    record(comm, Collective::Broadcast, root, buf.len(), start);
    Ok(())
}

fn all_gather<C: Communicator + ?Sized>(
    comm: &C,
    send: &[u8],
    recv: &mut [u8],
    width: Width,
) -> Result<(), CommError> {
    let expected = send.len() * comm.world_size();
    if recv.len() != expected {
        let _ = comm.all_gather_raw(&[], &mut [], width);
        return Err(CommError::LengthMismatch {
            op: "all_gather (receive buffer)",
            expected: expected / width.bytes(),
            actual: recv.len() / width.bytes(),
        });
    }
    let start = Instant::now();
    comm.all_gather_raw(send, recv, width)?;
    record(comm, Collective::AllGather, 0, send.len(), start);
    Ok(())
}

fn all_to_all<C: Communicator + ?Sized>(
    comm: &C,
    send: &[u8],
    recv: &mut [u8],
    width: Width,
) -> Result<(), CommError> {
    let n = comm.world_size();
    let elems = send.len() / width.bytes();
    let bad = if !elems.is_multiple_of(n) {
        Some((
            "all_to_all (send length must be a multiple of the world size)",
            elems.div_ceil(n) * n,
            elems,
        ))
    } else if recv.len() != send.len() {
        Some((
            "all_to_all (receive buffer)",
            elems,
            recv.len() / width.bytes(),
        ))
    } else {
        None
    };
    if let Some((op, expected, actual)) = bad {
        let _ = comm.all_to_all_raw(&[], &mut [], width);
        return Err(CommError::LengthMismatch {
            op,
            expected,
            actual,
        });
    }
    let start = Instant::now();
    comm.all_to_all_raw(send, recv, width)?;
    record(comm, Collective::AllToAll, 0, send.len(), start);
    Ok(())
}

/// [`Communicator::share_ranges_f32`] by an all-gather of padded copies,
/// counted as that all-gather: the default, and the `mpi` backend's across
/// nodes.
pub(crate) fn share_ranges_by_all_gather<C: Communicator + ?Sized>(
    comm: &C,
    buf: &mut [f32],
    ranges: &[std::ops::Range<usize>],
) -> Result<(), CommError> {
    check_ranges(comm, buf.len(), ranges)?;
    let width = ranges.iter().map(|r| r.len()).max().unwrap_or(0);
    let mut send = vec![0.0f32; width];
    let mine = ranges[comm.rank()].clone();
    send[..mine.len()].copy_from_slice(&buf[mine]);
    let mut recv = vec![0.0f32; width * comm.world_size()];
    comm.all_gather_f32(&send, &mut recv)?;
    for (range, part) in ranges.iter().zip(recv.chunks(width.max(1))) {
        buf[range.clone()].copy_from_slice(&part[..range.len()]);
    }
    Ok(())
}

/// `ranges` name one range of a `len`-element buffer per rank.
pub(crate) fn check_ranges<C: Communicator + ?Sized>(
    comm: &C,
    len: usize,
    ranges: &[std::ops::Range<usize>],
) -> Result<(), CommError> {
    if ranges.len() != comm.world_size() {
        return Err(CommError::LengthMismatch {
            op: "reduce_scatter / share_ranges (one range per rank)",
            expected: comm.world_size(),
            actual: ranges.len(),
        });
    }
    match ranges.iter().find(|r| r.start > r.end || r.end > len) {
        Some(bad) => Err(CommError::LengthMismatch {
            op: "reduce_scatter / share_ranges (a range beyond the buffer)",
            expected: len,
            actual: bad.end,
        }),
        None => Ok(()),
    }
}
