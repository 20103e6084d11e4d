//! The `local` backend: N ranks as threads of one process, really concurrent.
//!
//! Used by tests and to simulate N workers on one machine (the algorithms'
//! behaviour depends on N through error feedback and masking, so N must be
//! real). Every collective posts this rank's buffer in its own slot, meets
//! the others at a barrier, reads what it needs from the other slots, and
//! meets them again before any slot is reused. A slot holds a pointer to the
//! poster's own buffer, not a copy: the poster stays inside the collective
//! until the others have read it (the second meeting), and on the way out
//! takes its slot's write lock and clears the pointer, which waits for any
//! reader still holding the read lock (a failed meeting returns early). A
//! copy would cost every rank a memset and a memcpy of the whole buffer per
//! call: for 4 ranks allreducing BERT-mini's 45 MB gradient, ~40% of the
//! collective's memory traffic. Allreduce reduces one chunk
//! per rank (in rank order, so every rank gets the same bits) and then
//! gathers the chunks, so each rank touches O(B) bytes, not O(n·B).
//!
//! Failure: a rank that errors ([`Communicator::abort`]), panics or drops its
//! communicator poisons the world, and every rank waiting in or later
//! entering a collective gets [`CommError::PeerFailed`] at once. A rank that
//! simply never arrives is reported after the world's timeout.

use std::ops::Range;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use crate::communicator::{Width, check_ranges, record};
use crate::traffic::{Collective, TrafficMeter};
use crate::watchdog::{Deadline, Wait};
use crate::{CommError, Communicator, HandedValue, ReduceOp};

mod slot;
use slot::{Posted, Slot};

/// Elements per block of a reduction (16 KiB of partial sums: L1-resident).
const REDUCE_BLOCK: usize = 4096;

/// How long a rank waits for the others by default before reporting a hang.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Default)]
struct Gate {
    /// Which ranks have arrived in this generation (all: the meeting is
    /// complete; the others are named when it times out).
    present: Vec<bool>,
    generation: u64,
    failure: Option<(usize, String)>,
}

struct Shared {
    slots: Vec<RwLock<Slot>>,
    gate: Mutex<Gate>,
    woken: Condvar,
    /// What rank 0 hands out ([`Communicator::hand_out`]), for the span of
    /// one call.
    handed: Mutex<Option<HandedValue>>,
}

/// One rank of a world of threads; create the world with [`LocalComm::world`].
pub struct LocalComm {
    rank: usize,
    world_size: usize,
    shared: Arc<Shared>,
    meter: TrafficMeter,
    /// How long this rank waits for the others in one collective.
    deadline: Deadline,
    /// What [`Communicator::shares_cores`] answers (true but in tests that
    /// compare with the unsplit step).
    shares_cores: bool,
}

impl LocalComm {
    /// The `world_size` ranks of a new world, rank `i` at index `i`; move each
    /// into its own thread.
    pub fn world(world_size: usize) -> Vec<LocalComm> {
        Self::world_with_timeout(world_size, DEFAULT_TIMEOUT)
    }

    /// As [`LocalComm::world`], reporting a rank that does not arrive at a
    /// collective within `timeout`.
    pub fn world_with_timeout(world_size: usize, timeout: Duration) -> Vec<LocalComm> {
        assert!(world_size > 0, "a world needs at least one rank");
        let shared = Arc::new(Shared {
            slots: (0..world_size).map(|_| RwLock::default()).collect(),
            gate: Mutex::new(Gate {
                present: vec![false; world_size],
                ..Gate::default()
            }),
            woken: Condvar::new(),
            handed: Mutex::new(None),
        });
        (0..world_size)
            .map(|rank| LocalComm {
                rank,
                world_size,
                shared: Arc::clone(&shared),
                meter: TrafficMeter::default(),
                deadline: Deadline::new(timeout),
                shares_cores: true,
            })
            .collect()
    }

    /// This rank, answering that its world does not share cores: optimizers
    /// then repeat their update on every rank instead of splitting it, as
    /// they do across machines (for tests that compare the two).
    pub fn unshared(mut self) -> Self {
        self.shares_cores = false;
        self
    }

    /// Runs `body` on every rank of a new world, one thread each owning its
    /// communicator (so a panicking rank fails the others at once), and
    /// returns each rank's outcome in rank order.
    pub fn run<R: Send>(
        world_size: usize,
        timeout: Duration,
        body: impl Fn(&LocalComm) -> R + Sync,
    ) -> Vec<std::thread::Result<R>> {
        Self::run_in(Self::world_with_timeout(world_size, timeout), body)
    }

    /// [`LocalComm::run`] on the ranks of `world` (e.g. made
    /// [`LocalComm::unshared`]).
    pub fn run_in<R: Send>(
        world: Vec<LocalComm>,
        body: impl Fn(&LocalComm) -> R + Sync,
    ) -> Vec<std::thread::Result<R>> {
        std::thread::scope(|scope| {
            let handles: Vec<_> = world
                .into_iter()
                .map(|comm| {
                    let body = &body;
                    scope.spawn(move || body(&comm))
                })
                .collect();
            handles.into_iter().map(|h| h.join()).collect()
        })
    }

    fn handed(&self) -> MutexGuard<'_, Option<HandedValue>> {
        self.shared.handed.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn gate(&self) -> MutexGuard<'_, Gate> {
        self.shared.gate.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn fail(&self, reason: String) {
        let mut gate = self.gate();
        if gate.failure.is_none() {
            gate.failure = Some((self.rank, reason));
        }
        self.shared.woken.notify_all();
    }

    /// Waits until every rank has arrived here.
    fn meet(&self, op: &'static str) -> Result<(), CommError> {
        let mut gate = self.gate();
        if let Some((rank, reason)) = &gate.failure {
            return Err(peer_failed(*rank, reason));
        }
        let generation = gate.generation;
        gate.present[self.rank] = true;
        if gate.present.iter().all(|&p| p) {
            gate.present.iter_mut().for_each(|p| *p = false);
            gate.generation += 1;
            self.shared.woken.notify_all();
            return Ok(());
        }
        // Woken by the last rank to arrive, or every second to look at the
        // deadline and for a stop signal.
        let mut wait = Wait::start(&self.deadline);
        loop {
            gate = self
                .shared
                .woken
                .wait_timeout(gate, Duration::from_secs(1).min(wait.timeout()))
                .unwrap_or_else(|p| p.into_inner())
                .0;
            if gate.generation != generation {
                return Ok(());
            }
            if let Some((rank, reason)) = &gate.failure {
                return Err(peer_failed(*rank, reason));
            }
            if let Some(why) = wait.give_up() {
                let missing: Vec<usize> =
                    (0..self.world_size).filter(|&r| !gate.present[r]).collect();
                let error = why.error(op, wait.timeout(), missing);
                gate.failure = Some((self.rank, error.to_string()));
                self.shared.woken.notify_all();
                return Err(error);
            }
        }
    }

    fn slot(&self, rank: usize) -> std::sync::RwLockReadGuard<'_, Slot> {
        self.shared.slots[rank]
            .read()
            .unwrap_or_else(|p| p.into_inner())
    }

    fn my_slot(&self) -> std::sync::RwLockWriteGuard<'_, Slot> {
        self.shared.slots[self.rank]
            .write()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// The first half of the allreduce: `buf` posted, and `range` of every
    /// rank's buffer reduced into this rank's `reduced`, which the others
    /// gather from (the reduce-scatter writes its range in place instead).
    fn reduce_phase(
        &self,
        buf: &[f32],
        range: &Range<usize>,
        op: ReduceOp,
    ) -> Result<(), CommError> {
        self.post(
            Collective::Allreduce,
            0,
            buf.len(),
            bytemuck::cast_slice(buf),
        );
        self.finish(Collective::Allreduce, || self.reduce_into_slot(range, op))
    }

    /// The read phase of an allreduce: `range` of every rank's posted f32
    /// buffer summed in rank order (from zero), scaled for a mean, into
    /// this rank's `reduced`.
    fn reduce_into_slot(&self, range: &Range<usize>, op: ReduceOp) -> Result<(), CommError> {
        // Last call's buffer, reused: nobody reads it any more (every rank
        // finished that gather before this call's meeting).
        let mut acc = std::mem::take(&mut self.my_slot().reduced);
        acc.clear();
        let result = self.reduce_blocks(range, op, |_, block| acc.extend_from_slice(block));
        self.my_slot().reduced = acc;
        result
    }

    /// `range` of every rank's posted f32 buffer summed in rank order (from
    /// zero) and scaled for a mean, block by block: `emit(offset, block)`
    /// gets each finished block, `offset` counted from `range.start`. The
    /// partial sums stay in cache between the ranks' additions (summed rank
    /// after rank, the whole range was read and written world-size + 1
    /// times); per element the operations and their order are the same.
    /// Only the block being summed is viewed in each buffer, so `emit` may
    /// write this rank's own buffer there once the block is done.
    fn reduce_blocks(
        &self,
        range: &Range<usize>,
        op: ReduceOp,
        mut emit: impl FnMut(usize, &[f32]),
    ) -> Result<(), CommError> {
        let slots: Vec<_> = (0..self.world_size).map(|rank| self.slot(rank)).collect();
        let inv = 1.0 / self.world_size as f32;
        let mut block = Vec::with_capacity(REDUCE_BLOCK.min(range.len()));
        for start in (0..range.len()).step_by(REDUCE_BLOCK) {
            let end = (start + REDUCE_BLOCK).min(range.len());
            let part =
                |rank: usize| slots[rank].f32_range(rank, range.start + start..range.start + end);
            block.clear();
            // 0 + x as the sum from zero has it (-0 becomes +0).
            block.extend(part(0)?.iter().map(|&x| 0.0 + x));
            for rank in 1..self.world_size {
                for (a, &x) in block.iter_mut().zip(part(rank)?) {
                    *a += x;
                }
            }
            if op == ReduceOp::Mean {
                block.iter_mut().for_each(|a| *a *= inv);
            }
            emit(start, &block);
        }
        Ok(())
    }

    /// Posts this rank's call: its kind, root, length in elements (compared
    /// across ranks) and the data others will read.
    fn post(&self, kind: Collective, root: usize, len: usize, data: &[u8]) {
        self.post_raw(kind, root, len, data.as_ptr(), data.len());
    }

    /// Posts `buf` for a collective in which this rank also writes parts of
    /// it, and returns the one pointer through which `buf` is touched for
    /// the whole call (`buf` stays borrowed meanwhile): the others read
    /// their ranges of it while this rank writes its own or theirs.
    fn post_writable(&self, kind: Collective, buf: &mut [f32]) -> *mut f32 {
        let ptr = buf.as_mut_ptr();
        self.post_raw(kind, 0, buf.len(), ptr.cast_const().cast(), 4 * buf.len());
        ptr
    }

    /// [`LocalComm::post`] of `bytes` bytes at `ptr`, for a buffer this rank
    /// itself writes (through the same pointer) during the collective.
    fn post_raw(&self, kind: Collective, root: usize, len: usize, ptr: *const u8, bytes: usize) {
        let mut slot = self.my_slot();
        slot.kind = Some(kind);
        slot.root = root;
        slot.len = len;
        slot.posted = Posted { ptr, len: bytes };
    }

    /// Meets, checks that every rank made the same call, runs `read` (unless
    /// the check failed), and meets again so no slot is reposted while
    /// another rank still reads it. Every rank reaches the same verdict.
    fn finish(
        &self,
        kind: Collective,
        read: impl FnOnce() -> Result<(), CommError>,
    ) -> Result<(), CommError> {
        let result = self.meet(kind.name()).and_then(|()| {
            let result = self.check_same_call().and_then(|()| read());
            self.meet(kind.name()).and(result)
        });
        self.withdraw();
        result
    }

    /// Unpublishes this rank's posted buffer; the write lock waits for any
    /// rank still reading it. A withdrawn slot of non-zero length reads as
    /// an error, so a rank that comes late after a failure cannot read freed
    /// memory.
    fn withdraw(&self) {
        self.my_slot().posted.ptr = std::ptr::null();
    }

    /// Compares every rank's call with rank 0's, so all ranks reach the
    /// same verdict.
    fn check_same_call(&self) -> Result<(), CommError> {
        let (first_kind, root, len) = {
            let first = self.slot(0);
            (first.kind, first.root, first.len)
        };
        for rank in 1..self.world_size {
            let slot = self.slot(rank);
            if slot.kind != first_kind || slot.root != root {
                return Err(CommError::CallMismatch {
                    expected: describe(first_kind, root),
                    rank,
                    actual: describe(slot.kind, slot.root),
                });
            }
            if slot.len != len {
                return Err(CommError::RankMismatch {
                    op: first_kind.map_or("collective", Collective::name),
                    rank,
                    expected: len,
                    actual: slot.len,
                });
            }
        }
        Ok(())
    }
}

fn describe(kind: Option<Collective>, root: usize) -> String {
    match kind {
        Some(Collective::Broadcast) => format!("broadcast from rank {root}"),
        Some(kind) => kind.name().to_string(),
        None => "nothing".to_string(),
    }
}

fn peer_failed(rank: usize, reason: &str) -> CommError {
    CommError::PeerFailed {
        rank,
        reason: reason.to_string(),
    }
}

/// Chunk `i` of `len` elements split over `n` ranks.
fn chunk(len: usize, n: usize, i: usize) -> std::ops::Range<usize> {
    let c = len.div_ceil(n);
    (i * c).min(len)..((i + 1) * c).min(len)
}

impl Drop for LocalComm {
    fn drop(&mut self) {
        // Leaving is a failure only for ranks that still expect this one.
        self.fail(if std::thread::panicking() {
            "panicked".to_string()
        } else {
            "left the world (its communicator was dropped)".to_string()
        });
    }
}

impl Communicator for LocalComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn backend(&self) -> &'static str {
        "local"
    }

    fn meter(&self) -> &TrafficMeter {
        &self.meter
    }

    fn abort(&self, reason: &str) {
        self.fail(reason.to_string());
    }

    fn set_deadline(&self, timeout: Duration) {
        self.deadline.set(timeout);
    }

    fn allreduce_f32_raw(&self, buf: &mut [f32], op: ReduceOp) -> Result<(), CommError> {
        let n = self.world_size;
        let mine = chunk(buf.len(), n, self.rank);
        self.reduce_phase(buf, &mine, op)?;
        // Posting never touches `reduced`, and a rank writes its `reduced`
        // again only after every rank has posted its next call, i.e. after
        // every rank has finished this gather.
        let len = buf.len();
        for rank in 0..n {
            buf[chunk(len, n, rank)].copy_from_slice(&self.slot(rank).reduced);
        }
        Ok(())
    }

    fn broadcast_raw(&self, buf: &mut [u8], width: Width, root: usize) -> Result<(), CommError> {
        let data: &[u8] = if self.rank == root { buf } else { &[] };
        self.post(Collective::Broadcast, root, buf.len() / width.bytes(), data);
        self.finish(Collective::Broadcast, || {
            if self.rank != root {
                buf.copy_from_slice(self.slot(root).data(root)?);
            }
            Ok(())
        })
    }

    fn all_gather_raw(&self, send: &[u8], recv: &mut [u8], width: Width) -> Result<(), CommError> {
        let c = send.len();
        self.post(Collective::AllGather, 0, c / width.bytes(), send);
        self.finish(Collective::AllGather, || {
            if c > 0 {
                for (rank, out) in recv.chunks_mut(c).enumerate() {
                    out.copy_from_slice(self.slot(rank).data(rank)?);
                }
            }
            Ok(())
        })
    }

    fn all_to_all_raw(&self, send: &[u8], recv: &mut [u8], width: Width) -> Result<(), CommError> {
        let n = self.world_size;
        let c = send.len() / width.bytes() / n * width.bytes();
        let me = self.rank;
        self.post(Collective::AllToAll, 0, send.len() / width.bytes(), send);
        self.finish(Collective::AllToAll, || {
            for rank in 0..n {
                let slot = self.slot(rank);
                recv[rank * c..(rank + 1) * c]
                    .copy_from_slice(&slot.data(rank)?[me * c..(me + 1) * c]);
            }
            Ok(())
        })
    }

    fn shares_cores(&self) -> bool {
        self.shares_cores && self.world_size > 1
    }

    /// The allreduce's reduction of one range per rank, without its gather.
    fn reduce_scatter_mean_f32(
        &self,
        buf: &mut [f32],
        ranges: &[Range<usize>],
    ) -> Result<(), CommError> {
        check_ranges(self, buf.len(), ranges)?;
        let start = Instant::now();
        let mine = ranges[self.rank].clone();
        let len = buf.len();
        // The others read their ranges of `buf`; this rank writes each block
        // of its own range once the block is summed (its own values there
        // already read), with no copy through `reduced`.
        let ptr = self.post_writable(Collective::Allreduce, buf);
        self.finish(Collective::Allreduce, || {
            self.reduce_blocks(&mine, ReduceOp::Mean, |offset, block| {
                // SAFETY: the block lies in this rank's range of `buf`
                // (checked), which no other rank reads or writes, and no
                // view of it is alive (`reduce_blocks` views one block at a
                // time and has dropped it).
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        block.as_ptr(),
                        ptr.add(mine.start + offset),
                        block.len(),
                    );
                }
            })
        })?;
        record(self, Collective::Allreduce, 0, 4 * len, start);
        Ok(())
    }

    /// Each rank copies the other ranks' ranges straight out of their
    /// buffers. All access to this rank's buffer inside the collective goes
    /// through one raw pointer: the others read its range while this rank
    /// writes theirs.
    fn share_ranges_f32(&self, buf: &mut [f32], ranges: &[Range<usize>]) -> Result<(), CommError> {
        check_ranges(self, buf.len(), ranges)?;
        let ptr = self.post_writable(Collective::AllGather, buf);
        self.finish(Collective::AllGather, || {
            for (rank, range) in ranges.iter().enumerate() {
                if rank == self.rank || range.is_empty() {
                    continue;
                }
                let slot = self.slot(rank);
                let theirs = slot.f32_range(rank, range.clone())?;
                // SAFETY: `range` lies in `buf` (checked) and is rank
                // `rank`'s, which no other rank writes and this rank does
                // not read; the source is another thread's buffer.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        theirs.as_ptr(),
                        ptr.add(range.start),
                        range.len(),
                    );
                }
            }
            Ok(())
        })
    }

    fn barrier_raw(&self) -> Result<(), CommError> {
        self.post(Collective::Barrier, 0, 0, &[]);
        self.finish(Collective::Barrier, || Ok(()))
    }

    /// Rank 0 makes the value before the meeting (the others wait there,
    /// off the cores), every rank takes a reference in the read phase, and
    /// rank 0 clears the slot after the second meeting, when all have
    /// theirs. Checked as a broadcast from rank 0 carrying nothing.
    fn hand_out(
        &self,
        make: &mut dyn FnMut() -> HandedValue,
    ) -> Result<Option<HandedValue>, CommError> {
        if self.world_size == 1 {
            return Ok(None);
        }
        if self.rank == 0 {
            *self.handed() = Some(make());
        }
        self.post(Collective::Broadcast, 0, 0, &[]);
        let mut value = None;
        let result = self.finish(Collective::Broadcast, || {
            value = self.handed().clone();
            Ok(())
        });
        if self.rank == 0 {
            *self.handed() = None;
        }
        result?;
        Ok(Some(
            value.expect("rank 0 handed out a value before the meeting"),
        ))
    }
}
