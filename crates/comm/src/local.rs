//! The `local` backend: N ranks as threads of one process, really concurrent.
//!
//! Used by tests and to simulate N workers on one machine (the algorithms'
//! behaviour depends on N through error feedback and masking, so N must be
//! real). Every collective posts this rank's buffer in its own slot, meets
//! the others at a barrier, reads what it needs from the other slots, and
//! meets them again before any slot is reused. Allreduce reduces one chunk
//! per rank (in rank order, so every rank gets the same bits) and then
//! gathers the chunks, so each rank touches O(B) bytes, not O(n·B).
//!
//! Failure: a rank that errors ([`Communicator::abort`]), panics or drops its
//! communicator poisons the world, and every rank waiting in or later
//! entering a collective gets [`CommError::PeerFailed`] at once. A rank that
//! simply never arrives is reported after the world's timeout.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use crate::communicator::Width;
use crate::traffic::{Collective, TrafficMeter};
use crate::watchdog::{Deadline, Wait};
use crate::{CommError, Communicator, ReduceOp};

/// How long a rank waits for the others by default before reporting a hang.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// What a rank posted for the current collective.
#[derive(Default)]
struct Slot {
    kind: Option<Collective>,
    root: usize,
    /// Elements in the posted call, compared across ranks.
    len: usize,
    /// The posted bytes, stored in words so f32 views are aligned.
    words: Vec<u32>,
    bytes: usize,
    /// Allreduce: this rank's reduced chunk.
    reduced: Vec<f32>,
}

impl Slot {
    fn data(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.bytes]
    }
}

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
}

/// One rank of a world of threads; create the world with [`LocalComm::world`].
pub struct LocalComm {
    rank: usize,
    world_size: usize,
    shared: Arc<Shared>,
    meter: TrafficMeter,
    /// How long this rank waits for the others in one collective.
    deadline: Deadline,
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
        });
        (0..world_size)
            .map(|rank| LocalComm {
                rank,
                world_size,
                shared: Arc::clone(&shared),
                meter: TrafficMeter::default(),
                deadline: Deadline::new(timeout),
            })
            .collect()
    }

    /// Runs `body` on every rank of a new world, one thread each owning its
    /// communicator (so a panicking rank fails the others at once), and
    /// returns each rank's outcome in rank order.
    pub fn run<R: Send>(
        world_size: usize,
        timeout: Duration,
        body: impl Fn(&LocalComm) -> R + Sync,
    ) -> Vec<std::thread::Result<R>> {
        let world = Self::world_with_timeout(world_size, timeout);
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

    /// Posts this rank's call: its kind, root, length in elements (compared
    /// across ranks) and the data others will read.
    fn post(&self, kind: Collective, root: usize, len: usize, data: &[u8]) {
        let mut slot = self.my_slot();
        slot.kind = Some(kind);
        slot.root = root;
        slot.len = len;
        slot.words.clear();
        slot.words.resize(data.len().div_ceil(4), 0);
        slot.bytes = data.len();
        bytemuck::cast_slice_mut(&mut slot.words)[..data.len()].copy_from_slice(data);
    }

    /// Meets, checks that every rank made the same call, runs `read` (unless
    /// the check failed), and meets again so no slot is reposted while
    /// another rank still reads it. Every rank reaches the same verdict.
    fn finish(
        &self,
        kind: Collective,
        read: impl FnOnce() -> Result<(), CommError>,
    ) -> Result<(), CommError> {
        self.meet(kind.name())?;
        let result = self.check_same_call().and_then(|()| read());
        self.meet(kind.name())?;
        result
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
        self.post(
            Collective::Allreduce,
            0,
            buf.len(),
            bytemuck::cast_slice(buf),
        );
        self.finish(Collective::Allreduce, || {
            let mut acc = vec![0.0f32; mine.len()];
            for rank in 0..n {
                let slot = self.slot(rank);
                let theirs: &[f32] = bytemuck::cast_slice(slot.data());
                for (a, &x) in acc.iter_mut().zip(&theirs[mine.clone()]) {
                    *a += x;
                }
            }
            if op == ReduceOp::Mean {
                let inv = 1.0 / n as f32;
                acc.iter_mut().for_each(|a| *a *= inv);
            }
            self.my_slot().reduced = acc;
            Ok(())
        })?;
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
                buf.copy_from_slice(self.slot(root).data());
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
                    out.copy_from_slice(self.slot(rank).data());
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
                recv[rank * c..(rank + 1) * c].copy_from_slice(&slot.data()[me * c..(me + 1) * c]);
            }
            Ok(())
        })
    }

    fn barrier_raw(&self) -> Result<(), CommError> {
        self.post(Collective::Barrier, 0, 0, &[]);
        self.finish(Collective::Barrier, || Ok(()))
    }
}
