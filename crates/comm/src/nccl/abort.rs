//! What follows a failure of NCCL work already queued: the communicator
//! aborted before the buffers that work may still use are let go, within a
//! bound, and every later call refused (see `NcclComm`'s `nccl` field).

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cudarc::nccl::Comm;

use super::{NcclComm, backend};
use crate::CommError;

/// How long aborting NCCL's communicator after a failure may take before
/// the job is aborted through the host communicator.
const ABORT_LIMIT: Duration = Duration::from_secs(60);

impl NcclComm {
    /// `result` of NCCL work queued under `slot`; on an error the
    /// communicator is aborted first (see the `nccl` field).
    pub(super) fn aborted_on_error<R>(
        &self,
        slot: &mut Option<Comm>,
        result: Result<R, CommError>,
    ) -> Result<R, CommError> {
        if let Err(e) = &result {
            let comm = slot.take();
            // ncclCommAbort can block when a peer never aborts (a rank
            // that never came: NVIDIA/nccl#863), and the drain behind it
            // with it; the job is ending anyway, so past ABORT_LIMIT it is
            // ended through the host communicator instead of left hanging.
            let done = AtomicBool::new(false);
            std::thread::scope(|scope| {
                scope.spawn(|| {
                    let started = std::time::Instant::now();
                    while !done.load(Ordering::Acquire) {
                        if started.elapsed() >= ABORT_LIMIT {
                            self.host.abort(&format!(
                                "aborting NCCL's communicator after `{e}` did not end within {} s",
                                ABORT_LIMIT.as_secs()
                            ));
                            return;
                        }
                        std::thread::sleep(Duration::from_millis(50));
                    }
                });
                // cudarc's Drop for Comm panics when ncclCommAbort fails
                // (after a sticky CUDA error): the error returned says
                // more than that panic would.
                let aborted = std::panic::catch_unwind(AssertUnwindSafe(|| drop(comm)));
                if aborted.is_err() {
                    tracing::warn!("ncclCommAbort failed after `{e}`");
                }
                // The aborted kernels end; what remains queued is the
                // caller's own copies. An error here adds nothing to the
                // one returned.
                let _ = self.stream.synchronize();
                done.store(true, Ordering::Release);
            });
        }
        result
    }
}

/// A live communicator, or the refusal of a call after an abort.
pub(super) fn live(slot: &Option<Comm>) -> Result<&Comm, CommError> {
    slot.as_ref().ok_or_else(|| {
        backend(
            "NCCL's communicator was aborted after an earlier collective failed or timed out \
             on this rank; the job has to be restarted",
        )
    })
}

impl Drop for NcclComm {
    /// cudarc's `Drop` for `Comm` aborts it (`ncclCommAbort`), where
    /// NCCL's graceful end (`ncclCommFinalize`) would first flush what its
    /// proxy still sends: a rank's last kernel can end while its last
    /// chunk is still on the way to a slower peer, which would then never
    /// get it. Every rank's collectives end with their kernels done
    /// (`finish`), so once all ranks are past a host barrier every
    /// transfer has arrived and the abort cuts nothing off. Not after a
    /// failure: that communicator is aborted already, and its job too.
    fn drop(&mut self) {
        let live = self
            .nccl
            .get_mut()
            .map_or_else(|p| p.get_ref().is_some(), |slot| slot.is_some());
        if live && self.host.world_size() > 1 {
            let _ = self.host.barrier();
        }
        // cudarc's Drop for Comm panics when ncclCommAbort fails (after a
        // sticky CUDA error): a finished run would end in a panic's
        // status 101, so the abort's failure is a warning here.
        let comm = match self.nccl.get_mut() {
            Ok(slot) => slot.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        if let Some(comm) = comm
            && std::panic::catch_unwind(AssertUnwindSafe(|| drop(comm))).is_err()
        {
            tracing::warn!("ncclCommAbort failed as the NCCL communicator was closed");
        }
    }
}
