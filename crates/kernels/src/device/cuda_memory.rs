//! The device addresses of cubecl buffers on CUDA, for a communicator that
//! moves GPU memory itself (NCCL, on its own stream).

use cubecl::prelude::*;
use cubecl::server::{Handle, ServerError};
use cubecl_runtime::server::ServerStorage;
use cubecl_runtime::storage::{ComputeStorage, ManagedResource};

/// cubecl's CUDA server: what a buffer's device address is asked of.
type CudaServer = <cubecl::cuda::CudaRuntime as cubecl_runtime::runtime::Runtime>::Server;

/// A CUDA buffer as cubecl hands it out: its device address, and the
/// stream the asking thread's kernels are queued on (`vendor/cubecl-cuda`'s
/// patch). Its allocation stays in place while this is held.
pub(crate) type CudaBuffer =
    ManagedResource<<<CudaServer as ServerStorage>::Storage as ComputeStorage>::Resource>;

/// `handle`'s buffer as CUDA memory: `None` when it is another runtime's
/// (a wgpu device's), the server's error when cubecl cannot hand it out (a
/// failed kernel was to write it, or its allocation failed).
pub(crate) fn cuda_buffer(
    client: &Client,
    handle: &Handle,
) -> Result<Option<CudaBuffer>, ServerError> {
    match client.get_resource::<CudaServer>(handle.clone()) {
        Ok(buffer) => Ok(Some(buffer)),
        Err(ServerError::ServiceMismatch { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Runs `use_addresses` with the device addresses (`CUdeviceptr`s) of
/// `handles`, in order, once every kernel queued on `client` has completed
/// (the other stream then reads what they wrote), and returns its result;
/// `None`, without running it, when the buffers are not CUDA memory (a
/// wgpu device). The allocations stay where they are until it returns.
///
/// # Panics
/// When cubecl cannot hand out a CUDA buffer (its allocation failed, or a
/// failed kernel was to write it): as the device's failure in the wait
/// below, not a quiet fall back to the host path, which the other ranks
/// would meet as a mismatched exchange.
pub fn with_cuda_addresses<R>(
    client: &Client,
    handles: &[&Handle],
    use_addresses: impl FnOnce(&[u64]) -> R,
) -> Option<R> {
    // A buffer of another runtime is refused here, before anything waits.
    let mut resources = Vec::with_capacity(handles.len());
    for handle in handles {
        match cuda_buffer(client, handle) {
            Ok(Some(resource)) => resources.push(resource),
            Ok(None) => return None,
            Err(e) => panic!("the device could not hand out a CUDA buffer: {e}"),
        }
    }
    futures_lite::future::block_on(client.sync()).expect("the device failed");
    let addresses: Vec<u64> = resources.iter().map(|r| r.resource().ptr).collect();
    let out = use_addresses(&addresses);
    drop(resources);
    Some(out)
}
