//! One API over burn tensors: the same call runs the cubecl kernels on a
//! cubecl device (wgpu, Vulkan; CUDA when burn's `cuda` builds) and the CPU
//! loops on `flex`, reaching the tensors' storage through burn's backend
//! extension API (no copy through host `TensorData` on either).
//!
//! Autodiff-tracked tensors are taken without their graph (`inner`). burn's
//! `fusion` queues a cubecl tensor's operations: [`crate::cube`] runs them
//! and hands over the buffer, and wraps buffers back into tensors.

use burn::backend::flex::FlexTensor;
use burn::backend::wgpu::CubeTensor;
use burn::backend::{DType, Flex, Shape};
use burn::tensor::Tensor;
use cubecl::prelude::*;

use crate::cube;
use crate::device::{self, DeviceCompressed};
use crate::host_reads;
use crate::onebit::{ChunkLayout, Scale, words_for};
use crate::server::Compressed;
use crate::worker::{HostWorker, Worker};

/// Why a tensor cannot be compressed in place.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TensorError {
    /// The tensor is not f32.
    #[error("{what}: expected an f32 tensor, got {dtype}")]
    DType {
        /// Which tensor.
        what: &'static str,
        /// Its dtype.
        dtype: String,
    },
    /// `x` and the error live on different devices or have different lengths.
    #[error("{what}")]
    Mismatch {
        /// What differs.
        what: String,
    },
    /// The tensor's backend has no kernels here.
    #[error("{what}: unsupported backend ({reason})")]
    Backend {
        /// Which tensor.
        what: &'static str,
        /// Why.
        reason: String,
    },
}

/// Where a worker's buffers live. One per worker, moved rarely: the size
/// difference of the variants costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
enum Storage {
    Flex { x: FlexTensor, error: FlexTensor },
    Cube { x: CubeTensor, error: CubeTensor },
}

/// A buffer `x` and its error `e` as burn tensors of one device, for the
/// compressed allreduce ([`Worker`]) or the one-shot [`compress`].
pub struct TensorWorker {
    len: usize,
    storage: Storage,
}

impl TensorWorker {
    /// Takes `x` and `error` (rank-1 f32 tensors of one length on one
    /// device).
    ///
    /// # Errors
    /// Another dtype, a length or device mismatch, or a backend without
    /// kernels.
    pub fn new(x: Tensor<1>, error: Tensor<1>) -> Result<TensorWorker, TensorError> {
        let (x, error) = (x.inner(), error.inner());
        let len = x.dims()[0];
        if error.dims()[0] != len {
            return Err(TensorError::Mismatch {
                what: format!("x has {len} elements, its error {}", error.dims()[0]),
            });
        }
        if x.device() != error.device() {
            return Err(TensorError::Mismatch {
                what: format!(
                    "x is on {:?}, its error on {:?}",
                    x.device(),
                    error.device()
                ),
            });
        }
        for (what, t) in [("x", &x), ("error", &error)] {
            if t.dtype() != DType::F32 {
                return Err(TensorError::DType {
                    what,
                    dtype: format!("{:?}", t.dtype()),
                });
            }
        }
        let storage = match x.clone().try_into_primitive::<Flex>() {
            Ok(x) => Storage::Flex {
                x: contiguous_flex(x),
                error: contiguous_flex(primitive::<Flex>(error, "error")?),
            },
            Err(_) => {
                let x = cube_primitive(x, "x")?;
                let error = cube_primitive(error, "error")?;
                Storage::Cube {
                    x: contiguous_cube(x),
                    error: contiguous_cube(error),
                }
            }
        };
        Ok(TensorWorker { len, storage })
    }

    /// The buffer and its error as tensors again.
    pub fn into_parts(self) -> (Tensor<1>, Tensor<1>) {
        match self.storage {
            Storage::Flex { x, error } => (
                Tensor::from_primitive::<Flex>(x),
                Tensor::from_primitive::<Flex>(error),
            ),
            Storage::Cube { x, error } => (cube::tensor(x), cube::tensor(error)),
        }
    }

    /// Whether the kernels run on a cubecl device (else the CPU loops).
    pub fn on_device(&self) -> bool {
        matches!(self.storage, Storage::Cube { .. })
    }
}

/// The buffer of a tensor on a cubecl device.
fn cube_primitive(t: Tensor<1>, what: &'static str) -> Result<CubeTensor, TensorError> {
    cube::buffer(t).ok_or_else(|| TensorError::Backend {
        what,
        reason: "neither flex nor a cubecl device".into(),
    })
}

fn primitive<B>(t: Tensor<1>, what: &'static str) -> Result<B::FloatTensorPrimitive, TensorError>
where
    B: burn::backend::Backend,
    burn::backend::DispatchTensor: burn::backend::DispatchKindConversion<B>,
{
    t.try_into_primitive::<B>()
        .map_err(|e| TensorError::Backend {
            what,
            reason: format!("{e:?}"),
        })
}

/// The storage of a rank-1 f32 tensor on a cubecl device, contiguous and
/// not shared with any other tensor (copied on the device when it was), so
/// kernels may write it in place; `Ok(None)` for a tensor on flex.
///
/// # Errors
/// Another dtype or rank, or a backend without kernels.
pub fn into_cube_buffer(t: Tensor<1>) -> Result<Option<CubeTensor>, TensorError> {
    Ok(cube_f32(t, "flat buffer")?.map(contiguous_cube))
}

/// The cube tensor of a rank-1 f32 tensor, `None` on flex.
fn cube_f32(t: Tensor<1>, what: &'static str) -> Result<Option<CubeTensor>, TensorError> {
    let t = t.inner();
    if t.dtype() != DType::F32 {
        return Err(TensorError::DType {
            what,
            dtype: format!("{:?}", t.dtype()),
        });
    }
    if t.clone().try_into_primitive::<Flex>().is_ok() {
        return Ok(None);
    }
    cube_primitive(t, what).map(Some)
}

/// The storage of a rank-1 f32 tensor on a cubecl device for kernels to
/// read: contiguous (copied on the device when it was not), shared or not;
/// `Ok(None)` for a tensor on flex. Unlike [`into_cube_buffer`] it copies
/// nothing only because another tensor shares the buffer (a gradient that
/// autodiff also holds, read once into the flat gradient).
///
/// # Errors
/// Another dtype or rank, or a backend without kernels.
pub fn read_cube_buffer(t: Tensor<1>) -> Result<Option<CubeTensor>, TensorError> {
    let t = cube_f32(t, "buffer to read")?;
    Ok(t.map(|t| {
        if t.is_contiguous() {
            t
        } else {
            contiguous_cube(t)
        }
    }))
}

/// The dropout factors of `mask` in `shape`, computed on `device` when it
/// is a cubecl device (`None` otherwise: the caller makes them on the host).
pub fn device_dropout_factors<const D: usize>(
    mask: &terse_compress::dropout::SiteMask,
    shape: Shape,
    device: &burn::tensor::Device,
) -> Option<Tensor<D>> {
    let n = shape.num_elements();
    let empty = Tensor::<1>::empty([n], &device.clone().inner());
    let buffer = contiguous_cube(cube::buffer(empty)?);
    device::dropout_factors(&buffer.client, mask, &buffer.handle, n);
    let factors = cube::tensor::<1>(buffer).reshape(shape);
    // A constant of the autodiff graph when `device` tracks gradients.
    Some(if device.is_autodiff() {
        Tensor::from_inner(factors)
    } else {
        factors
    })
}

/// A flex tensor whose storage is exactly its elements, owned alone (so it
/// can be written in place).
fn contiguous_flex(t: FlexTensor) -> FlexTensor {
    match t.layout().contiguous_offsets() {
        Some((0, end)) if end == t.layout().shape().num_elements() => t,
        _ => {
            let values: Vec<f32> = t.into_data().try_to_vec::<f32>().expect("f32 data");
            FlexTensor::from_data(burn::tensor::TensorData::new(
                values.clone(),
                [values.len()],
            ))
        }
    }
}

/// A cube tensor with a contiguous buffer of exactly its elements that no
/// other tensor shares (so the kernels may write it in place): the tensor
/// itself, or a copy made on the device (through the host only for a
/// strided view, which terse's flat buffers never are).
fn contiguous_cube(t: CubeTensor) -> CubeTensor {
    if t.is_contiguous() && t.is_contiguous_buffer() && t.handle.can_mut() {
        return t;
    }
    let len = t.meta.shape().num_elements();
    if t.is_contiguous() && t.dtype == DType::F32 {
        let handle = device::optim::copied(&t.client, &t.handle, len);
        return CubeTensor::new_contiguous(t.client, t.device, Shape::new([len]), handle, t.dtype);
    }
    let data = cube::tensor::<1>(t.clone()).into_data();
    let bytes = data.as_bytes().to_vec();
    let handle = t.client.create_from_slice(&bytes);
    CubeTensor::new_contiguous(t.client, t.device, Shape::new([len]), handle, DType::F32)
}

impl Worker for TensorWorker {
    fn len(&self) -> usize {
        self.len
    }

    fn compress(
        &mut self,
        layout: ChunkLayout,
        scale: Scale,
        bits: &mut [u32],
        scales: &mut [f32],
    ) {
        match &mut self.storage {
            Storage::Flex { x, error } => {
                let x: &mut [f32] = x.storage_mut();
                let error: &mut [f32] = error.storage_mut();
                HostWorker { x, error }.compress(layout, scale, bits, scales);
            }
            Storage::Cube { x, error } => {
                let client = &x.client;
                let out = DeviceCompressed {
                    bits: client.empty(words_for(self.len).max(1) * 4),
                    scales: client.empty(layout.slots(self.len).max(1) * 4),
                };
                device::compress_chunks(
                    client,
                    &x.handle,
                    &error.handle,
                    self.len,
                    layout,
                    scale,
                    &out,
                );
                if self.len > 0 {
                    bits.copy_from_slice(&host_reads::read_u32(client, out.bits));
                    scales.copy_from_slice(&host_reads::read_f32(client, out.scales));
                }
            }
        }
    }

    fn decompress(&mut self, layout: ChunkLayout, bits: &[u32], scales: &[f32]) {
        match &mut self.storage {
            Storage::Flex { x, error } => {
                let x: &mut [f32] = x.storage_mut();
                let error: &mut [f32] = error.storage_mut();
                HostWorker { x, error }.decompress(layout, bits, scales);
            }
            Storage::Cube { x, .. } => {
                if self.len == 0 {
                    return;
                }
                let client = &x.client;
                let packed = DeviceCompressed {
                    bits: client.create_from_slice(u32::as_bytes(bits)),
                    scales: client.create_from_slice(f32::as_bytes(scales)),
                };
                device::decompress_chunks(client, &packed, self.len, layout, &x.handle);
            }
        }
    }
}

/// Compresses `x` with error feedback in place of `error` (one scale per
/// `block`, as [`crate::onebit::compress`]), on whichever device the tensors
/// live; the packed signs and scales come back to the host.
///
/// # Errors
/// As [`TensorWorker::new`].
pub fn compress(
    x: &Tensor<1>,
    error: &mut Tensor<1>,
    block: usize,
    scale: Scale,
) -> Result<(Vec<u32>, Vec<f32>), TensorError> {
    let len = x.dims()[0];
    let device = error.device();
    let taken = std::mem::replace(error, Tensor::zeros([0], &device));
    let mut worker = match TensorWorker::new(x.clone(), taken.clone()) {
        Ok(worker) => worker,
        Err(e) => {
            *error = taken;
            return Err(e);
        }
    };
    drop(taken);
    let layout = ChunkLayout::whole(len, block);
    let mut bits = vec![0u32; words_for(len)];
    let mut scales = vec![0f32; layout.slots(len)];
    worker.compress(layout, scale, &mut bits, &mut scales);
    *error = worker.into_parts().1;
    Ok((bits, scales))
}

/// Dequantises `len` elements (one scale per `block`) into a new tensor on
/// `device`.
///
/// # Errors
/// As [`TensorWorker::new`].
pub fn decompress(
    packed: Compressed<'_>,
    len: usize,
    block: usize,
    device: &burn::tensor::Device,
) -> Result<Tensor<1>, TensorError> {
    let zeros = || Tensor::<1>::zeros([len], device);
    let mut worker = TensorWorker::new(zeros(), zeros())?;
    worker.decompress(ChunkLayout::whole(len, block), packed.bits, packed.scales);
    Ok(worker.into_parts().0)
}
