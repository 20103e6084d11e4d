//! [`NcclComm::check_gpu_buffers`]: NCCL's collectives from GPU buffers
//! (what a CUDA run's flat buffers take) against the same collectives from
//! host buffers, bit for bit, for `terse-comm-check --nccl`.

use cudarc::driver::DevicePtr;

use super::{NcclComm, backend};
use crate::{CommError, Communicator, GpuBytes, GpuCollectives, GpuF32, ReduceOp, selfcheck};

impl NcclComm {
    /// [`GpuCollectives`] against the host path: for each of
    /// [`selfcheck::LENGTHS`], the same integer-valued inputs allreduced,
    /// all-gathered and sent all-to-all from GPU buffers and from host
    /// buffers must give the same bits (both are NCCL's); the first
    /// difference is returned as a message.
    pub fn check_gpu_buffers(&self) -> Result<(), String> {
        let (rank, n) = (self.rank(), self.world_size());
        let values =
            |len: usize| -> Vec<f32> { (0..len).map(|i| selfcheck::value(rank, i)).collect() };
        let fail = |e: CommError| e.to_string();
        for len in selfcheck::LENGTHS {
            let input = values(len);
            let bytes: &[u8] = bytemuck::cast_slice(&input);
            let mut host = input.clone();
            self.allreduce_f32(&mut host, ReduceOp::Sum).map_err(fail)?;
            // SAFETY (each call below): `through_gpu` hands over its own
            // allocations of the lengths given, their writes completed.
            let gpu = self
                .through_gpu(bytes, bytes.len(), |send, recv| unsafe {
                    let f32s = |b: GpuBytes| GpuF32 { ptr: b.ptr, len };
                    self.allreduce_sum_f32_gpu(f32s(send), f32s(recv))
                })
                .map_err(fail)?;
            same_bits("allreduce", len, bytemuck::cast_slice(&host), &gpu)?;

            let mut host = vec![0u8; n * bytes.len()];
            self.all_gather_u8(bytes, &mut host).map_err(fail)?;
            let gpu = self
                .through_gpu(bytes, host.len(), |send, recv| unsafe {
                    self.all_gather_gpu(send, recv)
                })
                .map_err(fail)?;
            same_bits("all-gather", len, &host, &gpu)?;

            // A different chunk for every peer, so a misplaced one shows.
            let input = values(n * len);
            let bytes: &[u8] = bytemuck::cast_slice(&input);
            let mut host = vec![0u8; bytes.len()];
            self.all_to_all_u8(bytes, &mut host).map_err(fail)?;
            let gpu = self
                .through_gpu(bytes, host.len(), |send, recv| unsafe {
                    self.all_to_all_gpu(send, recv)
                })
                .map_err(fail)?;
            same_bits("all-to-all", n * len, &host, &gpu)?;
        }
        Ok(())
    }

    /// `input` through the GPU collective `call` into `out_len` bytes,
    /// from a send and a receive buffer this communicator allocates.
    fn through_gpu(
        &self,
        input: &[u8],
        out_len: usize,
        call: impl FnOnce(GpuBytes, GpuBytes) -> Result<(), CommError>,
    ) -> Result<Vec<u8>, CommError> {
        let err = |e| backend(format!("{e:?}"));
        let send = self.upload(if input.is_empty() { &[0] } else { input })?;
        let recv = self.stream.alloc_zeros::<u8>(out_len.max(1)).map_err(err)?;
        self.stream.synchronize().map_err(err)?;
        let (send_ptr, _) = send.device_ptr(&self.stream);
        let (recv_ptr, _) = recv.device_ptr(&self.stream);
        call(
            GpuBytes {
                ptr: send_ptr,
                len: input.len(),
            },
            GpuBytes {
                ptr: recv_ptr,
                len: out_len,
            },
        )?;
        let mut out = vec![0u8; out_len.max(1)];
        self.stream.memcpy_dtoh(&recv, &mut out).map_err(err)?;
        self.stream.synchronize().map_err(err)?;
        out.truncate(out_len);
        Ok(out)
    }
}

/// The first f32 at which the GPU path's output differs from the host
/// path's, as the self-check's message.
fn same_bits(what: &str, len: usize, host: &[u8], gpu: &[u8]) -> Result<(), String> {
    // Byte vectors need not be aligned for f32: read them word by word.
    let floats = |b: &[u8]| -> Vec<f32> { bytemuck::pod_collect_to_vec(b) };
    let (host, gpu) = (floats(host), floats(gpu));
    match (0..host.len()).find(|&i| host[i].to_bits() != gpu[i].to_bits()) {
        None => Ok(()),
        Some(i) => Err(format!(
            "{what} of {len} f32 from GPU buffers: element {i} is {} on the GPU and {} through \
             the host",
            gpu[i], host[i]
        )),
    }
}
