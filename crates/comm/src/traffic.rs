//! The traffic meter: bytes each rank sends and receives, per kind of
//! collective, so optimizers can report what a step put on the wire.
//!
//! Bytes are those of the bandwidth-optimal algorithm for each collective,
//! counted identically on every backend: ring allreduce `2(n-1)/n·B` each way,
//! pairwise all-to-all `(n-1)/n·B`, ring all-gather `(n-1)·B` for a `B`-byte
//! contribution, pipelined chain broadcast `B` (the root only sends, the last
//! rank of the chain only receives). MPI and NCCL choose their own algorithms
//! at run time; these are the volumes a bandwidth-bound network sees.

use std::fmt;
use std::ops::Sub;
use std::sync::Mutex;
use std::time::Duration;

/// The kinds of collective the meter tells apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Collective {
    /// [`Communicator::allreduce_f32`](crate::Communicator::allreduce_f32).
    Allreduce,
    /// Broadcast from one root.
    Broadcast,
    /// All-gather.
    AllGather,
    /// All-to-all.
    AllToAll,
    /// Barrier (no payload).
    Barrier,
}

impl Collective {
    /// Every kind, in a fixed order.
    pub const ALL: [Collective; 5] = [
        Collective::Allreduce,
        Collective::Broadcast,
        Collective::AllGather,
        Collective::AllToAll,
        Collective::Barrier,
    ];

    /// The name used in logs and errors.
    pub fn name(self) -> &'static str {
        match self {
            Collective::Allreduce => "allreduce",
            Collective::Broadcast => "broadcast",
            Collective::AllGather => "all_gather",
            Collective::AllToAll => "all_to_all",
            Collective::Barrier => "barrier",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Calls and bytes of one kind of collective.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Volume {
    /// Number of calls.
    pub calls: u64,
    /// Bytes this rank sent.
    pub sent: u64,
    /// Bytes this rank received.
    pub received: u64,
    /// Wall time this rank spent inside these calls: the network and the
    /// waiting for other ranks, none of the compression around them.
    pub time: Duration,
}

/// A reading of the meter: cumulative since the communicator was created.
/// Subtract two readings for the traffic of a step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    by_kind: [Volume; 5],
}

impl Traffic {
    /// The volume of one kind of collective.
    pub fn of(&self, kind: Collective) -> Volume {
        self.by_kind[kind.index()]
    }

    /// Bytes sent over all kinds.
    pub fn sent(&self) -> u64 {
        self.by_kind.iter().map(|v| v.sent).sum()
    }

    /// Calls over all kinds.
    pub fn calls(&self) -> u64 {
        self.by_kind.iter().map(|v| v.calls).sum()
    }

    /// Bytes received over all kinds.
    pub fn received(&self) -> u64 {
        self.by_kind.iter().map(|v| v.received).sum()
    }

    /// Wall time spent inside collectives, over all kinds.
    pub fn time(&self) -> Duration {
        self.by_kind.iter().map(|v| v.time).sum()
    }
}

impl Sub for Traffic {
    type Output = Traffic;

    fn sub(self, earlier: Traffic) -> Traffic {
        let mut out = self;
        for (v, e) in out.by_kind.iter_mut().zip(earlier.by_kind) {
            v.calls -= e.calls;
            v.sent -= e.sent;
            v.received -= e.received;
            v.time -= e.time;
        }
        out
    }
}

/// The counters behind [`Traffic`]; every backend owns one.
#[derive(Debug, Default)]
pub struct TrafficMeter {
    totals: Mutex<Traffic>,
}

impl TrafficMeter {
    /// The current reading.
    pub fn reading(&self) -> Traffic {
        *self.totals.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts one call.
    pub fn record(&self, kind: Collective, sent: u64, received: u64, time: Duration) {
        let mut totals = self.totals.lock().unwrap_or_else(|p| p.into_inner());
        let v = &mut totals.by_kind[kind.index()];
        v.calls += 1;
        v.sent += sent;
        v.received += received;
        v.time += time;
    }
}

/// Bytes `(sent, received)` by rank `rank` of `n` for a collective on a
/// `bytes`-byte buffer (for all-gather: this rank's contribution; for
/// all-to-all: the whole send buffer).
pub fn volume(kind: Collective, n: usize, rank: usize, root: usize, bytes: usize) -> (u64, u64) {
    let (n64, b) = (n as u64, bytes as u64);
    if n <= 1 {
        return (0, 0);
    }
    match kind {
        Collective::Allreduce => {
            let v = 2 * (n64 - 1) * b / n64;
            (v, v)
        }
        Collective::AllToAll => {
            let v = (n64 - 1) * b / n64;
            (v, v)
        }
        Collective::AllGather => ((n64 - 1) * b, (n64 - 1) * b),
        Collective::Broadcast => {
            let last = (root + n - 1) % n;
            let sent = if rank == last { 0 } else { b };
            let received = if rank == root { 0 } else { b };
            (sent, received)
        }
        Collective::Barrier => (0, 0),
    }
}
