//! The `nccl` backend (feature `nccl`): collectives through NCCL on one GPU
//! per rank, bootstrapped over a host communicator (rank 0 makes the NCCL id
//! and broadcasts it): MPI's under `mpirun`, the way PyTorch and DeepSpeed
//! start NCCL there, and for a process started alone a world of one that
//! needs no MPI at all ([`NcclComm::start`]).
//!
//! The typed collectives take host buffers like every other backend's
//! (copied to the device, reduced by NCCL, copied back); a buffer already on
//! the GPU (a CUDA run's flat gradient) is reduced where it is through
//! [`GpuCollectives`]; device-resident compression hands NCCL only packed
//! bits. cudarc loads libcuda and libnccl at run time, so this builds
//! everywhere (it is in every build of terse); on a machine without them
//! [`NcclComm::start`] names what is missing.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits};
use cudarc::nccl::result::NcclError;
use cudarc::nccl::{Comm, Id, NcclType, group_end, group_start};

mod abort;
mod borrowed;
mod failure;
mod gpu_buffers_check;
mod libraries;

pub use libraries::missing_libraries;

use self::abort::live;
use self::borrowed::Borrowed;
use self::failure::nccl_failed;
use crate::communicator::{Width, record};
use crate::one_gpu_each::one_gpu_each;
use crate::traffic::{Collective, TrafficMeter};
use crate::watchdog::{Deadline, FIRST_DEADLINE, Wait};
use crate::{
    CommError, Communicator, GpuBytes, GpuCollectives, GpuF32, MpiComm, ReduceOp, SingleRank,
};

/// This rank's NCCL communicator, plus the host one it was bootstrapped
/// from (used for the cross-rank call checks and for aborting).
pub struct NcclComm {
    /// NCCL's communicator, its lock the lock of every NCCL and CUDA call.
    /// `None` once NCCL work failed or timed out after it was queued: that
    /// work may still be running, reading and writing buffers the caller
    /// frees or reuses next (cubecl's pool hands them to other kernels on
    /// its own stream, which nothing orders against this one), so the
    /// communicator is aborted (`ncclCommAbort`, cudarc's `Drop` for
    /// `Comm`, which ends the kernels still queued), the stream drained,
    /// and every later call refused.
    nccl: Mutex<Option<Comm>>,
    stream: Arc<CudaStream>,
    host: Box<dyn Communicator>,
    meter: TrafficMeter,
    /// How long a wait for NCCL's work may take (the host part has its
    /// own, set together by [`Communicator::set_deadline`]).
    deadline: Deadline,
}

// SAFETY: every NCCL and CUDA call goes through the `nccl` mutex, and the
// stream is only used under it (but for the self-check's buffers, which
// `check_gpu_buffers` makes on the one thread that runs it).
unsafe impl Send for NcclComm {}
// SAFETY: as above.
unsafe impl Sync for NcclComm {}

fn backend(message: impl std::fmt::Display) -> CommError {
    CommError::Backend {
        backend: "nccl",
        message: message.to_string(),
    }
}

impl NcclComm {
    /// Opens GPU `device` and joins the NCCL world of this process's job:
    /// the MPI job's when `mpirun` (or another MPI launcher) started it,
    /// else a world of this process alone, with no MPI: OpenMPI's
    /// singleton start loads its plugins and may start `orted`, which a
    /// machine running terse from `cargo xtask bundle` does not have.
    pub fn start(device: usize) -> Result<NcclComm, CommError> {
        // What is missing is said before MPI starts.
        if let Some(missing) = missing_libraries() {
            return Err(backend(missing));
        }
        NcclComm::init(host_for_nccl()?, device)
    }

    /// Opens GPU `device` and joins the NCCL world of `host`'s ranks,
    /// bootstrapped over `host`, once libcuda and libnccl are known to load.
    /// A rank that fails here aborts the job through `host`: the others
    /// would otherwise wait for it in the bootstrap's collectives (until the
    /// first deadline) or inside `ncclCommInitRank` (with none).
    fn init(host: Box<dyn Communicator>, device: usize) -> Result<NcclComm, CommError> {
        let opened = NcclComm::open(host.as_ref(), device);
        match opened {
            Ok((nccl, stream)) => Ok(NcclComm {
                nccl: Mutex::new(Some(nccl)),
                stream,
                host,
                meter: TrafficMeter::default(),
                deadline: Deadline::new(FIRST_DEADLINE),
            }),
            Err(e) => {
                if host.world_size() > 1 {
                    host.abort(&format!("starting NCCL: {e}"));
                }
                Err(e)
            }
        }
    }

    /// [`NcclComm::init`]'s work: GPU `device`, its stream, the NCCL
    /// communicator of `host`'s ranks.
    fn open(host: &dyn Communicator, device: usize) -> Result<(Comm, Arc<CudaStream>), CommError> {
        let ctx = CudaContext::new(device).map_err(|e| backend(format!("GPU {device}: {e:?}")))?;
        let uuid = ctx
            .uuid()
            .map_err(|e| backend(format!("GPU {device}'s UUID: {e:?}")))?;
        one_gpu_each(host, uuid.bytes.map(|b| b as u8), device)?;
        let stream = ctx.default_stream();
        let id = if host.rank() == 0 {
            Id::new().map_err(|e| nccl_failed("ncclGetUniqueId", &e))?
        } else {
            Id::uninit([0; 128])
        };
        let mut bytes: Vec<u8> = id.internal().iter().map(|&c| c as u8).collect();
        host.broadcast_u8(&mut bytes, 0)?;
        let mut internal = [0 as std::ffi::c_char; 128];
        for (dst, &b) in internal.iter_mut().zip(&bytes) {
            *dst = b as std::ffi::c_char;
        }
        let (rank, world) = (host.rank(), host.world_size());
        let nccl = Comm::from_rank(stream.clone(), rank, world, Id::uninit(internal))
            .map_err(|e| nccl_failed("ncclCommInitRank", &e))?;
        Ok((nccl, stream))
    }

    fn lock(&self) -> MutexGuard<'_, Option<Comm>> {
        self.nccl.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs the cross-rank call check over the host communicator (a tiny
    /// all-gather).
    fn agree(&self, kind: Collective, root: usize, len: usize) -> Result<(), CommError> {
        let mine = [kind as u32, root as u32, len as u32, (len >> 32) as u32];
        let mut all = vec![0u32; 4 * self.host.world_size()];
        self.host.all_gather_raw(
            bytemuck::cast_slice(&mine),
            bytemuck::cast_slice_mut(&mut all),
            Width::Word,
        )?;
        for (rank, theirs) in all.chunks(4).enumerate().skip(1) {
            if theirs[..2] != all[..2] {
                return Err(CommError::CallMismatch {
                    expected: describe(&all[..2]),
                    rank,
                    actual: describe(theirs),
                });
            }
            if theirs[2..] != all[2..4] {
                return Err(CommError::RankMismatch {
                    op: kind.name(),
                    rank,
                    expected: len_of(&all[..4]),
                    actual: len_of(theirs),
                });
            }
        }
        Ok(())
    }

    /// Copies `host` to the device.
    fn upload<T: DeviceRepr>(&self, host: &[T]) -> Result<CudaSlice<T>, CommError> {
        self.stream
            .clone_htod(host)
            .map_err(|e| backend(format!("{e:?}")))
    }

    /// Runs the NCCL call `op` (named `call` in its error) of the
    /// communicator in `slot` from `send` into a new device buffer as long
    /// as `out`, and copies that into `out`.
    fn on_device<T: DeviceRepr + ValidAsZeroBits + NcclType + Copy, R>(
        &self,
        slot: &mut Option<Comm>,
        send: CudaSlice<T>,
        out: &mut [T],
        call: &'static str,
        op: impl FnOnce(&Comm, &CudaSlice<T>, &mut CudaSlice<T>) -> Result<R, NcclError>,
    ) -> Result<(), CommError> {
        let mut recv = self
            .stream
            .alloc_zeros::<T>(out.len())
            .map_err(|e| backend(format!("{e:?}")))?;
        let queued = live(slot)
            .and_then(|nccl| op(nccl, &send, &mut recv).map_err(|e| nccl_failed(call, &e)))
            // Before the copy, which would wait for NCCL without a deadline.
            .and_then(|_| self.finish(call));
        // While `send` and `recv` are held: NCCL may still be using them.
        self.aborted_on_error(slot, queued)?;
        self.stream
            .memcpy_dtoh(&recv, out)
            .map_err(|e| backend(format!("{e:?}")))?;
        self.stream
            .synchronize()
            .map_err(|e| backend(format!("{e:?}")))
    }
}

/// The communicator NCCL is bootstrapped over in [`NcclComm::start`]:
/// MPI's world under an MPI launcher, else this process alone.
fn host_for_nccl() -> Result<Box<dyn Communicator>, CommError> {
    Ok(if MpiComm::launched_by_mpirun() {
        Box::new(MpiComm::init()?)
    } else {
        Box::new(SingleRank::new())
    })
}

/// Runs `calls` between `ncclGroupStart` and `ncclGroupEnd`, ending the
/// group on every path and returning the end's error, where grouped
/// point-to-point calls report theirs (cudarc's `Group` unwraps it in its
/// `Drop`: a panic, and an abort while unwinding). A call that failed
/// inside the group leaves the others launched, unmatched on the peers:
/// as after a timeout, the communicator is aborted (`aborted_on_error`)
/// and so is the job.
fn grouped(calls: impl FnOnce() -> Result<(), CommError>) -> Result<(), CommError> {
    group_start().map_err(|e| nccl_failed("ncclGroupStart", &e))?;
    let queued = calls();
    let ended = group_end().map_err(|e| nccl_failed("ncclGroupEnd", &e));
    queued.and(ended.map(drop))
}

impl GpuCollectives for NcclComm {
    unsafe fn allreduce_sum_f32_gpu(&self, send: GpuF32, recv: GpuF32) -> Result<(), CommError> {
        let unfit = (send.len != recv.len)
            .then(|| format!("allreduce on the GPU of {} f32 into {}", send.len, recv.len));
        let bytes = send.len * size_of::<f32>();
        self.on_gpu(
            Collective::Allreduce,
            send.len,
            bytes,
            unfit,
            |nccl, stream| {
                let mut out = Borrowed::<f32>::f32(recv, stream);
                let input = Borrowed::<f32>::f32(send, stream);
                nccl.all_reduce(&input, &mut out, &cudarc::nccl::ReduceOp::Sum)
                    .map(drop)
                    .map_err(|e| nccl_failed("ncclAllReduce", &e))
            },
        )?;
        Ok(())
    }

    unsafe fn all_to_all_gpu(&self, send: GpuBytes, recv: GpuBytes) -> Result<(), CommError> {
        let n = self.world_size();
        let unfit = (send.len != recv.len || !send.len.is_multiple_of(n)).then(|| {
            format!(
                "all-to-all on the GPU of {} bytes into {} among {n} ranks",
                send.len, recv.len
            )
        });
        let c = send.len / n;
        self.on_gpu(
            Collective::AllToAll,
            send.len,
            send.len,
            unfit,
            |nccl, stream| {
                // NCCL has no all-to-all: grouped point-to-point calls, as
                // PyTorch does (and as the host path does).
                grouped(|| {
                    for peer in 0..n {
                        let part = Borrowed::<u8>::bytes(send, peer * c, c, stream);
                        nccl.send(&part, peer as i32)
                            .map_err(|e| nccl_failed("ncclSend", &e))?;
                    }
                    for peer in 0..n {
                        let mut part = Borrowed::<u8>::bytes(recv, peer * c, c, stream);
                        nccl.recv(&mut part, peer as i32)
                            .map_err(|e| nccl_failed("ncclRecv", &e))?;
                    }
                    Ok(())
                })
            },
        )
    }

    unsafe fn all_gather_gpu(&self, send: GpuBytes, recv: GpuBytes) -> Result<(), CommError> {
        let n = self.world_size();
        let unfit = (recv.len != n * send.len).then(|| {
            format!(
                "all-gather on the GPU of {} bytes into {} among {n} ranks",
                send.len, recv.len
            )
        });
        self.on_gpu(
            Collective::AllGather,
            send.len,
            send.len,
            unfit,
            |nccl, stream| {
                let input = Borrowed::<u8>::bytes(send, 0, send.len, stream);
                let mut out = Borrowed::<u8>::bytes(recv, 0, recv.len, stream);
                nccl.all_gather(&input, &mut out)
                    .map(drop)
                    .map_err(|e| nccl_failed("ncclAllGather", &e))
            },
        )
    }
}

impl NcclComm {
    /// Waits for the work queued on this communicator's stream (NCCL's),
    /// polling under the deadline and the stop signal as the MPI waits do:
    /// a peer that never enters the collective (dead, stuck, or stopped)
    /// becomes an error naming `op` instead of a wait in
    /// `cuStreamSynchronize` without end. The NCCL work stays queued after
    /// such an error, still writing its buffers: the callers abort the
    /// communicator before they let go of them (`aborted_on_error`), and
    /// the trainer aborts the job.
    fn finish(&self, op: &'static str) -> Result<(), CommError> {
        let done = self
            .stream
            .record_event(Some(
                cudarc::driver::sys::CUevent_flags::CU_EVENT_DISABLE_TIMING,
            ))
            .map_err(|e| backend(format!("{op}: {e:?}")))?;
        let mut wait = Wait::start(&self.deadline);
        for polled in 0u32.. {
            match done.try_is_complete() {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => return Err(backend(format!("{op}: {e:?}"))),
            }
            if let Some(why) = wait.give_up() {
                return Err(why.error(op, wait.timeout(), Vec::new()));
            }
            // Yield for the first millisecond or so (most collectives end
            // within it), then sleep in steps of 100 µs.
            if polled < 1000 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        unreachable!("the wait returns or gives up")
    }

    /// Runs the NCCL calls `enqueue` makes on this communicator's stream
    /// for a collective of `kind` over `len` elements (`bytes` bytes) of
    /// GPU memory: the cross-rank check first, the stream synchronised
    /// after (the caller reads the output on its own stream next), counted
    /// as the host collective of the same kind and size. `unfit`: why this
    /// rank's buffers do not fit the collective; it still takes part in
    /// the check, as one that called something else, so that the others
    /// return at once instead of waiting for it until the deadline.
    fn on_gpu(
        &self,
        kind: Collective,
        len: usize,
        bytes: usize,
        unfit: Option<String>,
        enqueue: impl FnOnce(&Comm, &Arc<CudaStream>) -> Result<(), CommError>,
    ) -> Result<(), CommError> {
        let start = std::time::Instant::now();
        {
            let mut slot = self.lock();
            live(&slot)?;
            let root = if unfit.is_some() { UNFIT } else { 0 };
            let agreed = self.agree(kind, root, len);
            if let Some(why) = unfit {
                return Err(backend(why));
            }
            agreed?;
            // Nothing to move (an empty SLAMB selection, the self-check's
            // empty lengths): no call, as on the host path; NCCL before
            // 2.12.10 failed zero-byte sends and receives.
            if bytes > 0 {
                // cudarc's NCCL calls do not make the GPU's context current,
                // and this thread may have none (cubecl drives the device
                // from its own thread): NCCL would then queue a world of
                // one's copy on device 0's default stream, and a blocking
                // group would restore device 0 and create a context there
                // in every process.
                self.stream
                    .context()
                    .bind_to_thread()
                    .map_err(|e| backend(format!("binding the GPU's context: {e:?}")))?;
                let queued = live(&slot)
                    .and_then(|nccl| enqueue(nccl, &self.stream))
                    .and_then(|()| self.finish(kind.name()));
                self.aborted_on_error(&mut slot, queued)?;
            }
        }
        record(self, kind, 0, bytes, start);
        Ok(())
    }
}

/// The root a rank passes to the cross-rank check when its buffers do not
/// fit the collective (no rank has that many).
const UNFIT: usize = u32::MAX as usize;

/// A call's `(kind, root)` as the mismatch error names it.
fn describe(header: &[u32]) -> String {
    match Collective::ALL.get(header[0] as usize) {
        Some(kind) if header[1] as usize == UNFIT => {
            format!("{kind} with buffers that do not fit it (that rank's error says how)")
        }
        Some(Collective::Broadcast) => format!("broadcast from rank {}", header[1]),
        Some(kind) => kind.name().to_string(),
        None => format!("an unknown collective (#{})", header[0]),
    }
}

fn len_of(header: &[u32]) -> usize {
    header[2] as usize | ((header[3] as usize) << 32)
}

impl Communicator for NcclComm {
    fn rank(&self) -> usize {
        self.host.rank()
    }

    fn world_size(&self) -> usize {
        self.host.world_size()
    }

    fn backend(&self) -> &'static str {
        "nccl"
    }

    fn meter(&self) -> &TrafficMeter {
        &self.meter
    }

    fn abort(&self, reason: &str) {
        self.host.abort(reason);
    }

    fn set_deadline(&self, timeout: Duration) {
        self.host.set_deadline(timeout);
        self.deadline.set(timeout);
    }

    fn gpu_collectives(&self) -> Option<&dyn GpuCollectives> {
        Some(self)
    }

    fn allreduce_f32_raw(&self, buf: &mut [f32], op: ReduceOp) -> Result<(), CommError> {
        let mut slot = self.lock();
        live(&slot)?;
        self.agree(Collective::Allreduce, 0, buf.len())?;
        if buf.is_empty() {
            // Nothing to move; the driver refuses an allocation of none.
            return Ok(());
        }
        let send = self.upload(buf)?;
        self.on_device(&mut slot, send, buf, "ncclAllReduce", |nccl, send, recv| {
            nccl.all_reduce(send, recv, &cudarc::nccl::ReduceOp::Sum)
        })?;
        if op == ReduceOp::Mean {
            let inv = 1.0 / self.world_size() as f32;
            buf.iter_mut().for_each(|x| *x *= inv);
        }
        Ok(())
    }

    fn broadcast_raw(&self, buf: &mut [u8], width: Width, root: usize) -> Result<(), CommError> {
        let mut slot = self.lock();
        live(&slot)?;
        self.agree(Collective::Broadcast, root, buf.len() / width.bytes())?;
        if buf.is_empty() {
            // Nothing to move; the driver refuses an allocation of none.
            return Ok(());
        }
        let send = self.upload(buf)?;
        self.on_device(&mut slot, send, buf, "ncclBroadcast", |nccl, send, recv| {
            nccl.broadcast(Some(send), recv, root as i32)
        })
    }

    fn all_gather_raw(&self, send: &[u8], recv: &mut [u8], width: Width) -> Result<(), CommError> {
        let mut slot = self.lock();
        live(&slot)?;
        self.agree(Collective::AllGather, 0, send.len() / width.bytes())?;
        if send.is_empty() {
            // Nothing to move; the driver refuses an allocation of none.
            return Ok(());
        }
        let send = self.upload(send)?;
        self.on_device(
            &mut slot,
            send,
            recv,
            "ncclAllGather",
            |nccl, send, recv| nccl.all_gather(send, recv),
        )
    }

    fn all_to_all_raw(&self, send: &[u8], recv: &mut [u8], width: Width) -> Result<(), CommError> {
        let mut slot = self.lock();
        live(&slot)?;
        self.agree(Collective::AllToAll, 0, send.len() / width.bytes())?;
        if send.is_empty() {
            // Nothing to move; the driver refuses an allocation of none.
            return Ok(());
        }
        let n = self.world_size();
        let c = send.len() / n;
        let err = |e| backend(format!("{e:?}"));
        let device_send = self.upload(send)?;
        let mut parts = (0..n)
            .map(|_| self.stream.alloc_zeros::<u8>(c).map_err(err))
            .collect::<Result<Vec<_>, _>>()?;
        // NCCL has no all-to-all: grouped point-to-point calls, as PyTorch
        // does.
        let queued = live(&slot)
            .and_then(|nccl| {
                grouped(|| {
                    for peer in 0..n {
                        nccl.send(&device_send.slice(peer * c..(peer + 1) * c), peer as i32)
                            .map_err(|e| nccl_failed("ncclSend", &e))?;
                    }
                    for (peer, part) in parts.iter_mut().enumerate() {
                        nccl.recv(part, peer as i32)
                            .map_err(|e| nccl_failed("ncclRecv", &e))?;
                    }
                    Ok(())
                })
            })
            .and_then(|()| self.finish("ncclSend/ncclRecv"));
        // While the device buffers are held: NCCL may still be using them.
        self.aborted_on_error(&mut slot, queued)?;
        for (part, out) in parts.iter().zip(recv.chunks_mut(c)) {
            self.stream.memcpy_dtoh(part, out).map_err(err)?;
        }
        self.stream.synchronize().map_err(err)
    }

    fn barrier_raw(&self) -> Result<(), CommError> {
        let _slot = self.lock();
        self.agree(Collective::Barrier, 0, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_check_names_rank_0_s_call_and_a_rank_with_unfit_buffers() {
        let broadcast = [Collective::Broadcast as u32, 2];
        assert_eq!(describe(&broadcast), "broadcast from rank 2");
        assert_eq!(describe(&[Collective::AllGather as u32, 0]), "all_gather");
        assert_eq!(
            describe(&[Collective::AllToAll as u32, UNFIT as u32]),
            "all_to_all with buffers that do not fit it (that rank's error says how)"
        );
        assert_eq!(describe(&[9, 0]), "an unknown collective (#9)");
    }

    #[test]
    fn an_aborted_communicator_refuses_every_call() {
        let error = live(&None).unwrap_err().to_string();
        assert!(
            error.contains("aborted after an earlier collective"),
            "{error}"
        );
    }
}
