//! SLAMB's sparse allreduce: only the values the step's mask selects travel
//! (no indices: every rank computes the same mask from the seed), averaged
//! and written back in place. Values travel as fp32 (a plain allreduce) or,
//! with [`SparseValues::F16`], as fp16 through a reduce-scatter (all-to-all)
//! and an all-gather, half the bytes. The buffer is a [`SparseBuffer`]: a
//! host slice, or in a device run SLAMB's momentum on the device, selected,
//! gathered and scattered by cubecl kernels, so only the selected values
//! pass through the host — or none, where the momentum is CUDA memory and
//! the communicator NCCL: fp32 values are then summed on the GPU, fp16
//! values rounded, averaged and widened there by kernels with this
//! module's arithmetic, NCCL moving their halves.

use std::ops::Range;

use half::f16;
use serde::{Deserialize, Serialize};
use terse_compress::half_mean::{HalfExchange, HalfSlices};
use terse_compress::mask::{HostSparse, Mask, Selection, SparseBuffer};

use crate::{CommError, Communicator, GpuBytes, GpuCollectives, GpuF32, ReduceOp};

/// The precision the selected values travel in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SparseValues {
    /// fp32: the mean is that of [`Communicator::allreduce_f32`].
    #[default]
    F32,
    /// fp16: each rank's values are rounded to fp16, summed in fp32 in rank
    /// order by the rank that owns their slice, and the mean is rounded to
    /// fp16 again, so every rank holds the same values.
    F16,
}

impl SparseValues {
    /// The mean over ranks of `values`, the selected elements gathered in
    /// selection order wherever they lived (host slices here, a device's
    /// masked gather in a device run), travelling in this precision.
    pub fn mean_over_ranks(
        self,
        comm: &dyn Communicator,
        values: &mut [f32],
    ) -> Result<(), CommError> {
        match self {
            SparseValues::F32 => comm.allreduce_f32(values, ReduceOp::Mean),
            SparseValues::F16 => allreduce_mean_f16(comm, values),
        }
    }
}

/// A mask, the ranges always synchronised, and scratch for the values.
#[derive(Debug, Clone)]
pub struct SparseAllreduce {
    mask: Mask,
    always: Vec<Range<usize>>,
    precision: SparseValues,
    values: Vec<f32>,
    selection: Selection,
}

impl SparseAllreduce {
    /// Synchronise what `mask` selects plus everything inside `always`
    /// (SLAMB: segments below `always_sync_below` elements), in fp32.
    pub fn new(mask: Mask, always: Vec<Range<usize>>) -> SparseAllreduce {
        Self::with_precision(mask, always, SparseValues::F32)
    }

    /// As [`SparseAllreduce::new`], the values travelling in `precision`.
    pub fn with_precision(
        mask: Mask,
        mut always: Vec<Range<usize>>,
        precision: SparseValues,
    ) -> SparseAllreduce {
        always.sort_by_key(|r| r.start);
        SparseAllreduce {
            mask,
            always,
            precision,
            values: Vec::new(),
            selection: Selection::default(),
        }
    }

    /// Averages over ranks the elements of `buf` selected at step `t`; the
    /// others keep this rank's values. Returns the selection, which the
    /// optimizer needs for its masked norms. At world size 1 `buf` is left
    /// exactly as it is (the fp16 path would otherwise round it).
    pub fn allreduce_mean(
        &mut self,
        comm: &dyn Communicator,
        t: u64,
        buf: &mut [f32],
    ) -> Result<&Selection, CommError> {
        let mut selection = std::mem::take(&mut self.selection);
        let mut host = HostSparse {
            buf,
            selection: &mut selection,
        };
        let result = self.allreduce_mean_on(comm, t, &mut host);
        self.selection = selection;
        result.map(|()| &self.selection)
    }

    /// The ranges synchronised at every step (sorted, disjoint).
    pub fn always(&self) -> &[Range<usize>] {
        &self.always
    }

    /// [`SparseAllreduce::allreduce_mean`] over a buffer wherever it lives
    /// ([`SparseBuffer`]: a host slice, or a device buffer whose selection,
    /// gather and scatter are kernels): the step's selection is made
    /// through it and kept there, and only the selected values pass through
    /// the host.
    pub fn allreduce_mean_on(
        &mut self,
        comm: &dyn Communicator,
        t: u64,
        buf: &mut dyn SparseBuffer,
    ) -> Result<(), CommError> {
        let count = buf.select(&self.mask, t, &self.always);
        if comm.world_size() == 1 {
            return Ok(());
        }
        if let Some(gpu) = comm.gpu_collectives()
            && let Some(result) = self.mean_on_gpu(gpu, comm.world_size(), count, buf)
        {
            return result;
        }
        self.values.resize(count, 0.0);
        buf.gather(&mut self.values);
        self.precision.mean_over_ranks(comm, &mut self.values)?;
        buf.scatter(&self.values);
        Ok(())
    }

    /// The selected values of `buf` averaged in GPU memory by `gpu`, in
    /// this allreduce's precision with the host path's arithmetic (fp32:
    /// NCCL's sum, times 1/n; fp16: [`allreduce_mean_f16`]'s slices, sums
    /// and roundings); `None`, running nothing, where `buf` is not CUDA
    /// memory.
    fn mean_on_gpu(
        &self,
        gpu: &dyn GpuCollectives,
        world: usize,
        count: usize,
        buf: &mut dyn SparseBuffer,
    ) -> Option<Result<(), CommError>> {
        let mut result = Ok(());
        let scale = 1.0 / world as f32;
        let on_gpu = match self.precision {
            SparseValues::F32 => buf.mean_on_gpu(count, scale, &mut |gathered, summed| {
                let (send, recv) = (
                    GpuF32 {
                        ptr: gathered,
                        len: count,
                    },
                    GpuF32 {
                        ptr: summed,
                        len: count,
                    },
                );
                // SAFETY: `mean_on_gpu` hands over two live CUDA buffers of
                // `count` f32, the gathered one written, the other new.
                result = unsafe { gpu.allreduce_sum_f32_gpu(send, recv) };
                result.is_ok()
            }),
            SparseValues::F16 => {
                let slices = HalfSlices { count, world };
                buf.mean_f16_on_gpu(slices, scale, &mut |exchange, send, recv| {
                    let (send_len, recv_len) = exchange.bytes(slices);
                    let (send, recv) = (
                        GpuBytes {
                            ptr: send,
                            len: send_len,
                        },
                        GpuBytes {
                            ptr: recv,
                            len: recv_len,
                        },
                    );
                    // SAFETY: `mean_f16_on_gpu` hands over live CUDA buffers
                    // of at least the exchange's bytes, the sent one written,
                    // the received one nothing else's.
                    result = unsafe {
                        match exchange {
                            HalfExchange::AllToAll => gpu.all_to_all_gpu(send, recv),
                            HalfExchange::AllGather => gpu.all_gather_gpu(send, recv),
                        }
                    };
                    result.is_ok()
                })
            }
        };
        on_gpu.then_some(result)
    }
}

/// The mean over ranks of `values`, travelling as fp16: rank `r` receives
/// slice `r` of every rank (all-to-all), averages it, and the averaged slices
/// are all-gathered. Bytes sent per rank: `2·(n-1)/n · 2·len`, half of an
/// fp32 ring allreduce.
pub fn allreduce_mean_f16(comm: &dyn Communicator, values: &mut [f32]) -> Result<(), CommError> {
    let n = comm.world_size();
    let slices = HalfSlices {
        count: values.len(),
        world: n,
    };
    let part = slices.part();
    let mut send = vec![0u16; slices.all_halves()];
    for (s, &v) in send.iter_mut().zip(values.iter()) {
        *s = f16::from_f32(v).to_bits();
    }
    let mut recv = vec![0u16; slices.all_halves()];
    comm.all_to_all_u8(
        bytemuck::cast_slice(&send),
        bytemuck::cast_slice_mut(&mut recv),
    )?;
    let inv = 1.0 / n as f32;
    let mut own = vec![0u16; part];
    for (i, o) in own.iter_mut().enumerate() {
        let sum: f32 = (0..n)
            .map(|r| f16::from_bits(recv[r * part + i]).to_f32())
            .sum();
        *o = f16::from_f32(sum * inv).to_bits();
    }
    comm.all_gather_u8(
        bytemuck::cast_slice(&own),
        bytemuck::cast_slice_mut(&mut recv),
    )?;
    for (v, &r) in values.iter_mut().zip(recv.iter()) {
        *v = f16::from_bits(r).to_f32();
    }
    Ok(())
}
