//! [`Borrowed`]: GPU memory of another owner handed to cudarc's NCCL calls.

use std::sync::Arc;

use cudarc::driver::{
    CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop, sys::CUdeviceptr,
};

use crate::{GpuBytes, GpuF32};

/// A buffer of another owner (cubecl's memory pool) at a device address, as
/// cudarc's NCCL calls take one: `len` elements of `T` at `ptr`. The owner
/// has ordered its writes before the call (see
/// [`GpuCollectives`](crate::GpuCollectives)), so
/// nothing waits.
pub(super) struct Borrowed<'a, T> {
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

    pub(super) fn f32(buffer: GpuF32, stream: &'a Arc<CudaStream>) -> Self {
        Borrowed::new(buffer.ptr, buffer.len, stream)
    }

    /// `len` bytes from byte `start` of `buffer`.
    pub(super) fn bytes(
        buffer: GpuBytes,
        start: usize,
        len: usize,
        stream: &'a Arc<CudaStream>,
    ) -> Self {
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
