//! The cubecl buffer behind a burn tensor on a cubecl device (wgpu, CUDA),
//! and a burn tensor around such a buffer.
//!
//! terse builds burn with `fusion`: a tensor on a cubecl device is then a
//! `FusionTensor`, an id in the fusion server's queue of operations rather
//! than a buffer. [`buffer`] runs what is queued for the tensor and takes
//! its `CubeTensor` out of the server (unshared when this was the tensor's
//! last reference, so kernels may write it in place); [`tensor`] registers
//! a `CubeTensor` with the server as a new tensor, as burn's own
//! `float_from_data` does with an uploaded one.

use burn::backend::fusion::stream::StreamId;
use burn::backend::fusion::{FusionTensor, NoOp, get_client};
use burn::backend::ir::{BackendIr, InitOperationIr, OperationIr, OperationOutput};
use burn::backend::wgpu::{CubeBackend, CubeTensor};
use burn::backend::{Cube, TensorMetadata};
use burn::tensor::Tensor;

/// The primitive of a float tensor on a cubecl device.
type Fused = FusionTensor<<CubeBackend as burn::backend::fusion::FusionBackend>::FusionRuntime>;

/// The `CubeTensor` of `t` (taken without its autodiff graph), `None` when
/// `t` does not live on a cubecl device.
pub fn buffer<const D: usize>(t: Tensor<D>) -> Option<CubeTensor> {
    let fused: Fused = t.inner().try_into_primitive::<Cube>().ok()?;
    let client = fused.client.clone();
    Some(client.resolve_tensor_float::<CubeBackend>(fused))
}

/// `buffer` as a burn tensor of its device, sharing its storage.
pub fn tensor<const D: usize>(buffer: CubeTensor) -> Tensor<D> {
    let client = get_client::<CubeBackend>(&buffer.device);
    let shape = buffer.shape();
    let dtype = buffer.dtype();
    let handle = CubeBackend::float_tensor_handle(buffer);
    let init = InitOperationIr::create(shape, dtype, || client.register_tensor_handle(handle));
    let fused: Fused = client
        .register(
            StreamId::current(),
            OperationIr::Init(init),
            NoOp::<CubeBackend>::new(),
        )
        .output();
    Tensor::from_primitive::<Cube>(fused)
}
