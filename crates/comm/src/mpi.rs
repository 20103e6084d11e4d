//! The `mpi` backend: one rank per process over OpenMPI (rsmpi), launched by
//! `mpirun`. This is the multi-node engine a user's cluster already has.
//!
//! Every collective is preceded by a small all-gather of a header (which
//! collective, root, length), so ranks that disagree get a clear error on
//! every rank instead of MPI's undefined behaviour. A rank that dies takes
//! the job down through `mpirun`; a rank that fails calls `MPI_Abort` (from
//! [`Communicator::abort`], or when it panics while holding the
//! communicator) instead of finalizing, which would wait for the others
//! forever.

use std::sync::{Mutex, MutexGuard};

use mpi::collective::SystemOperation;
use mpi::environment::{Threading, Universe};
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator as _, CommunicatorCollectives as _, Root as _};

use crate::communicator::Width;
use crate::traffic::{Collective, TrafficMeter};
use crate::{CommError, Communicator, ReduceOp};

/// This process's rank of the `mpirun` job.
pub struct MpiComm {
    world: SimpleCommunicator,
    rank: usize,
    world_size: usize,
    meter: TrafficMeter,
    /// Serialises calls: MPI is initialised at `MPI_THREAD_SERIALIZED`.
    calls: Mutex<()>,
    // Declared last: dropped (MPI_Finalize) after everything above.
    _universe: Universe,
}

// SAFETY: MPI is initialised with at least MPI_THREAD_SERIALIZED (checked in
// `init`) and every call goes through the `calls` mutex, so no two threads
// ever call MPI at once on this communicator.
unsafe impl Send for MpiComm {}
// SAFETY: as above.
unsafe impl Sync for MpiComm {}

impl MpiComm {
    /// Initialises MPI (once per process) and joins `MPI_COMM_WORLD`.
    pub fn init() -> Result<MpiComm, CommError> {
        let (universe, level) = mpi::initialize_with_threading(Threading::Serialized)
            .ok_or_else(|| backend("MPI is already initialised in this process"))?;
        if matches!(level, Threading::Single | Threading::Funneled) {
            return Err(backend(format!(
                "this MPI library offers only {level:?} threading; terse needs Serialized"
            )));
        }
        let world = universe.world();
        let rank = world.rank() as usize;
        let world_size = world.size() as usize;
        Ok(MpiComm {
            world,
            rank,
            world_size,
            meter: TrafficMeter::default(),
            calls: Mutex::new(()),
            _universe: universe,
        })
    }

    /// Whether this process was started by `mpirun` (OpenMPI, MPICH or a
    /// PMI launcher such as Slurm's `srun`).
    pub fn launched_by_mpirun() -> bool {
        ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"]
            .iter()
            .any(|var| std::env::var_os(var).is_some())
    }

    fn lock(&self) -> MutexGuard<'_, ()> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// All-gathers `(kind, root, len)` and checks every rank matches rank 0.
    fn agree(&self, kind: Collective, root: usize, len: usize) -> Result<(), CommError> {
        let mine = [kind as u64, root as u64, len as u64];
        let mut all = vec![0u64; 3 * self.world_size];
        self.world.all_gather_into(&mine[..], &mut all[..]);
        let first = &all[..3];
        for (rank, theirs) in all.chunks(3).enumerate().skip(1) {
            if theirs[0] != first[0] || theirs[1] != first[1] {
                return Err(CommError::CallMismatch {
                    expected: describe(first),
                    rank,
                    actual: describe(theirs),
                });
            }
            if theirs[2] != first[2] {
                return Err(CommError::RankMismatch {
                    op: kind.name(),
                    rank,
                    expected: first[2] as usize,
                    actual: theirs[2] as usize,
                });
            }
        }
        Ok(())
    }
}

fn describe(header: &[u64]) -> String {
    let kind = Collective::ALL
        .get(header[0] as usize)
        .map_or("an unknown collective", |k| k.name());
    if header[0] == Collective::Broadcast as u64 {
        format!("{kind} from rank {}", header[1])
    } else {
        kind.to_string()
    }
}

fn backend(message: impl Into<String>) -> CommError {
    CommError::Backend {
        backend: "mpi",
        message: message.into(),
    }
}

/// MPI counts are C ints: refuse a message with more elements.
fn check_count(op: &'static str, elements: usize) -> Result<(), CommError> {
    if elements > i32::MAX as usize {
        return Err(backend(format!(
            "{op}: {elements} elements exceed MPI's count limit of {}",
            i32::MAX
        )));
    }
    Ok(())
}

impl Drop for MpiComm {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.abort("panicked");
        }
    }
}

impl Communicator for MpiComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn backend(&self) -> &'static str {
        "mpi"
    }

    fn meter(&self) -> &TrafficMeter {
        &self.meter
    }

    fn abort(&self, reason: &str) {
        let message = format!("rank {} failed: {reason}; aborting the MPI job", self.rank);
        // The job is about to die: the reason must reach stderr even in a
        // binary that installed no `tracing` subscriber (terse-comm-check).
        if tracing::dispatcher::has_been_set() {
            tracing::error!("{message}");
        } else {
            eprintln!("terse: {message}");
        }
        self.world.abort(1);
    }

    fn allreduce_f32_raw(&self, buf: &mut [f32], op: ReduceOp) -> Result<(), CommError> {
        let _calls = self.lock();
        self.agree(Collective::Allreduce, 0, buf.len())?;
        check_count("allreduce", buf.len())?;
        if buf.is_empty() {
            return Ok(());
        }
        let send = buf.to_vec();
        self.world
            .all_reduce_into(&send[..], buf, SystemOperation::sum());
        if op == ReduceOp::Mean {
            let inv = 1.0 / self.world_size as f32;
            buf.iter_mut().for_each(|x| *x *= inv);
        }
        Ok(())
    }

    fn broadcast_raw(&self, buf: &mut [u8], width: Width, root: usize) -> Result<(), CommError> {
        let _calls = self.lock();
        self.agree(Collective::Broadcast, root, buf.len() / width.bytes())?;
        check_count("broadcast", buf.len() / width.bytes())?;
        if buf.is_empty() {
            // Every rank agreed on the length; an empty slice's dangling
            // pointer could read as MPI_IN_PLACE.
            return Ok(());
        }
        let root = self.world.process_at_rank(root as i32);
        match width {
            Width::Byte => root.broadcast_into(buf),
            Width::Word => root.broadcast_into(bytemuck::cast_slice_mut::<u8, u32>(buf)),
        }
        Ok(())
    }

    fn all_gather_raw(&self, send: &[u8], recv: &mut [u8], width: Width) -> Result<(), CommError> {
        let _calls = self.lock();
        self.agree(Collective::AllGather, 0, send.len() / width.bytes())?;
        check_count("all_gather", recv.len() / width.bytes())?;
        if send.is_empty() {
            return Ok(());
        }
        match width {
            Width::Byte => self.world.all_gather_into(send, recv),
            Width::Word => self.world.all_gather_into(
                bytemuck::cast_slice::<u8, u32>(send),
                bytemuck::cast_slice_mut::<u8, u32>(recv),
            ),
        }
        Ok(())
    }

    fn all_to_all_raw(&self, send: &[u8], recv: &mut [u8], width: Width) -> Result<(), CommError> {
        let _calls = self.lock();
        self.agree(Collective::AllToAll, 0, send.len() / width.bytes())?;
        check_count("all_to_all", send.len() / width.bytes())?;
        if send.is_empty() {
            return Ok(());
        }
        match width {
            Width::Byte => self.world.all_to_all_into(send, recv),
            Width::Word => self.world.all_to_all_into(
                bytemuck::cast_slice::<u8, u32>(send),
                bytemuck::cast_slice_mut::<u8, u32>(recv),
            ),
        }
        Ok(())
    }

    fn barrier_raw(&self) -> Result<(), CommError> {
        let _calls = self.lock();
        // The header exchange already waits for every rank.
        self.agree(Collective::Barrier, 0, 0)
    }
}
