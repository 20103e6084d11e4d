//! The `mpi` backend: one rank per process over OpenMPI (rsmpi), launched by
//! `mpirun`. This is the multi-node engine a user's cluster already has.
//!
//! Every collective is preceded by a small exchange of a header (which
//! collective, root, length), so ranks that disagree get a clear error on
//! every rank instead of MPI's undefined behaviour. The exchange is
//! non-blocking point-to-point messages polled under a deadline: a rank
//! that never arrives (stopped, hung in I/O, dead without its process
//! ending) is named in a [`CommError::Timeout`] once the deadline passes,
//! and a stop signal that comes while the others cannot be reached ends the
//! wait too ([`CommError::Stopped`]); the trainer then ends the job with
//! `MPI_Abort`. A rank that dies takes
//! the job down through `mpirun`; a rank that fails calls `MPI_Abort` (from
//! [`Communicator::abort`], or when it panics while holding the
//! communicator) instead of finalizing, which would wait for the others
//! forever.

use std::ops::Range;
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use mpi::collective::SystemOperation;
use mpi::environment::{Threading, Universe};
use mpi::raw::AsRaw as _;
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator as _, CommunicatorCollectives as _, Root as _};

use crate::communicator::{Width, check_ranges, record};
use crate::mpi_node::NodeWindow;
use crate::traffic::{Collective, TrafficMeter};
use crate::watchdog::{Deadline, FIRST_DEADLINE, Wait};
use crate::{CommError, Communicator, ReduceOp};

/// This process's rank of the `mpirun` job.
pub struct MpiComm {
    world: SimpleCommunicator,
    rank: usize,
    world_size: usize,
    meter: TrafficMeter,
    /// Whether every rank of the job runs on this node (see
    /// [`Communicator::shares_cores`]).
    one_node: bool,
    /// The ranks' shared memory when `one_node`, allocated by the first
    /// split and grown by a longer one.
    window: Mutex<Option<NodeWindow>>,
    /// Serialises calls: MPI is initialised at `MPI_THREAD_SERIALIZED`.
    calls: Mutex<()>,
    /// How long the header exchange waits for the other ranks.
    deadline: Deadline,
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
        // The ranks that share this node's memory: all of them, when the
        // job runs on one machine.
        let one_node = world.split_shared(0).size() == world.size();
        Ok(MpiComm {
            world,
            rank,
            world_size,
            meter: TrafficMeter::default(),
            one_node,
            window: Mutex::new(None),
            calls: Mutex::new(()),
            deadline: Deadline::new(FIRST_DEADLINE),
            _universe: universe,
        })
    }

    /// Whether this process was started by `mpirun` (OpenMPI, MPICH or a
    /// PMI launcher such as Slurm's `srun`).
    pub fn launched_by_mpirun() -> bool {
        crate::launcher_env::from_env().is_some()
    }

    /// The number of processes of the `mpirun` job that started this one,
    /// read from the launcher's environment before MPI starts (`None`: not
    /// started by mpirun; 1 where the launcher does not say).
    pub fn mpirun_processes() -> Option<usize> {
        crate::launcher_env::from_env().map(|job| job.processes)
    }

    /// This process's rank among the job's processes on its node (0 when
    /// not started by mpirun, or the launcher does not say): the GPU it
    /// takes, as PyTorch's `LOCAL_RANK`.
    pub fn node_local_rank() -> usize {
        crate::launcher_env::from_env().map_or(0, |job| job.node_rank)
    }

    fn lock(&self) -> MutexGuard<'_, ()> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The start of a collective through the node's shared window: the MPI
    /// lock taken, the call agreed with every rank, and the window with at
    /// least `len` elements per rank; `None` for an empty buffer.
    #[allow(clippy::type_complexity)]
    fn enter_window(
        &self,
        kind: Collective,
        op: &'static str,
        len: usize,
    ) -> Result<Option<(MutexGuard<'_, ()>, MutexGuard<'_, Option<NodeWindow>>)>, CommError> {
        let calls = self.lock();
        self.agree(kind, 0, len)?;
        check_count(op, len)?;
        if len == 0 {
            return Ok(None);
        }
        Ok(Some((calls, self.node_window(len))))
    }

    /// The node's shared window with at least `len` elements per rank.
    /// Collective (every rank asks for the same length, agreed before);
    /// call under `calls`.
    fn node_window(&self, len: usize) -> MutexGuard<'_, Option<NodeWindow>> {
        let mut window = self.window.lock().unwrap_or_else(|p| p.into_inner());
        if window.as_ref().is_none_or(|w| w.len() < len) {
            // SAFETY: every rank is here with the same length, under its
            // MPI lock, and every rank is on this node (`one_node`).
            unsafe {
                if let Some(old) = window.take() {
                    old.free();
                }
                *window = Some(NodeWindow::allocate(
                    self.world.as_raw(),
                    self.world_size,
                    len,
                ));
            }
        }
        window
    }

    /// Exchanges `(kind, root, len)` with every rank and checks every rank
    /// matches rank 0.
    fn agree(&self, kind: Collective, root: usize, len: usize) -> Result<(), CommError> {
        let mine = [kind as u64, root as u64, len as u64];
        let all = self.exchange_headers(kind.name(), mine)?;
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

/// The tag of the header messages (the payload collectives use none).
const HEADER_TAG: i32 = 0x7e55;

impl MpiComm {
    /// Every rank's header, this one's included, by non-blocking sends and
    /// receives polled until all complete, the deadline passes (the ranks
    /// whose header never came are named) or a stop signal outlasts
    /// [`crate::watchdog::STOP_GRACE`]. Messages between two ranks with one tag
    /// arrive in order, so each receive matches that rank's header for
    /// this same collective.
    fn exchange_headers(&self, op: &'static str, mine: [u64; 3]) -> Result<Vec<u64>, CommError> {
        use mpi::datatype::Equivalence as _;
        use mpi::ffi;
        use mpi::raw::AsRaw as _;
        use std::os::raw::{c_int, c_void};

        let n = self.world_size;
        let mut all = vec![0u64; 3 * n];
        all[3 * self.rank..3 * self.rank + 3].copy_from_slice(&mine);
        if n == 1 {
            return Ok(all);
        }
        // On the heap and leaked if a send is still pending when this gives
        // up: MPI may read a send buffer until its request completes.
        let send: Box<[u64; 3]> = Box::new(mine);
        let peers: Vec<usize> = (0..n).filter(|&r| r != self.rank).collect();
        // SAFETY: every buffer outlives its request: `all` and `send` are
        // not touched until their requests completed, were cancelled and
        // waited for, or (a send only) were leaked with their buffer.
        unsafe {
            let datatype = u64::equivalent_datatype().as_raw();
            let comm = self.world.as_raw();
            let mut receives = vec![ffi::RSMPI_REQUEST_NULL; peers.len()];
            let mut sends = vec![ffi::RSMPI_REQUEST_NULL; peers.len()];
            for (i, &peer) in peers.iter().enumerate() {
                let slot = all.as_mut_ptr().add(3 * peer) as *mut c_void;
                ffi::MPI_Irecv(
                    slot,
                    3,
                    datatype,
                    peer as c_int,
                    HEADER_TAG,
                    comm,
                    &mut receives[i],
                );
            }
            for (i, &peer) in peers.iter().enumerate() {
                let data = send.as_ptr() as *const c_void;
                ffi::MPI_Isend(
                    data,
                    3,
                    datatype,
                    peer as c_int,
                    HEADER_TAG,
                    comm,
                    &mut sends[i],
                );
            }
            let done = |requests: &mut Vec<ffi::MPI_Request>| {
                let mut flag: c_int = 0;
                ffi::MPI_Testall(
                    requests.len() as c_int,
                    requests.as_mut_ptr(),
                    &mut flag,
                    ffi::RSMPI_STATUSES_IGNORE,
                );
                flag != 0
            };
            let mut wait = Wait::start(&self.deadline);
            let mut polls: u32 = 0;
            loop {
                if done(&mut receives) && done(&mut sends) {
                    return Ok(all);
                }
                polls = polls.wrapping_add(1);
                // Spin for the usual microseconds, then yield the core.
                if polls > 1000 {
                    std::thread::sleep(std::time::Duration::from_micros(200));
                }
                if !polls.is_multiple_of(64) {
                    continue;
                }
                let Some(why) = wait.give_up() else {
                    continue;
                };
                let mut missing = Vec::new();
                for (i, &peer) in peers.iter().enumerate() {
                    let mut flag: c_int = 0;
                    ffi::MPI_Test(&mut receives[i], &mut flag, ffi::RSMPI_STATUS_IGNORE);
                    if flag == 0 {
                        missing.push(peer);
                        ffi::MPI_Cancel(&mut receives[i]);
                        ffi::MPI_Wait(&mut receives[i], ffi::RSMPI_STATUS_IGNORE);
                    }
                }
                if !done(&mut sends) {
                    std::mem::forget(send);
                }
                return Err(why.error(op, wait.timeout(), missing));
            }
        }
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

impl MpiComm {
    /// The all-gather or all-to-all `kind` of `send` into `recv`: agreed,
    /// count-checked and typed the same way, they differ only in the MPI
    /// call and in the buffer whose count MPI takes (all-gather's `recv`
    /// holds every rank's `send`).
    fn exchange(
        &self,
        kind: Collective,
        send: &[u8],
        recv: &mut [u8],
        width: Width,
    ) -> Result<(), CommError> {
        let _calls = self.lock();
        self.agree(kind, 0, send.len() / width.bytes())?;
        let (op, counted) = match kind {
            Collective::AllGather => ("all_gather", recv.len()),
            _ => ("all_to_all", send.len()),
        };
        check_count(op, counted / width.bytes())?;
        if send.is_empty() {
            return Ok(());
        }
        match width {
            Width::Byte => self.exchange_as(kind, send, recv),
            Width::Word => self.exchange_as(
                kind,
                bytemuck::cast_slice::<u8, u32>(send),
                bytemuck::cast_slice_mut::<u8, u32>(recv),
            ),
        }
        Ok(())
    }

    /// The MPI call of [`MpiComm::exchange`] on `T` elements.
    fn exchange_as<T: mpi::datatype::Equivalence>(
        &self,
        kind: Collective,
        send: &[T],
        recv: &mut [T],
    ) {
        if kind == Collective::AllGather {
            self.world.all_gather_into(send, recv);
        } else {
            self.world.all_to_all_into(send, recv);
        }
    }
}

impl Drop for MpiComm {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.abort("panicked");
        }
        let window = self.window.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(window) = window.take() {
            // SAFETY: every rank that allocated it ends the job by dropping
            // its communicator (a failing rank aborts above or through
            // `abort` instead), before `_universe` finalises MPI.
            unsafe { window.free() };
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

    fn set_deadline(&self, timeout: std::time::Duration) {
        self.deadline.set(timeout);
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
        self.exchange(Collective::AllGather, send, recv, width)
    }

    fn all_to_all_raw(&self, send: &[u8], recv: &mut [u8], width: Width) -> Result<(), CommError> {
        self.exchange(Collective::AllToAll, send, recv, width)
    }

    /// Processes on one node share its cores and memory: the update every
    /// rank would repeat is split between them, as between `local` ranks
    /// (2 processes on a 2-core machine each stepped LAMB over the whole
    /// buffer on its one thread).
    fn shares_cores(&self) -> bool {
        self.one_node && self.world_size > 1
    }

    /// Two ranks on one node, through the shared window: each copies the
    /// other's range of `buf` into its segment (the only part the other
    /// reads), then sums its own range over its own `buf` and the other's
    /// segment and scales for the mean (a sum of two is the same in either
    /// order, so these are `MPI_Allreduce`'s bits, as the split step needs;
    /// from three ranks MPI's order of addition is its own). Otherwise the
    /// whole allreduce.
    fn reduce_scatter_mean_f32(
        &self,
        buf: &mut [f32],
        ranges: &[Range<usize>],
    ) -> Result<(), CommError> {
        check_ranges(self, buf.len(), ranges)?;
        if !self.shares_cores() || self.world_size != 2 {
            return self.allreduce_f32(buf, ReduceOp::Mean);
        }
        let start = Instant::now();
        {
            let Some((_calls, mut window)) =
                self.enter_window(Collective::Allreduce, "reduce_scatter", buf.len())?
            else {
                return Ok(());
            };
            let window = window.as_mut().expect("allocated by enter_window");
            let (mine, other) = (self.rank, 1 - self.rank);
            let theirs = ranges[other].clone();
            // SAFETY: each rank writes only its own segment before the
            // first fence and only reads segments between the fences; the
            // second fence keeps the next call from writing a segment that
            // a rank still reads.
            unsafe {
                window.own(mine)[theirs.clone()].copy_from_slice(&buf[theirs]);
                window.fence();
                let range = ranges[mine].clone();
                let received = &window.segment(other)[range.clone()];
                // The mean as `allreduce_f32_raw` takes it: sum, then scale.
                let inv = 1.0 / self.world_size as f32;
                // x0 + x1, as MPI_Allreduce adds two (a sum from zero
                // would turn -0 + -0 into +0).
                for (o, &r) in buf[range].iter_mut().zip(received) {
                    let (a, b) = if mine == 0 { (*o, r) } else { (r, *o) };
                    *o = (a + b) * inv;
                }
                window.fence();
            }
        }
        record(self, Collective::Allreduce, 0, size_of_val(buf), start);
        Ok(())
    }

    /// On one node, through the shared window: each rank puts its range
    /// into its segment and copies the others' out of theirs; not traffic,
    /// as between `local` ranks. Elsewhere the default all-gather.
    fn share_ranges_f32(&self, buf: &mut [f32], ranges: &[Range<usize>]) -> Result<(), CommError> {
        if !self.shares_cores() {
            return crate::communicator::share_ranges_by_all_gather(self, buf, ranges);
        }
        check_ranges(self, buf.len(), ranges)?;
        let Some((_calls, mut window)) =
            self.enter_window(Collective::AllGather, "share_ranges", buf.len())?
        else {
            return Ok(());
        };
        let window = window.as_mut().expect("allocated by enter_window");
        let mine = ranges[self.rank].clone();
        // SAFETY: as in `reduce_scatter_mean_f32`: own segment written
        // before the first fence, others' read between the fences.
        unsafe {
            window.own(self.rank)[mine.clone()].copy_from_slice(&buf[mine]);
            window.fence();
            for (rank, range) in ranges.iter().enumerate() {
                if rank != self.rank {
                    buf[range.clone()].copy_from_slice(&window.segment(rank)[range.clone()]);
                }
            }
            window.fence();
        }
        Ok(())
    }

    fn barrier_raw(&self) -> Result<(), CommError> {
        let _calls = self.lock();
        // The header exchange already waits for every rank.
        self.agree(Collective::Barrier, 0, 0)
    }
}
