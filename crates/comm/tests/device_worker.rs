//! The compressed allreduce on a wgpu device (lavapipe,
//! `WgpuDeviceKind::Cpu`) with every phase a kernel and its messages on the
//! device (terse-kernels' `DeviceMessages`, exchanged through the host by
//! `local`, which moves host buffers): x, the worker error and the server
//! error never leave the device. Against the same allreduce over host
//! slices, for world sizes 2 and 4, one scale per chunk and per 64-element
//! block, three successive calls (errors carry over). The packed bits of
//! the first call are the CPU's exactly (so the outputs agree to the
//! scales' rounding), later calls agree to float tolerance except where an
//! element's compensated value `y = x + e` is a near-tie at zero (see
//! [`near_tie_flips`]), and the bytes on the wire are the same.

use std::time::Duration;

use burn::tensor::{Device, DeviceKind, Tensor, TensorData};
use cubecl::prelude::*;
use cubecl::server::Handle;
use terse_comm::{
    Communicator, CompressedAllreduce, CompressionOptions, Geometry, LocalComm, Scale,
};
use terse_kernels::device_messages::DeviceMessages;
use terse_kernels::server::HostServer;
use terse_kernels::tensor::into_cube_buffer;
use terse_rng::{SplitMix64, mix64};

fn input(seed: u64, rank: usize, call: usize, len: usize) -> Vec<f32> {
    let mut rng = SplitMix64::new(mix64(seed ^ ((rank as u64) << 32) ^ call as u64));
    (0..len)
        .map(|_| rng.normal() * (1.0 + rank as f32))
        .collect()
}

struct Outcome {
    outputs: Vec<Vec<f32>>,
    /// The worker error after each call.
    errors: Vec<Vec<f32>>,
    /// The server error after each call.
    server_errors: Vec<Vec<f32>>,
    sent: u64,
}

/// The first `len` f32 of a device buffer.
fn read(client: &Client, handle: &Handle, len: usize) -> Vec<f32> {
    f32::from_bytes(&client.read_one_unchecked(handle.clone()))[..len].to_vec()
}

/// Per rank: the outputs and worker errors of three calls.
fn run(
    n: usize,
    len: usize,
    options: CompressionOptions,
    seed: u64,
    device: Option<&Device>,
) -> Vec<Outcome> {
    LocalComm::run(n, Duration::from_secs(300), |comm| {
        let mut state = CompressedAllreduce::new(len, comm, options).unwrap();
        let mut outputs = Vec::new();
        let mut errors = Vec::new();
        let mut server_errors = Vec::new();
        let mut host_error = vec![0.0f32; len];
        let (_, mut server_error) = state.zeroed_errors();
        let server_len = state.error_lens().1;
        // The device's client, and both errors on it at zero.
        let on_device = |values: &[f32], d: &Device| {
            let t = Tensor::<1>::from_data(TensorData::new(values.to_vec(), [values.len()]), d);
            let t = into_cube_buffer(t).unwrap().expect("a cubecl device");
            (t.client, t.handle)
        };
        let mut device_errors = device.map(|d| {
            let (client, error) = on_device(&vec![0.0; len], d);
            let (_, server) = on_device(&vec![0.0; server_len.max(1)], d);
            (client, error, server)
        });
        let before = comm.traffic().sent();
        for call in 0..3 {
            let x = input(seed, comm.rank(), call, len);
            match device {
                None => {
                    let mut x = x;
                    let mut worker = terse_kernels::worker::HostWorker {
                        x: &mut x,
                        error: &mut host_error,
                    };
                    let mut server = HostServer {
                        error: &mut server_error,
                    };
                    state
                        .allreduce_mean_on(comm, &mut worker, &mut server)
                        .unwrap();
                    outputs.push(x);
                    errors.push(host_error.clone());
                    server_errors.push(server_error.clone());
                }
                Some(d) => {
                    let (client, error, server) = device_errors.take().unwrap();
                    let (_, x) = on_device(&x, d);
                    let mut messages =
                        DeviceMessages::new(client.clone(), (x, error, len), (server, server_len));
                    state.allreduce_mean_in(comm, &mut messages).unwrap();
                    let (x, error, server) = messages.into_parts();
                    outputs.push(read(&client, &x, len));
                    errors.push(read(&client, &error, len));
                    server_errors.push(read(&client, &server, server_len));
                    device_errors = Some((client, error, server));
                }
            }
        }
        Outcome {
            outputs,
            errors,
            server_errors,
            sent: comm.traffic().sent() - before,
        }
    })
    .into_iter()
    .map(|r| r.expect("rank panicked"))
    .collect()
}

#[test]
fn device_worker_matches_the_host_worker() {
    // Fixed seeds, so that the verdict is the same every run.
    compare_workers(&[1, 2]);
}

/// A seed the clock-seeded version of this test met (2026-11-24): at n 4,
/// len 70,001, block 64 one element of rank 0's third call has `y = x + e`
/// = −1.2e−7 on the host against a block scale of 0.98, and the device,
/// whose `e` differs from the host's in the last bits, gives it the other
/// sign. Its error then differs by twice the scale and its server block's
/// scale with it (the outputs of 64 elements, by 0.58%): 1.0e−2 and 1.8e−4
/// over the whole vectors, which the l2 comparison once took for a bug.
#[test]
fn a_near_tie_flips_one_sign_and_moves_only_its_block() {
    let flips = compare_workers(&[1_795_503_099_839_123_222]);
    assert!(
        flips >= 1,
        "this seed is kept for its near-tie flip; none seen"
    );
}

/// The signs the worker sent at one call, recovered from its errors:
/// `e' = y − s·sign(y)` with `y = x + e` and the scale `s > 0`, so the
/// sign is that of `y − e'` (exact enough: `|y − e'| = s`).
fn sent_signs(x: &[f32], previous: &[f32], error: &[f32]) -> Vec<bool> {
    x.iter()
        .zip(previous)
        .zip(error)
        .map(|((x, p), e)| x + p - e >= 0.0)
        .collect()
}

/// The elements whose sign the device and the host chose differently at
/// one call. The scales are sums taken in another order on the device, so
/// from the second call on its error — and so `y = x + e` — differs from
/// the host's in the last bits; an element whose `y` lies that close to
/// zero may take either sign, and both are right. Any other sign
/// difference is a bug: each flip must be a near-tie (`|y|` below 1e-5 of
/// the mean `|y|`).
fn near_tie_flips(what: &str, x: &[f32], host: [&[f32]; 2], device: [&[f32]; 2]) -> Vec<usize> {
    let (h, d) = (
        sent_signs(x, host[0], host[1]),
        sent_signs(x, device[0], device[1]),
    );
    let y = |i: usize| x[i] + host[0][i];
    let mean = (0..x.len()).map(|i| f64::from(y(i).abs())).sum::<f64>() / x.len() as f64;
    let flips: Vec<usize> = (0..x.len()).filter(|&i| h[i] != d[i]).collect();
    for &i in &flips {
        assert!(
            f64::from(y(i).abs()) <= 1e-5 * mean,
            "{what}: element {i} took another sign on the device at y = {:e} (mean |y| {mean:e}): \
             not a near-tie",
            y(i)
        );
    }
    flips
}

/// The l2 gap of `a` from `b` relative to `b`, over the elements `keep`.
fn relative_gap_where(a: &[f32], b: &[f32], keep: &[bool]) -> f64 {
    let kept = || {
        a.iter()
            .zip(b)
            .zip(keep)
            .filter(|(_, k)| **k)
            .map(|(ab, _)| ab)
    };
    let num: f64 = kept().map(|(a, b)| f64::from(a - b).powi(2)).sum();
    let den: f64 = kept().map(|(_, b)| f64::from(*b).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

/// Compares the device and host workers at every seed and case; returns
/// the number of near-tie sign flips met. A flip moves its element's error
/// and the scale of its block — or of its whole chunk where there is one
/// scale per chunk — on the worker and then on the server, and so the
/// outputs of that block from that call on: those elements are left out of
/// the later comparisons, everything else must agree as before.
fn compare_workers(seeds: &[u64]) -> usize {
    let lavapipe = Device::wgpu(DeviceKind::Cpu);
    let cases = [(2, 1000, None), (4, 70_001, Some(64)), (4, 40, None)];
    let mut flips = 0;
    for (seed, (n, len, block)) in seeds
        .iter()
        .flat_map(|&seed| cases.map(|case| (seed, case)))
    {
        let options = CompressionOptions {
            scale: Scale::L1,
            scale_block: block,
            geometry: Geometry::Chunks,
        };
        let host = run(n, len, options, seed, None);
        let gpu = run(n, len, options, seed, Some(&lavapipe));
        let case = format!("seed {seed}, n {n}, len {len}, block {block:?}");
        // CompressedAllreduce's chunk: a multiple of 32, blocks aligned in it.
        let reach = block.unwrap_or(len.div_ceil(n).div_ceil(32) * 32);
        let mut compared = vec![true; len];
        let zeros = vec![0.0f32; len];
        for call in 0..3 {
            for (rank, (h, g)) in host.iter().zip(&gpu).enumerate() {
                let x = input(seed, rank, call, len);
                // The worker errors each side started this call from.
                let (host_previous, device_previous): (&[f32], &[f32]) = if call == 0 {
                    (&zeros, &zeros)
                } else {
                    (&h.errors[call - 1], &g.errors[call - 1])
                };
                let what = format!("{case}, rank {rank}, call {call}");
                let at = near_tie_flips(
                    &what,
                    &x,
                    [host_previous, &h.errors[call]],
                    [device_previous, &g.errors[call]],
                );
                // The first call starts from zero errors on both: the same
                // y bit for bit, so the same signs.
                assert!(call > 0 || at.is_empty(), "{what}: signs differ at {at:?}");
                flips += at.len();
                for i in at {
                    let (from, to) = (i.saturating_sub(reach), (i + reach + 1).min(len));
                    compared[from..to].fill(false);
                }
            }
            for (rank, (h, g)) in host.iter().zip(&gpu).enumerate() {
                let what = format!("{case}, rank {rank}, call {call}");
                if call == 0 {
                    // Identical signs, scales summed in another order.
                    let first = h.outputs[0]
                        .iter()
                        .zip(&g.outputs[0])
                        .map(|(a, b)| ((a - b).abs() / a.abs().max(1e-30)) as f64)
                        .fold(0.0, f64::max);
                    assert!(first <= 1e-5, "{what}: first call differs by {first:e}");
                } else {
                    let gap = relative_gap_where(&g.outputs[call], &h.outputs[call], &compared);
                    assert!(gap <= 1e-4, "{what}: outputs differ by {gap:e}");
                }
                let gap = relative_gap_where(&g.errors[call], &h.errors[call], &compared);
                assert!(gap <= 1e-4, "{what}: worker errors differ by {gap:e}");
                // The server error of this rank's chunk, from the device's
                // server kernels against the CPU's server loop.
                let chunk = len.div_ceil(n).div_ceil(32) * 32;
                let mine = (rank * chunk).min(len)..((rank + 1) * chunk).min(len);
                let (hs, gs) = (&h.server_errors[call], &g.server_errors[call]);
                assert_eq!((gs.len(), hs.len()), (mine.len(), mine.len()), "{what}");
                let gap = relative_gap_where(gs, hs, &compared[mine.clone()]);
                assert!(gap <= 1e-4, "{what}: server errors differ by {gap:e}");
                assert!(
                    mine.is_empty() || hs.iter().any(|e| *e != 0.0),
                    "{what}: the server error never moved"
                );
            }
        }
        for (rank, (h, g)) in host.iter().zip(&gpu).enumerate() {
            let what = format!("{case}, rank {rank}");
            assert_eq!(g.sent, h.sent, "{what}: bytes sent");
            assert!(
                h.outputs[0].iter().any(|v| *v != 0.0),
                "{what}: zero output"
            );
        }
    }
    flips
}
