//! The device addresses of cubecl buffers on CUDA, for a communicator that
//! moves GPU memory itself (NCCL, on its own stream).

use cubecl::prelude::*;
use cubecl::server::{Handle, ServerError};

/// cubecl's CUDA server: what a buffer's device address is asked of.
pub(crate) type CudaServer =
    <cubecl::cuda::CudaRuntime as cubecl_runtime::runtime::Runtime>::Server;

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
        match client.get_resource::<CudaServer>((*handle).clone()) {
            Ok(resource) => resources.push(resource),
            Err(ServerError::ServiceMismatch { .. }) => return None,
            Err(e) => panic!("the device could not hand out a CUDA buffer: {e}"),
        }
    }
    futures_lite::future::block_on(client.sync()).expect("the device failed");
    let addresses: Vec<u64> = resources.iter().map(|r| r.resource().ptr).collect();
    let out = use_addresses(&addresses);
    drop(resources);
    Some(out)
}
