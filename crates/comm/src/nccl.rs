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

use cudarc::driver::{
    CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, DeviceSlice,
    SyncOnDrop, ValidAsZeroBits, sys::CUdeviceptr,
};
use cudarc::nccl::result::NcclError;
use cudarc::nccl::{Comm, Id, NcclType, group_end, group_start};

mod failure;
mod gpu_buffers_check;
mod libraries;

pub use libraries::missing_libraries;

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
    nccl: Comm,
    stream: Arc<CudaStream>,
    host: Box<dyn Communicator>,
    meter: TrafficMeter,
    calls: Mutex<()>,
    /// How long a wait for NCCL's work may take (the host part has its
    /// own, set together by [`Communicator::set_deadline`]).
    deadline: Deadline,
}

// SAFETY: every NCCL and CUDA call goes through the `calls` mutex, and the
// stream is only used under it.
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
                nccl,
                stream,
                host,
                meter: TrafficMeter::default(),
                calls: Mutex::new(()),
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

    fn lock(&self) -> MutexGuard<'_, ()> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner())
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
                    expected: format!("{kind} (root {})", all[1]),
                    rank,
                    actual: format!("collective #{} (root {})", theirs[0], theirs[1]),
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

    /// Runs the NCCL call `op` (named `call` in its error) from `send` into
    /// a new device buffer as long as `out`, and copies that into `out`.
    fn on_device<T: DeviceRepr + ValidAsZeroBits + NcclType + Copy, R>(
        &self,
        send: CudaSlice<T>,
        out: &mut [T],
        call: &'static str,
        op: impl FnOnce(&Comm, &CudaSlice<T>, &mut CudaSlice<T>) -> Result<R, NcclError>,
    ) -> Result<(), CommError> {
        let mut recv = self
            .stream
            .alloc_zeros::<T>(out.len())
            .map_err(|e| backend(format!("{e:?}")))?;
        op(&self.nccl, &send, &mut recv).map_err(|e| nccl_failed(call, &e))?;
        // Before the copy, which would wait for NCCL without a deadline.
        self.finish(call)?;
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
/// as after a timeout, the job is to be aborted.
fn grouped(calls: impl FnOnce() -> Result<(), CommError>) -> Result<(), CommError> {
    group_start().map_err(|e| nccl_failed("ncclGroupStart", &e))?;
    let queued = calls();
    let ended = group_end().map_err(|e| nccl_failed("ncclGroupEnd", &e));
    queued.and(ended.map(drop))
}

/// A buffer of another owner (cubecl's memory pool) at a device address, as
/// cudarc's NCCL calls take one: `len` elements of `T` at `ptr`. The owner
/// has ordered its writes before the call (see [`GpuCollectives`]), so
/// nothing waits.
struct Borrowed<'a, T> {
    ptr: u64,
    len: usize,
    stream: &'a Arc<CudaStream>,
    element: std::marker::PhantomData<T>,
}

impl<'a, T> Borrowed<'a, T> {
    fn new(ptr: u64, len: usize, stream: &'a Arc<CudaStream>) -> Self {
        Borrowed {
            ptr,
            len,
            stream,
            element: std::marker::PhantomData,
        }
    }

    fn f32(buffer: GpuF32, stream: &'a Arc<CudaStream>) -> Self {
        Borrowed::new(buffer.ptr, buffer.len, stream)
    }

    /// `len` bytes from byte `start` of `buffer`.
    fn bytes(buffer: GpuBytes, start: usize, len: usize, stream: &'a Arc<CudaStream>) -> Self {
        Borrowed::new(buffer.ptr + start as u64, len, stream)
    }
}

impl<T> DeviceSlice<T> for Borrowed<'_, T> {
    fn len(&self) -> usize {
        self.len
    }

    fn stream(&self) -> &Arc<CudaStream> {
        self.stream
    }
}

impl<T> DevicePtr<T> for Borrowed<'_, T> {
    fn device_ptr<'a>(&'a self, _stream: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        (self.ptr, SyncOnDrop::Sync(None))
    }
}

impl<T> DevicePtrMut<T> for Borrowed<'_, T> {
    fn device_ptr_mut<'a>(&'a mut self, _stream: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        (self.ptr, SyncOnDrop::Sync(None))
    }
}

impl GpuCollectives for NcclComm {
    unsafe fn allreduce_sum_f32_gpu(&self, send: GpuF32, recv: GpuF32) -> Result<(), CommError> {
        if send.len != recv.len {
            return Err(backend(format!(
                "allreduce on the GPU of {} f32 into {}",
                send.len, recv.len
            )));
        }
        let bytes = send.len * size_of::<f32>();
        self.on_gpu(Collective::Allreduce, send.len, bytes, |stream| {
            let mut out = Borrowed::<f32>::f32(recv, stream);
            let input = Borrowed::<f32>::f32(send, stream);
            self.nccl
                .all_reduce(&input, &mut out, &cudarc::nccl::ReduceOp::Sum)
                .map(drop)
                .map_err(|e| nccl_failed("ncclAllReduce", &e))
        })?;
        Ok(())
    }

    unsafe fn all_to_all_gpu(&self, send: GpuBytes, recv: GpuBytes) -> Result<(), CommError> {
        let n = self.world_size();
        if send.len != recv.len || !send.len.is_multiple_of(n) {
            return Err(backend(format!(
                "all-to-all on the GPU of {} bytes into {} among {n} ranks",
                send.len, recv.len
            )));
        }
        let c = send.len / n;
        self.on_gpu(Collective::AllToAll, send.len, send.len, |stream| {
            // NCCL has no all-to-all: grouped point-to-point calls, as
            // PyTorch does (and as the host path does).
            grouped(|| {
                for peer in 0..n {
                    let part = Borrowed::<u8>::bytes(send, peer * c, c, stream);
                    self.nccl
                        .send(&part, peer as i32)
                        .map_err(|e| nccl_failed("ncclSend", &e))?;
                }
                for peer in 0..n {
                    let mut part = Borrowed::<u8>::bytes(recv, peer * c, c, stream);
                    self.nccl
                        .recv(&mut part, peer as i32)
                        .map_err(|e| nccl_failed("ncclRecv", &e))?;
                }
                Ok(())
            })
        })
    }

    unsafe fn all_gather_gpu(&self, send: GpuBytes, recv: GpuBytes) -> Result<(), CommError> {
        let n = self.world_size();
        if recv.len != n * send.len {
            return Err(backend(format!(
                "all-gather on the GPU of {} bytes into {} among {n} ranks",
                send.len, recv.len
            )));
        }
        self.on_gpu(Collective::AllGather, send.len, send.len, |stream| {
            let input = Borrowed::<u8>::bytes(send, 0, send.len, stream);
            let mut out = Borrowed::<u8>::bytes(recv, 0, recv.len, stream);
            self.nccl
                .all_gather(&input, &mut out)
                .map(drop)
                .map_err(|e| nccl_failed("ncclAllGather", &e))
        })
    }
}

impl NcclComm {
    /// Waits for the work queued on this communicator's stream (NCCL's),
    /// polling under the deadline and the stop signal as the MPI waits do:
    /// a peer that never enters the collective (dead, stuck, or stopped)
    /// becomes an error naming `op` instead of a wait in
    /// `cuStreamSynchronize` without end. The NCCL work stays queued after
    /// such an error, still writing its buffers: the communicator is not
    /// to be used again, and the trainer aborts the job.
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
    /// as the host collective of the same kind and size.
    fn on_gpu(
        &self,
        kind: Collective,
        len: usize,
        bytes: usize,
        enqueue: impl FnOnce(&Arc<CudaStream>) -> Result<(), CommError>,
    ) -> Result<(), CommError> {
        let start = std::time::Instant::now();
        {
            let _calls = self.lock();
            self.agree(kind, 0, len)?;
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
                enqueue(&self.stream)?;
                self.finish(kind.name())?;
            }
        }
        record(self, kind, 0, bytes, start);
        Ok(())
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
        let _calls = self.lock();
        self.agree(Collective::Allreduce, 0, buf.len())?;
        if buf.is_empty() {
            // Nothing to move; the driver refuses an allocation of none.
            return Ok(());
        }
        let send = self.upload(buf)?;
        self.on_device(send, buf, "ncclAllReduce", |nccl, send, recv| {
            nccl.all_reduce(send, recv, &cudarc::nccl::ReduceOp::Sum)
        })?;
        if op == ReduceOp::Mean {
            let inv = 1.0 / self.world_size() as f32;
            buf.iter_mut().for_each(|x| *x *= inv);
        }
        Ok(())
    }

    fn broadcast_raw(&self, buf: &mut [u8], width: Width, root: usize) -> Result<(), CommError> {
        let _calls = self.lock();
        self.agree(Collective::Broadcast, root, buf.len() / width.bytes())?;
        if buf.is_empty() {
            // Nothing to move; the driver refuses an allocation of none.
            return Ok(());
        }
        let send = self.upload(buf)?;
        self.on_device(send, buf, "ncclBroadcast", |nccl, send, recv| {
            nccl.broadcast(Some(send), recv, root as i32)
        })
    }

    fn all_gather_raw(&self, send: &[u8], recv: &mut [u8], width: Width) -> Result<(), CommError> {
        let _calls = self.lock();
        self.agree(Collective::AllGather, 0, send.len() / width.bytes())?;
        if send.is_empty() {
            // Nothing to move; the driver refuses an allocation of none.
            return Ok(());
        }
        let send = self.upload(send)?;
        self.on_device(send, recv, "ncclAllGather", |nccl, send, recv| {
            nccl.all_gather(send, recv)
        })
    }

    fn all_to_all_raw(&self, send: &[u8], recv: &mut [u8], width: Width) -> Result<(), CommError> {
        let _calls = self.lock();
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
        grouped(|| {
            for peer in 0..n {
                self.nccl
                    .send(&device_send.slice(peer * c..(peer + 1) * c), peer as i32)
                    .map_err(|e| nccl_failed("ncclSend", &e))?;
            }
            for (peer, part) in parts.iter_mut().enumerate() {
                self.nccl
                    .recv(part, peer as i32)
                    .map_err(|e| nccl_failed("ncclRecv", &e))?;
            }
            Ok(())
        })?;
        self.finish("ncclSend/ncclRecv")?;
        for (part, out) in parts.iter().zip(recv.chunks_mut(c)) {
            self.stream.memcpy_dtoh(part, out).map_err(err)?;
        }
        self.stream.synchronize().map_err(err)
    }

    fn barrier_raw(&self) -> Result<(), CommError> {
        let _calls = self.lock();
        self.agree(Collective::Barrier, 0, 0)
    }
}
