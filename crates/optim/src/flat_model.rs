//! [`FlatModel`]: the one owner of the module ↔ flat-buffer mapping. The
//! optimizer sees a module as one flat vector of its trainable parameters
//! in a [`ParamLayout`]'s order, and one gradient vector beside it; this
//! type holds both with their layout, gathers the parameters once (again
//! only when a checkpoint replaced them), adds each backward pass's
//! gradients into the gradient, steps the optimizer and writes the stepped
//! parameters back into the module. The trainer, the benchmarks and the
//! tests all go through it.
//!
//! Both vectors live on the host, or — for a module on a cubecl device
//! (wgpu, cuda) — on that device: there each gradient is written into its
//! range of the flat gradient in place (no gradient-sized buffer made per
//! step), the optimizer steps device buffers, and the module's parameters
//! become slices of the flat parameter buffer, so no full-parameter vector
//! crosses to the host.

use std::sync::{Arc, Mutex};

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::{Gradients, Tensor, TensorData};
use cubecl::server::Handle;
use terse_comm::Communicator;

use crate::device_flat::{layout_chunks, mean_over_ranks, read_f32};
use crate::gather::{
    add_grads_to_host, check_layout, copy_to_uninit, gather_params, params_device, tensor_to_host,
    write_back_host, write_back_slices,
};
use crate::layout::is_trainable;
use crate::step::CommTime;
use terse_kernels::device::optim::{self as kernels, DeviceChunks};
use terse_kernels::tensor::read_cube_buffer;

use crate::{DeviceFlat, OptimError, Optimizer, ParamLayout, StepReport};

/// Where the two vectors live. One per model, moved rarely: the size
/// difference of the variants costs nothing worth a box.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)]
enum Storage {
    Host {
        params: Vec<f32>,
        grad: Vec<f32>,
    },
    Device {
        params: DeviceFlat,
        grad: DeviceFlat,
        /// One chunk table per layout for the gradient's reductions.
        chunks: DeviceChunks,
    },
}

/// A module's trainable parameters and gradient as flat vectors.
#[derive(Debug, Clone)]
pub struct FlatModel {
    layout: ParamLayout,
    storage: Storage,
}

/// A gradient's sum of squares, queued by
/// [`FlatModel::queue_grad_sum_of_squares`] and read by
/// [`FlatModel::read_squares`].
#[derive(Debug)]
#[must_use = "the sum is only queued, not read"]
pub struct QueuedSquares(Queued);

impl QueuedSquares {
    /// A sum already on the host.
    pub fn ready(sum: f64) -> Self {
        Self(Queued::Ready(sum))
    }
}

#[derive(Debug)]
enum Queued {
    Ready(f64),
    Device(kernels::QueuedSums),
    /// One f32 on the device: the mean over ranks of the squared norms
    /// ([`FlatModel::clip_grad_on_device`]).
    Mean(Handle),
}

impl FlatModel {
    /// The trainable parameters of `module`, gathered to the host in its
    /// own layout, with a zero gradient.
    pub fn gather<M: Module>(module: &M) -> Result<Self, OptimError> {
        let layout = ParamLayout::from_module(module);
        let params = tensor_to_host(gather_params(&layout, module)?)?;
        let grad = vec![0.0; layout.len()];
        Ok(Self {
            layout,
            storage: Storage::Host { params, grad },
        })
    }

    /// [`FlatModel::gather`], but kept on the module's device when that is
    /// a cubecl device (where every optimizer steps); on the host otherwise.
    pub fn gather_on_device<M: Module>(module: &M) -> Result<Self, OptimError> {
        let layout = ParamLayout::from_module(module);
        let gathered = gather_params(&layout, module)?;
        let device = gathered.device();
        let Some(mut params) = DeviceFlat::from_tensor(gathered.clone())? else {
            return Ok(Self {
                storage: Storage::Host {
                    params: tensor_to_host(gathered)?,
                    grad: vec![0.0; layout.len()],
                },
                layout,
            });
        };
        params.pad_to_alignment();
        let grad = DeviceFlat::from_tensor(Tensor::zeros([layout.len()], &device))?
            .expect("the parameters' device");
        let chunks = layout_chunks(params.client(), &layout, 0.0);
        Ok(Self {
            layout,
            storage: Storage::Device {
                params,
                grad,
                chunks,
            },
        })
    }

    /// Gathers the parameters of `module` again (a checkpoint replaced
    /// them); it must have this layout.
    pub fn regather<M: Module>(&mut self, module: &M) -> Result<(), OptimError> {
        let gathered = gather_params(&self.layout, module)?;
        match &mut self.storage {
            Storage::Host { params, .. } => *params = tensor_to_host(gathered)?,
            Storage::Device { params, .. } => {
                *params =
                    DeviceFlat::from_tensor(gathered)?.ok_or_else(|| OptimError::TensorData {
                        path: "flat".to_string(),
                        detail: "the module moved off the device of its flat buffers".to_string(),
                    })?;
                params.pad_to_alignment();
            }
        }
        Ok(())
    }

    /// The parameters' order, shapes and segments.
    pub fn layout(&self) -> &ParamLayout {
        &self.layout
    }

    /// The parameters on the host, in layout order (`None` on a device:
    /// see [`FlatModel::params_to_host`]).
    pub fn params(&self) -> Option<&[f32]> {
        match &self.storage {
            Storage::Host { params, .. } => Some(params),
            Storage::Device { .. } => None,
        }
    }

    /// On a cubecl device, what that device's memory holds now
    /// ([`DeviceFlat::device_memory`]); `None` on the host.
    pub fn device_memory(&self) -> Option<cubecl::MemoryUsage> {
        match &self.storage {
            Storage::Host { .. } => None,
            Storage::Device { params, .. } => Some(params.device_memory()),
        }
    }

    /// The parameters on the host, to set in place (`None` on a device).
    pub fn params_mut(&mut self) -> Option<&mut [f32]> {
        match &mut self.storage {
            Storage::Host { params, .. } => Some(params),
            Storage::Device { .. } => None,
        }
    }

    /// The gradient on the host, in layout order (`None` on a device).
    pub fn grad(&self) -> Option<&[f32]> {
        match &self.storage {
            Storage::Host { grad, .. } => Some(grad),
            Storage::Device { .. } => None,
        }
    }

    /// A copy of the parameters on the host, wherever they live.
    pub fn params_to_host(&self) -> Vec<f32> {
        match &self.storage {
            Storage::Host { params, .. } => params.clone(),
            Storage::Device { params, .. } => params.to_host(),
        }
    }

    /// A copy of the gradient on the host, wherever it lives.
    pub fn grad_to_host(&self) -> Vec<f32> {
        match &self.storage {
            Storage::Host { grad, .. } => grad.clone(),
            Storage::Device { grad, .. } => grad.to_host(),
        }
    }

    /// The gradient's sum of squares (f64 over fixed chunks: the same
    /// result on any number of threads).
    pub fn grad_sum_of_squares(&self) -> f64 {
        self.read_squares(self.queue_grad_sum_of_squares())
    }

    /// [`FlatModel::grad_sum_of_squares`] of the gradient as it is now,
    /// read later with [`FlatModel::read_squares`]: on a device its chunks'
    /// sums are queued there, so the host goes on queueing the step's work
    /// instead of waiting for the device (the trainer reads the norm it
    /// only logs after the update is queued). Host storage sums at once.
    pub fn queue_grad_sum_of_squares(&self) -> QueuedSquares {
        match &self.storage {
            Storage::Host { grad, .. } => QueuedSquares(Queued::Ready(crate::sum_of_squares(grad))),
            Storage::Device { grad, chunks, .. } => QueuedSquares(Queued::Device(
                kernels::queue_sum_of_squares(grad.client(), chunks, grad.handle()),
            )),
        }
    }

    /// The sum `queued` stands for (on a device: waits for it).
    pub fn read_squares(&self, queued: QueuedSquares) -> f64 {
        match (queued.0, &self.storage) {
            (Queued::Ready(sum), _) => sum,
            (Queued::Device(sums), Storage::Device { grad, chunks, .. }) => {
                sums.read(grad.client(), chunks).iter().sum()
            }
            (Queued::Mean(mean), Storage::Device { grad, .. }) => {
                f64::from(read_f32(grad.client(), &mean, 1)[0])
            }
            (Queued::Device(_) | Queued::Mean(_), Storage::Host { .. }) => {
                unreachable!("a device sum queued by a model on the host")
            }
        }
    }

    /// Global-norm clipping on the device (`None` for a model on the
    /// host, which clips on the host): the gradient's squared norm summed
    /// there, averaged over ranks (on the GPU with NCCL, else through the
    /// host: the network's read), and the gradient scaled by `max_norm /
    /// norm` there where the norm exceeds `max_norm`, with no read. Returns
    /// the ranks' mean squared norm, queued; `read_squares` gives it.
    pub fn clip_grad_on_device(
        &mut self,
        comm: &dyn Communicator,
        max_norm: f64,
    ) -> Result<Option<QueuedSquares>, OptimError> {
        let Storage::Device { grad, chunks, .. } = &self.storage else {
            return Ok(None);
        };
        let client = grad.client();
        let local =
            kernels::queue_sum_of_squares(client, chunks, grad.handle()).total(client, chunks);
        let mean = mean_over_ranks(comm, client, &local, 1)?.unwrap_or(local);
        kernels::clip_to_norm(client, grad.handle(), grad.len(), &mean, max_norm as f32);
        Ok(Some(QueuedSquares(Queued::Mean(mean))))
    }

    /// Multiplies the gradient by `factor` in place (micro-batch averaging,
    /// clipping).
    pub fn scale_grad(&mut self, factor: f32) {
        match &mut self.storage {
            Storage::Host { grad, .. } => grad.iter_mut().for_each(|g| *g *= factor),
            Storage::Device { grad, .. } => {
                kernels::scale(grad.client(), grad.handle(), grad.len(), factor)
            }
        }
    }

    /// Adds the gradients of `module`'s parameters out of `grads` into the
    /// gradient; `first` overwrites it instead (the first micro-batch of a
    /// step). A parameter the loss did not reach adds zeros.
    pub fn add_grads<M: Module>(
        &mut self,
        module: &M,
        grads: &mut Gradients,
        first: bool,
    ) -> Result<(), OptimError> {
        match &mut self.storage {
            Storage::Host { grad, .. } => {
                add_grads_to_host(&self.layout, module, grads, grad, first)
            }
            Storage::Device { grad, .. } => {
                check_layout(&self.layout, module)?;
                let mut visitor = DeviceGrads {
                    grads,
                    flat: grad,
                    offset: 0,
                    first,
                    parts: Vec::new(),
                    error: None,
                };
                module.visit(&mut visitor);
                if let Some(e) = visitor.error {
                    return Err(e);
                }
                let (client, flat) = (grad.client(), grad.handle());
                kernels::gather_at(client, &visitor.parts, flat, grad.len(), !first);
                Ok(())
            }
        }
    }

    /// One optimizer step on the flat vectors, wherever they live.
    pub fn step(
        &mut self,
        optimizer: &mut Optimizer,
        comm: &dyn Communicator,
    ) -> Result<StepReport, OptimError> {
        match &mut self.storage {
            Storage::Host { params, grad } => optimizer.step_flat(params, grad, comm),
            Storage::Device { params, grad, .. } => {
                let report = optimizer.step_device(params, grad, comm);
                // A rule that averaged the parameters got a new, unpadded
                // buffer back; the write-back needs the padding.
                params.pad_to_alignment();
                report
            }
        }
    }

    /// Ends a run ([`Optimizer::finish_flat`]); returns the time spent
    /// communicating.
    pub fn finish(&mut self, optimizer: &mut Optimizer, comm: &dyn Communicator) -> CommTime {
        match &mut self.storage {
            Storage::Host { params, .. } => optimizer.finish_flat(params, comm),
            Storage::Device { params, .. } => optimizer.finish_device(params, comm),
        }
    }

    /// [`FlatModel::write_into`] on every rank at once (a collective), for
    /// parameters that are the same bits on every rank
    /// ([`Optimizer::params_replicated`]). Ranks that are threads of one
    /// process then share one copy: each copies its share of the vector
    /// into one new buffer, rank 0 makes it a tensor, and every rank's
    /// parameters become slices of that. Each rank copying the whole vector
    /// into its own module cost BERT-Tiny on 4 local ranks ~4 ms of a
    /// ~80 ms step on every rank. Where ranks cannot share memory (`mpi`,
    /// one rank, a device-resident vector), the same as `write_into`.
    pub fn write_into_replicated<M: Module>(
        &self,
        module: M,
        comm: &dyn Communicator,
    ) -> Result<M, OptimError> {
        let Storage::Host { params, .. } = &self.storage else {
            return self.write_into(module);
        };
        // The same on every rank (the same module), so all or none hand out.
        let Some(device) = params_device(&module) else {
            return self.write_into(module);
        };
        let len = params.len();
        let Some(fill) = comm.hand_out(&mut || Arc::new(SharedFill::new(len)))? else {
            return self.write_into(module);
        };
        let fill = fill
            .downcast_ref::<SharedFill>()
            .expect("rank 0 hands out the buffer to fill");
        let (rank, world) = (comm.rank(), comm.world_size());
        let mine = rank * len / world..(rank + 1) * len / world;
        // SAFETY: the ranges of the ranks are disjoint and within the
        // buffer's capacity; nobody reads the buffer before the barrier.
        unsafe { fill.write(mine.clone(), &params[mine]) };
        comm.barrier()?;
        let handed = comm.hand_out(&mut || {
            // SAFETY: every rank wrote its range before the barrier, and
            // the ranges cover the buffer.
            let values = unsafe { fill.take_filled(len) };
            let flat = Tensor::<1>::from_data(TensorData::new(values, [len]), &device);
            Arc::new(Mutex::new(flat))
        })?;
        let flat = handed
            .as_ref()
            .and_then(|h| h.downcast_ref::<Mutex<Tensor<1>>>())
            .expect("rank 0 hands out the parameter tensor")
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        write_back_slices(&self.layout, module, &flat)
    }

    /// Writes the parameters into `module`: on the host each a fresh tensor
    /// on the device of the parameter it replaces; on a device each a
    /// slice of the flat parameter buffer. Ids and autodiff settings are
    /// kept.
    pub fn write_into<M: Module>(&self, module: M) -> Result<M, OptimError> {
        match &self.storage {
            Storage::Host { params, .. } => write_back_host(&self.layout, module, params),
            Storage::Device { params, .. } => {
                write_back_slices(&self.layout, module, &params.storage_tensor())
            }
        }
    }
}

/// One new f32 buffer that the ranks of one process fill together, each
/// its own range, through a pointer every rank holds
/// ([`FlatModel::write_into_replicated`]).
struct SharedFill {
    /// The start of `buffer`'s allocation, which never moves or grows.
    start: *mut f32,
    capacity: usize,
    buffer: Mutex<Option<Vec<f32>>>,
}

// SAFETY: the pointer is only written through in disjoint ranges (one per
// rank) before a barrier, and the buffer taken out only after it.
unsafe impl Send for SharedFill {}
unsafe impl Sync for SharedFill {}

impl SharedFill {
    fn new(capacity: usize) -> Self {
        let mut buffer = Vec::with_capacity(capacity);
        SharedFill {
            start: buffer.as_mut_ptr(),
            capacity,
            buffer: Mutex::new(Some(buffer)),
        }
    }

    /// Copies `values` into `range` of the buffer, in chunks over the pool.
    ///
    /// # Safety
    /// No other thread writes or reads `range` meanwhile.
    unsafe fn write(&self, range: std::ops::Range<usize>, values: &[f32]) {
        assert!(range.end <= self.capacity && range.len() == values.len());
        // SAFETY: within the allocation (checked above); exclusive by the
        // caller's contract.
        let dst = unsafe {
            std::slice::from_raw_parts_mut(
                self.start
                    .add(range.start)
                    .cast::<std::mem::MaybeUninit<f32>>(),
                range.len(),
            )
        };
        copy_to_uninit(dst, values);
    }

    /// The buffer, as `len` values.
    ///
    /// # Safety
    /// All of `0..len` was written ([`SharedFill::write`]) by threads that
    /// have synchronised with this one since.
    unsafe fn take_filled(&self, len: usize) -> Vec<f32> {
        let mut buffer = self
            .buffer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .expect("the shared buffer is taken once");
        assert!(len <= self.capacity);
        // SAFETY: initialised by the caller's contract.
        unsafe { buffer.set_len(len) };
        buffer
    }
}

/// Collects each trainable parameter's gradient for its range of the flat
/// gradient on the device (zeroing there the ranges the loss did not reach
/// in the first micro-batch); `add_grads` then writes them all in place
/// (added when not `first`) in a few launches of `kernels::gather_at`,
/// where one launch per parameter cost ~200 per BERT-base step. No buffer
/// of the whole gradient is made per step: concatenating the parts into a
/// new one (and adding that to the old for a later micro-batch) cost a
/// gradient-sized allocation and, when accumulating, a second pass.
struct DeviceGrads<'a> {
    grads: &'a mut Gradients,
    flat: &'a DeviceFlat,
    /// Where the next trainable parameter's range starts (layout order,
    /// checked beforehand).
    offset: usize,
    first: bool,
    /// The gradients and their ranges (the handles keep the buffers alive
    /// until the launch).
    parts: Vec<kernels::GatherPart>,
    error: Option<OptimError>,
}

impl ModuleVisitor for DeviceGrads<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let tensor = param.val();
        if !is_trainable(&tensor) {
            return;
        }
        let n = tensor.dims().iter().product::<usize>();
        let offset = self.offset;
        self.offset += n;
        let (client, flat) = (self.flat.client(), self.flat.handle());
        let Some(part) = tensor.grad_remove(self.grads) else {
            if self.first {
                kernels::zero_at(client, flat, self.flat.len(), offset, n);
            }
            return;
        };
        match read_cube_buffer(part.reshape([n])) {
            Ok(Some(part)) => self.parts.push(kernels::GatherPart {
                source: part.handle,
                len: n,
                offset,
            }),
            Ok(None) => {
                self.error.get_or_insert(OptimError::TensorData {
                    path: "gradient".to_string(),
                    detail: "a gradient off the device of the flat buffers".to_string(),
                });
            }
            Err(e) => {
                self.error.get_or_insert(OptimError::TensorData {
                    path: "gradient".to_string(),
                    detail: e.to_string(),
                });
            }
        }
    }
}
