//! The `local` backend: N ranks as threads of one process, really concurrent.
//!
//! Used by tests and to simulate N workers on one machine (the algorithms'
//! behaviour depends on N through error feedback and masking, so N must be
//! real). Every collective is an exchange through shared slots: each rank
//! posts its buffer, all meet at a barrier, each reads what it needs in rank
//! order (so reductions are bit-identical on every rank), and all meet again
//! before the slots are reused.

use std::sync::{Arc, Barrier, Mutex};

use crate::{CommError, Communicator, ReduceOp};

/// A posted buffer.
#[derive(Clone)]
enum Posted {
    F32(Vec<f32>),
    U32(Vec<u32>),
}

struct Shared {
    slots: Mutex<Vec<Option<Posted>>>,
    barrier: Barrier,
}

/// One rank of a world of threads; create the world with [`LocalComm::world`].
pub struct LocalComm {
    rank: usize,
    world_size: usize,
    shared: Arc<Shared>,
}

impl LocalComm {
    /// The `world_size` ranks of a new world, rank `i` at index `i`; move each
    /// into its own thread.
    pub fn world(world_size: usize) -> Vec<LocalComm> {
        assert!(world_size > 0, "a world needs at least one rank");
        let shared = Arc::new(Shared {
            slots: Mutex::new(vec![None; world_size]),
            barrier: Barrier::new(world_size),
        });
        (0..world_size)
            .map(|rank| LocalComm {
                rank,
                world_size,
                shared: Arc::clone(&shared),
            })
            .collect()
    }

    /// Posts `mine`, waits for every rank, runs `read` over all posted buffers
    /// (in rank order), then waits again so no slot is overwritten early.
    fn exchange<R>(&self, mine: Posted, read: impl FnOnce(&[Option<Posted>]) -> R) -> R {
        self.shared
            .slots
            .lock()
            .expect("no rank panicked holding the slots")[self.rank] = Some(mine);
        self.shared.barrier.wait();
        let result = {
            let slots = self
                .shared
                .slots
                .lock()
                .expect("no rank panicked holding the slots");
            read(&slots)
        };
        self.shared.barrier.wait();
        result
    }
}

fn f32s(slot: &Option<Posted>) -> &[f32] {
    match slot {
        Some(Posted::F32(v)) => v,
        _ => &[],
    }
}

fn u32s(slot: &Option<Posted>) -> &[u32] {
    match slot {
        Some(Posted::U32(v)) => v,
        _ => &[],
    }
}

/// The first rank whose posted length differs from `expected`, as an error.
fn check_lengths(
    op: &'static str,
    expected: usize,
    lengths: impl Iterator<Item = usize>,
) -> Result<(), CommError> {
    match lengths.into_iter().find(|&n| n != expected) {
        Some(actual) => Err(CommError::LengthMismatch {
            op,
            expected,
            actual,
        }),
        None => Ok(()),
    }
}

impl Communicator for LocalComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn allreduce_f32(&self, buf: &mut [f32], op: ReduceOp) -> Result<(), CommError> {
        let n = self.world_size;
        let len = buf.len();
        self.exchange(Posted::F32(buf.to_vec()), |slots| {
            check_lengths("allreduce", len, slots.iter().map(|s| f32s(s).len()))?;
            buf.fill(0.0);
            for slot in slots {
                for (acc, &x) in buf.iter_mut().zip(f32s(slot)) {
                    *acc += x;
                }
            }
            if op == ReduceOp::Mean {
                let inv = 1.0 / n as f32;
                buf.iter_mut().for_each(|x| *x *= inv);
            }
            Ok(())
        })
    }

    fn broadcast_f32(&self, buf: &mut [f32], root: usize) -> Result<(), CommError> {
        if root >= self.world_size {
            return Err(CommError::BadRank {
                op: "broadcast",
                rank: root,
                world_size: self.world_size,
            });
        }
        let len = buf.len();
        self.exchange(Posted::F32(buf.to_vec()), |slots| {
            check_lengths("broadcast", len, slots.iter().map(|s| f32s(s).len()))?;
            buf.copy_from_slice(f32s(&slots[root]));
            Ok(())
        })
    }

    fn all_gather_u32(&self, send: &[u32], recv: &mut [u32]) -> Result<(), CommError> {
        let c = send.len();
        let expected = c * self.world_size;
        let recv_ok = recv.len() == expected;
        let result = self.exchange(Posted::U32(send.to_vec()), |slots| {
            check_lengths("all_gather", c, slots.iter().map(|s| u32s(s).len()))?;
            if recv_ok {
                for (chunk, slot) in recv.chunks_mut(c.max(1)).zip(slots) {
                    chunk.copy_from_slice(u32s(slot));
                }
            }
            Ok(())
        });
        result?;
        if recv_ok {
            Ok(())
        } else {
            Err(CommError::LengthMismatch {
                op: "all_gather",
                expected,
                actual: recv.len(),
            })
        }
    }

    fn all_to_all_u32(&self, send: &[u32], recv: &mut [u32]) -> Result<(), CommError> {
        let n = self.world_size;
        let total = send.len();
        let (expected, actual) = if total.is_multiple_of(n) {
            (total, recv.len())
        } else {
            (total.div_ceil(n) * n, total)
        };
        if expected != actual {
            // Still take part in the exchange so the other ranks are not left
            // waiting at the barrier; report the local error afterwards.
            self.exchange(Posted::U32(Vec::new()), |_| ());
            return Err(CommError::LengthMismatch {
                op: "all_to_all",
                expected,
                actual,
            });
        }
        let c = total / n;
        let me = self.rank;
        self.exchange(Posted::U32(send.to_vec()), |slots| {
            check_lengths("all_to_all", total, slots.iter().map(|s| u32s(s).len()))?;
            for (j, slot) in slots.iter().enumerate() {
                recv[j * c..(j + 1) * c].copy_from_slice(&u32s(slot)[me * c..(me + 1) * c]);
            }
            Ok(())
        })
    }

    fn barrier(&self) -> Result<(), CommError> {
        self.shared.barrier.wait();
        Ok(())
    }
}
