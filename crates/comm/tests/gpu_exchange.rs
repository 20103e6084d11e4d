//! The compressed allreduce's GPU exchange branch, where no GPU is: NCCL
//! (the only communicator that moves GPU memory) cannot run here, and on
//! one lent GPU the exchange never runs (world size 1 compresses nothing),
//! so its sizes and order are checked with a test double. `HostAddressed`
//! wraps a `local` rank and implements `GpuCollectives` over addresses that
//! point at host memory, carrying each call out with the rank's host
//! collective of the same name; the message buffers are lavapipe's
//! `DeviceMessages`, whose words are copied to host vectors around each
//! exchange and handed over by address. The result must be the host
//! branch's bit for bit, with the same bytes counted, two GPU exchanges a
//! call and no host exchange. SLAMB's sparse allreduce likewise: a host
//! slice whose selected values are averaged by address — fp32 summed
//! (`mean_on_gpu`), fp16 by the device kernels on lavapipe
//! (`mean_f16_on_gpu`, `terse_kernels::device::mean_f16`) — against the
//! same slice averaged through the host.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use burn::tensor::{Device, DeviceKind, Tensor, TensorData};
use cubecl::bytes::Bytes;
use cubecl::prelude::*;
use cubecl::server::Handle;
use terse_comm::traffic::TrafficMeter;
use terse_comm::{
    CommError, Communicator, CompressedAllreduce, CompressionOptions, Geometry, GpuBytes,
    GpuCollectives, GpuF32, HostSparse, LocalComm, Mask, ReduceOp, Scale, Selection,
    SparseAllreduce, SparseBuffer, SparseValues, Width,
};
use terse_kernels::device;
use terse_kernels::device_messages::DeviceMessages;
use terse_kernels::half_mean::{HalfExchange, HalfSlices};
use terse_kernels::messages::{MessageAddresses, MessageBuffers, MessageGeometry};
use terse_kernels::tensor::into_cube_buffer;
use terse_rng::{SplitMix64, mix64};

/// A `local` rank whose GPU collectives take host addresses.
struct HostAddressed<'a> {
    inner: &'a LocalComm,
    gpu_calls: AtomicUsize,
}

/// The host bytes at a [`GpuBytes`] the double was handed.
///
/// # Safety
/// `b` names live host memory of its length that nothing else uses.
unsafe fn host<'a>(b: GpuBytes) -> &'a mut [u8] {
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts_mut(b.ptr as *mut u8, b.len) }
}

impl GpuCollectives for HostAddressed<'_> {
    unsafe fn allreduce_sum_f32_gpu(&self, send: GpuF32, recv: GpuF32) -> Result<(), CommError> {
        self.gpu_calls.fetch_add(1, Ordering::Relaxed);
        let bytes = |b: GpuF32| GpuBytes {
            ptr: b.ptr,
            len: b.len * 4,
        };
        // SAFETY: `ByAddress` hands over its own host vectors of f32.
        let (send, recv) = unsafe { (host(bytes(send)), host(bytes(recv))) };
        recv.copy_from_slice(send);
        self.allreduce_f32(bytemuck::cast_slice_mut(recv), ReduceOp::Sum)
    }

    unsafe fn all_to_all_gpu(&self, send: GpuBytes, recv: GpuBytes) -> Result<(), CommError> {
        self.gpu_calls.fetch_add(1, Ordering::Relaxed);
        // SAFETY: `Messages` hands over its own host vectors.
        unsafe { self.all_to_all_u8(host(send), host(recv)) }
    }

    unsafe fn all_gather_gpu(&self, send: GpuBytes, recv: GpuBytes) -> Result<(), CommError> {
        self.gpu_calls.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { self.all_gather_u8(host(send), host(recv)) }
    }
}

impl Communicator for HostAddressed<'_> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn world_size(&self) -> usize {
        self.inner.world_size()
    }
    fn backend(&self) -> &'static str {
        "host-addressed"
    }
    fn meter(&self) -> &TrafficMeter {
        self.inner.meter()
    }
    fn abort(&self, reason: &str) {
        self.inner.abort(reason)
    }
    fn allreduce_f32_raw(&self, buf: &mut [f32], op: ReduceOp) -> Result<(), CommError> {
        self.inner.allreduce_f32_raw(buf, op)
    }
    fn broadcast_raw(&self, buf: &mut [u8], width: Width, root: usize) -> Result<(), CommError> {
        self.inner.broadcast_raw(buf, width, root)
    }
    fn all_gather_raw(&self, send: &[u8], recv: &mut [u8], width: Width) -> Result<(), CommError> {
        self.inner.all_gather_raw(send, recv, width)
    }
    fn all_to_all_raw(&self, send: &[u8], recv: &mut [u8], width: Width) -> Result<(), CommError> {
        self.inner.all_to_all_raw(send, recv, width)
    }
    fn barrier_raw(&self) -> Result<(), CommError> {
        self.inner.barrier_raw()
    }
    fn gpu_collectives(&self) -> Option<&dyn GpuCollectives> {
        Some(self)
    }
}

/// `DeviceMessages` whose buffers are handed over by host address: the
/// send buffer's words copied to a host vector before the exchange, the
/// receive vector's written back after. Its host branch must not run.
struct Messages {
    device: DeviceMessages,
    geometry: Option<MessageGeometry>,
}

impl Messages {
    fn remember(&mut self, geometry: &MessageGeometry) {
        self.geometry = Some(*geometry);
    }
}

impl MessageBuffers for Messages {
    fn len(&self) -> usize {
        self.device.len()
    }
    fn server_len(&self) -> usize {
        self.device.server_len()
    }
    fn compress(&mut self, geometry: &MessageGeometry) {
        self.remember(geometry);
        self.device.compress(geometry);
    }
    fn serve(&mut self, geometry: &MessageGeometry) {
        self.remember(geometry);
        self.device.serve(geometry);
    }
    fn decompress(&mut self, geometry: &MessageGeometry) {
        self.device.decompress(geometry);
    }
    fn with_device_addresses(&mut self, exchange: &mut dyn FnMut(MessageAddresses)) -> bool {
        let words = self.geometry.expect("a phase ran first").all_messages();
        let send = self.device.read_send(words);
        let mut recv = vec![0u32; words];
        exchange(MessageAddresses {
            send: send.as_ptr() as u64,
            recv: recv.as_mut_ptr() as u64,
        });
        self.device.write_recv(&recv);
        true
    }
    fn read_send(&mut self, _: usize) -> Vec<u32> {
        panic!("the exchange went through the host")
    }
    fn write_recv(&mut self, _: &[u32]) {
        panic!("the exchange went through the host")
    }
}

/// Per rank: the outputs of three calls (bits), the errors after them,
/// the bytes sent and the GPU exchanges made.
fn run(
    n: usize,
    len: usize,
    block: Option<usize>,
    gpu_branch: bool,
) -> Vec<(Vec<u32>, u64, usize)> {
    let lavapipe = Device::wgpu(DeviceKind::Cpu);
    let options = CompressionOptions {
        scale: Scale::L1,
        scale_block: block,
        geometry: Geometry::Chunks,
    };
    let ranks = LocalComm::run(n, Duration::from_secs(300), |local| {
        let comm = HostAddressed {
            inner: local,
            gpu_calls: AtomicUsize::new(0),
        };
        let mut state = CompressedAllreduce::new(len, &comm, options).unwrap();
        let server_len = state.error_lens().1;
        let upload = |values: Vec<f32>| {
            let n = values.len();
            let t = Tensor::<1>::from_data(TensorData::new(values, [n]), &lavapipe);
            let t = into_cube_buffer(t).unwrap().expect("a cubecl device");
            (t.client, t.handle)
        };
        let (client, mut error) = upload(vec![0.0; len]);
        let (_, mut server) = upload(vec![0.0; server_len.max(1)]);
        let mut bits = Vec::new();
        let before = comm.traffic().sent();
        for call in 0..3u64 {
            let mut rng = SplitMix64::new(mix64(((local.rank() as u64) << 32) ^ call));
            let (_, x) = upload((0..len).map(|_| rng.normal()).collect());
            let device = DeviceMessages::new(client.clone(), (x, error, len), (server, server_len));
            let (x, e, s) = if gpu_branch {
                let comm = &comm as &dyn Communicator;
                let mut messages = Messages {
                    device,
                    geometry: None,
                };
                state.allreduce_mean_in(comm, &mut messages).unwrap();
                messages.device.into_parts()
            } else {
                let mut device = device;
                state.allreduce_mean_in(local, &mut device).unwrap();
                device.into_parts()
            };
            for (handle, n) in [(&x, len), (&e, len), (&s, server_len)] {
                bits.extend(read_bits(&client, handle, n));
            }
            (error, server) = (e, s);
        }
        let sent = comm.traffic().sent() - before;
        (bits, sent, comm.gpu_calls.load(Ordering::Relaxed))
    });
    ranks
        .into_iter()
        .map(|r| r.expect("rank panicked"))
        .collect()
}

fn read_bits(client: &Client, handle: &Handle, len: usize) -> Vec<u32> {
    u32::from_bytes(&client.read_one_unchecked(handle.clone()))[..len].to_vec()
}

#[test]
fn the_gpu_exchange_moves_the_host_exchanges_words() {
    for (n, len, block) in [(2, 1000, None), (4, 70_001, Some(64)), (3, 40, None)] {
        let through_host = run(n, len, block, false);
        let by_address = run(n, len, block, true);
        for (rank, (h, g)) in through_host.iter().zip(&by_address).enumerate() {
            let what = format!("n {n}, len {len}, block {block:?}, rank {rank}");
            assert_eq!(h.2, 0, "{what}: local has no GPU collectives");
            assert_eq!(g.2, 6, "{what}: two GPU exchanges in each of 3 calls");
            assert_eq!(g.1, h.1, "{what}: bytes sent");
            let first = h.0.iter().zip(&g.0).position(|(a, b)| a != b);
            assert_eq!(first, None, "{what}: outputs and errors differ");
        }
    }
}

/// A host slice whose selected values are averaged by address, as SLAMB's
/// CUDA momentum is: fp32 values gathered, summed into a new buffer,
/// scaled and scattered; fp16 values through the device's own kernels on
/// lavapipe (`terse_kernels::device::mean_f16`, which SLAMB's CUDA path
/// runs), each exchange's buffers copied to host vectors and handed over by
/// address.
struct ByAddress<'a> {
    sparse: HostSparse<'a>,
    client: Client,
}

impl SparseBuffer for ByAddress<'_> {
    fn select(&mut self, mask: &Mask, t: u64, always: &[std::ops::Range<usize>]) -> usize {
        self.sparse.select(mask, t, always)
    }
    fn gather(&mut self, _: &mut [f32]) {
        panic!("the sparse values went through the host")
    }
    fn scatter(&mut self, _: &[f32]) {
        panic!("the sparse values went through the host")
    }
    fn mean_on_gpu(
        &mut self,
        count: usize,
        scale: f32,
        sum: &mut dyn FnMut(u64, u64) -> bool,
    ) -> bool {
        let mut gathered = vec![0.0f32; count];
        self.sparse.gather(&mut gathered);
        let mut summed = vec![f32::NAN; count];
        if sum(gathered.as_ptr() as u64, summed.as_mut_ptr() as u64) {
            summed.iter_mut().for_each(|v| *v *= scale);
            self.sparse.scatter(&summed);
        }
        true
    }
    fn mean_f16_on_gpu(
        &mut self,
        slices: HalfSlices,
        scale: f32,
        exchange: &mut dyn FnMut(HalfExchange, u64, u64) -> bool,
    ) -> bool {
        let mut gathered = vec![0.0f32; slices.count.max(1)];
        self.sparse.gather(&mut gathered[..slices.count]);
        let client = &self.client;
        let values = client.create_from_slice(f32::as_bytes(&gathered));
        let mean = device::mean_f16(client, &values, slices, scale, |which, send, recv| {
            let send = client.read_one_unchecked(send.clone()).to_vec();
            let mut received = vec![0u8; client.read_one_unchecked(recv.clone()).len()];
            let ok = exchange(which, send.as_ptr() as u64, received.as_mut_ptr() as u64);
            client.write(recv, Bytes::from_bytes_vec(received));
            Some(ok.then_some(()).ok_or(()))
        });
        if let Some(Ok(mean)) = mean {
            let mean = f32::from_bytes(&client.read_one_unchecked(mean)).to_vec();
            self.sparse.scatter(&mean[..slices.count]);
        }
        true
    }
}

#[test]
fn the_sparse_values_averaged_by_address_are_the_host_means() {
    let lavapipe = Device::wgpu(DeviceKind::Cpu);
    let one = Tensor::<1>::from_data(TensorData::new(vec![0.0f32], [1]), &lavapipe);
    let client = into_cube_buffer(one)
        .unwrap()
        .expect("a cubecl device")
        .client;
    for (precision, n, len) in [
        (SparseValues::F32, 3, 10_000),
        (SparseValues::F16, 3, 10_000),
        (SparseValues::F16, 4, 999),
        (SparseValues::F16, 2, 70_001),
    ] {
        let ranks = LocalComm::run(n, Duration::from_secs(300), |local| {
            let comm = HostAddressed {
                inner: local,
                gpu_calls: AtomicUsize::new(0),
            };
            let mask = Mask::Hash { seed: 5, k: 0.25 };
            let always = vec![100..164, 500..532];
            let mut sparse = SparseAllreduce::with_precision(mask, always, precision);
            let mut rng = SplitMix64::new(mix64(local.rank() as u64));
            let mut by_host: Vec<f32> = (0..len).map(|_| rng.normal()).collect();
            let mut by_address = by_host.clone();
            let before = local.traffic().sent();
            for t in 1..=3 {
                sparse.allreduce_mean(local, t, &mut by_host).unwrap();
            }
            let host_bytes = local.traffic().sent() - before;
            for t in 1..=3 {
                let mut selection = Selection::default();
                let mut buffer = ByAddress {
                    sparse: HostSparse {
                        buf: &mut by_address,
                        selection: &mut selection,
                    },
                    client: client.clone(),
                };
                sparse.allreduce_mean_on(&comm, t, &mut buffer).unwrap();
            }
            let gpu_bytes = local.traffic().sent() - before - host_bytes;
            let gpu_calls = comm.gpu_calls.load(Ordering::Relaxed);
            (by_host, by_address, gpu_calls, host_bytes, gpu_bytes)
        });
        for (rank, r) in ranks.into_iter().enumerate() {
            let (by_host, by_address, gpu_calls, host_bytes, gpu_bytes) = r.expect("rank panicked");
            let what = format!("{precision:?}, n {n}, len {len}, rank {rank}");
            let per_step = match precision {
                SparseValues::F32 => 1,
                SparseValues::F16 => 2,
            };
            assert_eq!(gpu_calls, 3 * per_step, "{what}: GPU exchanges");
            assert_eq!(gpu_bytes, host_bytes, "{what}: bytes sent");
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            let first = bits(&by_address)
                .iter()
                .zip(bits(&by_host))
                .position(|(a, b)| *a != b);
            assert_eq!(first, None, "{what}: first element that differs");
        }
    }
}
