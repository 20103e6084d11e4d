//! Flat buffers on a cubecl device (burn's wgpu backend: Vulkan, Metal,
//! DX12; CUDA where burn's `cuda` builds): the parameters, the gradient and
//! the optimizer state of a run whose model lives there, so that a step
//! moves nothing to the host but what crosses the network.
//!
//! Every optimizer keeps its state here between steps ([`crate::Flat`]) and
//! copies it to the host only to save a checkpoint.

use burn::backend::Shape;
use burn::backend::wgpu::CubeTensor;
use burn::tensor::{Device, Tensor, TensorData};
use cubecl::prelude::*;
use cubecl::server::Handle;
use terse_comm::{Communicator, GpuCollectives, GpuF32, ReduceOp};
use terse_kernels::cube;
use terse_kernels::device::optim::{self as kernels, DeviceChunks};
use terse_kernels::device::with_cuda_addresses;
use terse_kernels::host_reads;
use terse_kernels::tensor::into_cube_buffer;

use crate::{OptimError, ParamLayout};

/// A rank-1 f32 buffer on a cubecl device, owned alone (kernels write it in
/// place).
///
/// Its storage may be longer than its `len` values: the parameters' buffer
/// is padded to the device's memory alignment
/// ([`DeviceFlat::pad_to_alignment`]) so that the write-back's slices of it
/// are views rather than copies. Kernels read and write the first `len`
/// only; the storage's shape (`tensor`) always matches its whole handle.
#[derive(Clone)]
pub struct DeviceFlat {
    tensor: CubeTensor,
    len: usize,
}

impl std::fmt::Debug for DeviceFlat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceFlat({} f32 on {:?})",
            self.len, self.tensor.device
        )
    }
}

impl DeviceFlat {
    /// The storage of `tensor` (rank 1, f32); `Ok(None)` when it lives on
    /// the CPU backend (flex), whose optimizers step host slices.
    ///
    /// # Errors
    /// Another dtype, or a backend without cubecl kernels.
    pub fn from_tensor(tensor: Tensor<1>) -> Result<Option<Self>, OptimError> {
        let len = tensor.dims()[0];
        let cube = into_cube_buffer(tensor).map_err(|e| OptimError::TensorData {
            path: "flat".to_string(),
            detail: e.to_string(),
        })?;
        Ok(cube.map(|tensor| Self { tensor, len }))
    }

    /// `values` copied to `device`, which must be a cubecl device.
    ///
    /// # Errors
    /// When `device` is not a cubecl device.
    pub fn from_host(values: &[f32], device: &Device) -> Result<Self, OptimError> {
        let tensor =
            Tensor::<1>::from_data(TensorData::new(values.to_vec(), [values.len()]), device);
        Self::from_tensor(tensor)?.ok_or_else(|| OptimError::TensorData {
            path: "flat".to_string(),
            detail: format!("{device:?} is not a cubecl device"),
        })
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A copy made on the device (a buffer taken from a tensor that shares
    /// this one's storage is copied there).
    pub fn device_copy(&self) -> Self {
        Self::from_tensor(self.tensor())
            .ok()
            .flatten()
            .expect("this buffer's own device and dtype")
    }

    /// Waits until the device has finished all work queued so far (for
    /// timing; reading values waits by itself).
    ///
    /// # Panics
    /// When the device reports an error.
    pub fn wait(&self) {
        futures_lite::future::block_on(self.tensor.client.sync()).expect("the device failed");
    }

    /// What the buffer's device holds now, every stream of it: cubecl's
    /// memory pools' live allocations and the pages they reserve (asked of
    /// its memory manager; nothing is read from the device and nothing
    /// waits for it).
    pub fn device_memory(&self) -> cubecl::MemoryUsage {
        self.tensor
            .client
            .memory_report(cubecl::MemoryScope::Device)
            .usage()
    }

    /// A copy of the values on the host.
    pub fn to_host(&self) -> Vec<f32> {
        read_f32(&self.tensor.client, &self.tensor.handle, self.len)
    }

    /// The buffer's `len` values as a burn tensor sharing its storage, or
    /// copied out of a padded storage where burn cannot take that slice as
    /// a view.
    pub fn tensor(&self) -> Tensor<1> {
        let whole = self.storage_tensor();
        if self.storage_len() == self.len {
            whole
        } else {
            whole.slice(0..self.len)
        }
    }

    /// The whole storage, padding included, as a burn tensor sharing it:
    /// slices of it become the model's parameters (views where their start
    /// and length are aligned); a later in-place step changes them too,
    /// which is why the model is rebuilt from it after every step.
    pub(crate) fn storage_tensor(&self) -> Tensor<1> {
        cube::tensor(self.tensor.clone())
    }

    /// The burn device the buffer lives on.
    pub fn device(&self) -> Device {
        self.storage_tensor().device()
    }

    /// f32 in the storage, `len` plus any padding.
    fn storage_len(&self) -> usize {
        self.tensor.meta.shape()[0]
    }

    /// The storage's length made a multiple of the device's memory
    /// alignment (zeros past `len`), where it is not yet: one device copy,
    /// the first time and after a kernel API swapped in an unpadded buffer.
    ///
    /// burn-cubecl slices a buffer without a copy only when the slice's
    /// start and its distance to the buffer's end are both aligned
    /// (`kernel/index/slice.rs`; 512 B on CUDA). A parameter whose offset
    /// and length are aligned is then a view of this buffer: every BERT
    /// parameter before the MLM output bias (30 522 f32).
    pub(crate) fn pad_to_alignment(&mut self) {
        let client = self.tensor.client.clone();
        let align = (client.properties().memory.alignment as usize / size_of::<f32>()).max(1);
        let padded = self.len.div_ceil(align).max(1) * align;
        if self.storage_len() == padded {
            return;
        }
        let storage = client.empty(padded * size_of::<f32>());
        kernels::copy(&client, &self.tensor.handle, &storage, self.len);
        kernels::zero_at(&client, &storage, padded, self.len, padded - self.len);
        self.set_storage(storage);
    }

    /// Swaps the storage for `handle` (at least `len` f32), returning the
    /// old one: moved, not shared, so a kernel API that insists on unshared
    /// storage takes it without a copy.
    pub(crate) fn swap_handle(&mut self, handle: Handle) -> Handle {
        self.set_storage(handle)
    }

    /// `handle` as the storage, its shape its whole length; the old one
    /// returned.
    fn set_storage(&mut self, handle: Handle) -> Handle {
        let floats = handle.size_in_used() as usize / size_of::<f32>();
        let t = &self.tensor;
        let storage = CubeTensor::new_contiguous(
            t.client.clone(),
            t.device.clone(),
            Shape::new([floats]),
            handle,
            t.dtype,
        );
        std::mem::replace(&mut self.tensor, storage).handle
    }

    /// `handle` (`len` f32 on this buffer's device) as a burn tensor.
    pub(crate) fn wrap(&self, handle: Handle, len: usize) -> Tensor<1> {
        let t = &self.tensor;
        cube::tensor(CubeTensor::new_contiguous(
            t.client.clone(),
            t.device.clone(),
            Shape::new([len]),
            handle,
            t.dtype,
        ))
    }

    pub(crate) fn client(&self) -> &Client {
        &self.tensor.client
    }

    pub(crate) fn handle(&self) -> &Handle {
        &self.tensor.handle
    }
}

/// `values` in a new device buffer (one element at least: a zero-sized
/// buffer cannot be bound).
pub(crate) fn upload_f32(client: &Client, values: &[f32]) -> Handle {
    let padded: &[f32] = if values.is_empty() { &[0.0] } else { values };
    client.create_from_slice(f32::as_bytes(padded))
}

pub(crate) fn read_f32(client: &Client, handle: &Handle, len: usize) -> Vec<f32> {
    if len == 0 {
        return Vec::new();
    }
    let mut values = host_reads::read_f32(client, handle.clone());
    values.truncate(len);
    values
}

/// The chunk table of `layout`'s segments, each decaying by `weight_decay`
/// when it decays at all.
pub(crate) fn layout_chunks(
    client: &Client,
    layout: &ParamLayout,
    weight_decay: f32,
) -> DeviceChunks {
    let lens: Vec<usize> = layout.segments().iter().map(|s| s.len).collect();
    let decays: Vec<f32> = layout
        .segments()
        .iter()
        .map(|s| if s.decay { weight_decay } else { 0.0 })
        .collect();
    DeviceChunks::new(client, &lens, &decays)
}

/// The chunk table a rule's device kernels walk, built at its first device
/// step next to `x` and kept in `cache` (the layout and the weight decay
/// never change).
pub(crate) fn chunk_table<'a>(
    cache: &'a mut Option<DeviceChunks>,
    x: &DeviceFlat,
    layout: &ParamLayout,
    weight_decay: f64,
) -> &'a DeviceChunks {
    cache.get_or_insert_with(|| layout_chunks(x.client(), layout, weight_decay as f32))
}

/// The storage of a rank-1 f32 tensor on a cubecl device, owned alone
/// (copied on the device when shared).
///
/// # Panics
/// For a tensor on another backend or of another dtype (callers pass
/// tensors they made on the device).
pub(crate) fn into_handle(t: Tensor<1>) -> Handle {
    into_cube_buffer(t)
        .ok()
        .flatten()
        .expect("an f32 tensor on a cubecl device")
        .handle
}

/// The mean over ranks of the `len` f32 at `handle`, in a new buffer:
/// on the GPU where the communicator reduces GPU memory and the buffer is
/// a CUDA one ([`mean_on_gpu`]), else through the host; `None` on one
/// rank, which has nothing to average and moves nothing.
pub(crate) fn mean_over_ranks(
    comm: &dyn Communicator,
    client: &Client,
    handle: &Handle,
    len: usize,
) -> Result<Option<Handle>, OptimError> {
    if comm.world_size() == 1 {
        return Ok(None);
    }
    if let Some(gpu) = comm.gpu_collectives()
        && let Some(mean) = mean_on_gpu(gpu, comm.world_size(), client, handle, len)?
    {
        return Ok(Some(mean));
    }
    let mut host = read_f32(client, handle, len);
    comm.allreduce_f32(&mut host, ReduceOp::Mean)?;
    Ok(Some(upload_f32(client, &host)))
}

/// The mean over `world` ranks of the `len` f32 at `handle`, summed by
/// `gpu` (NCCL) from the buffer's device address into a new buffer and
/// scaled there by `1/world` (the host path's arithmetic: sum, then one
/// multiplication); `None` when `handle` is not CUDA memory (wgpu), which
/// then goes through the host. The device finishes the kernels that wrote
/// the gradient before NCCL reads it (its stream is not cubecl's), and NCCL
/// has finished writing when the call returns.
pub(crate) fn mean_on_gpu(
    gpu: &dyn GpuCollectives,
    world: usize,
    client: &Client,
    handle: &Handle,
    len: usize,
) -> Result<Option<Handle>, OptimError> {
    let summed = summed_on_gpu(client, handle, len, 1.0 / world as f32, |from, into| {
        // SAFETY: `summed_on_gpu` hands over two live CUDA allocations of
        // at least `len` f32 in the primary context of this process's GPU
        // (the trainer opens the model's device and NCCL's on the same
        // ordinal), held until the closure returns; `into` is new, so
        // nothing else writes it, and every write to `from` has completed.
        unsafe { gpu.allreduce_sum_f32_gpu(GpuF32 { ptr: from, len }, GpuF32 { ptr: into, len }) }
    });
    Ok(summed.transpose()?)
}

/// The `len` f32 at `handle` summed over ranks by `sum(from, into)` (the
/// CUDA addresses of `handle` and of a new buffer, once every kernel
/// queued has completed) and multiplied there by `scale`: the new buffer,
/// or `sum`'s error; `None`, running nothing, when `handle` is not CUDA
/// memory. The one GPU mean of the gradient's allreduce
/// ([`mean_over_ranks`]) and SLAMB's selected values.
pub(crate) fn summed_on_gpu<E>(
    client: &Client,
    handle: &Handle,
    len: usize,
    scale: f32,
    sum: impl FnOnce(u64, u64) -> Result<(), E>,
) -> Option<Result<Handle, E>> {
    let out = client.empty(len.max(1) * size_of::<f32>());
    let summed = with_cuda_addresses(client, &[handle, &out], |at| sum(at[0], at[1]))?;
    Some(summed.map(|()| {
        kernels::scale(client, &out, len, scale);
        out
    }))
}

/// Allreduces a device buffer (a gradient, or SLAMB's parameters) to its
/// mean over ranks through the host, timing the call.
pub(crate) fn allreduce_mean_device(
    comm: &dyn Communicator,
    x: &mut DeviceFlat,
) -> Result<std::time::Duration, OptimError> {
    let start = std::time::Instant::now();
    if let Some(mean) = mean_over_ranks(comm, x.client(), x.handle(), x.len())? {
        x.swap_handle(mean);
    }
    Ok(start.elapsed())
}
