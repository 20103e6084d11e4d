//! The cases of `terse-gpu-exchange-check`: the exchanges a device training
//! step hands its communicator by CUDA address, on cubecl buffers, in a
//! world of one. Training on one GPU never reaches them (one rank has
//! nothing to average, and its compressed allreduce compresses nothing),
//! so a lent GPU with no second one would not exercise them otherwise.
//! Each case runs the step's own code with the communicator under check
//! (NCCL: the GPU path, buffers by their device addresses) and the same
//! computation with `local` (which moves host buffers: the words go
//! through the host), and the two must give the same bits. In a world of
//! one a rank's messages go to itself: a wrong offset between peers in
//! the all-to-all cannot show here, only with two GPUs or more.

use std::time::Duration;

use burn::tensor::{Device, Tensor, TensorData};
use cubecl::prelude::*;
use cubecl::server::Handle;
use terse_comm::{
    Communicator, CompressedAllreduce, CompressionOptions, Geometry, LocalComm, ReduceOp, Scale,
};
use terse_kernels::device::with_cuda_addresses;
use terse_kernels::device_messages::DeviceMessages;
use terse_kernels::tensor::into_cube_buffer;
use terse_rng::{SplitMix64, mix64};

use crate::device_flat::{mean_on_gpu, read_f32};

/// One case's outcome.
#[derive(Debug)]
pub struct CaseReport {
    /// What was exchanged, and its sizes.
    pub case: String,
    /// Whether the communicator under check moved the buffers by their
    /// device addresses (false: it has no GPU collectives, or the buffers
    /// are not CUDA memory, and the case compared two host paths).
    pub on_gpu: bool,
    /// `Err`: where the bits differ, or what failed.
    pub outcome: Result<(), String>,
}

/// Runs every case on `device` with `comm`, a world of one.
///
/// # Panics
/// When `comm`'s world is not one rank (the references are a world of one).
pub fn check_gpu_exchanges(comm: &dyn Communicator, device: &Device) -> Vec<CaseReport> {
    assert_eq!(comm.world_size(), 1, "the exchange check runs on one rank");
    let mut reports = Vec::new();
    for len in [1, 1000, (1 << 20) + 3] {
        reports.push(mean_case(comm, device, len));
    }
    let per_chunk = CompressionOptions {
        scale: Scale::L1,
        scale_block: None,
        geometry: Geometry::Chunks,
    };
    let per_block = CompressionOptions {
        scale: Scale::L2,
        scale_block: Some(64),
        ..per_chunk
    };
    for len in [1000, 70_001] {
        for options in [per_chunk, per_block] {
            reports.push(compressed_case(comm, device, len, options));
        }
    }
    reports
}

/// Seeded normal values, different per case and call.
fn values(seed: u64, len: usize) -> Vec<f32> {
    let mut rng = SplitMix64::new(mix64(seed));
    (0..len).map(|_| rng.normal()).collect()
}

/// `values` in a new buffer on `device`, with its client.
fn on_device(device: &Device, values: &[f32]) -> (Client, Handle) {
    let t = Tensor::<1>::from_data(TensorData::new(values.to_vec(), [values.len()]), device);
    let t = into_cube_buffer(t)
        .expect("f32")
        .expect("the exchange check runs on a cubecl device");
    (t.client, t.handle)
}

/// Whether `comm` moves `handle` by its device address.
fn moves_on_gpu(comm: &dyn Communicator, client: &Client, handle: &Handle) -> bool {
    comm.gpu_collectives().is_some() && with_cuda_addresses(client, &[handle], |_| ()).is_some()
}

/// The first element at which `got` and `want` differ in bits.
fn first_difference(what: &str, got: &[f32], want: &[f32]) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{what}: {} values, not {}", got.len(), want.len()));
    }
    match got
        .iter()
        .zip(want)
        .position(|(g, w)| g.to_bits() != w.to_bits())
    {
        None => Ok(()),
        Some(i) => Err(format!(
            "{what}: element {i} is {:e}, not {:e}",
            got[i], want[i]
        )),
    }
}

/// The gradient's fp32 allreduce (`device_flat::mean_on_gpu`: summed by
/// the communicator from the buffer's device address into a new buffer,
/// scaled by 1/n there): in a world of one, the values themselves.
fn mean_case(comm: &dyn Communicator, device: &Device, len: usize) -> CaseReport {
    let x = values(len as u64, len);
    let (client, handle) = on_device(device, &x);
    let case = format!("fp32 mean of {len} values (gradients, SLAMB's selected values)");
    let on_gpu = comm
        .gpu_collectives()
        .map(|gpu| mean_on_gpu(gpu, 1, &client, &handle, len));
    let (on_gpu, outcome) = match on_gpu {
        Some(Ok(Some(mean))) => (
            true,
            first_difference("the mean", &read_f32(&client, &mean, len), &x),
        ),
        Some(Err(e)) => (true, Err(e.to_string())),
        // No GPU path: the mean through the host, as training takes it
        // there, so that the case still compares something.
        None | Some(Ok(None)) => {
            let mut host = read_f32(&client, &handle, len);
            let outcome = comm
                .allreduce_f32(&mut host, ReduceOp::Mean)
                .map_err(|e| e.to_string())
                .and_then(|()| first_difference("the mean", &host, &x));
            (false, outcome)
        }
    };
    CaseReport {
        case,
        on_gpu,
        outcome,
    }
}

/// x, the worker error and the server error after each of three calls.
type Calls = Vec<[Vec<f32>; 3]>;

/// The compressed allreduce of 1-bit stages with its messages on the
/// device (`DeviceMessages`: packed signs and scales exchanged all-to-all,
/// then all-gathered), three calls with the errors carried over, made to
/// compress in a world of one.
fn compressed_case(
    comm: &dyn Communicator,
    device: &Device,
    len: usize,
    options: CompressionOptions,
) -> CaseReport {
    let case = format!(
        "compressed allreduce of {len} values, {} scale per {}",
        match options.scale {
            Scale::L1 => "l1",
            Scale::L2 => "l2",
        },
        options
            .scale_block
            .map_or("chunk".to_string(), |b| format!("{b} values"))
    );
    let probe = on_device(device, &[0.0]);
    let on_gpu = moves_on_gpu(comm, &probe.0, &probe.1);
    let checked = compressed_calls(comm, device, len, options);
    let reference = LocalComm::run(1, Duration::from_secs(600), |local| {
        compressed_calls(local, device, len, options)
    })
    .pop()
    .expect("one rank")
    .unwrap_or_else(|_| Err("the local reference panicked".into()));
    let outcome = checked.and_then(|checked| {
        let reference = reference.map_err(|e| format!("the local reference: {e}"))?;
        for (call, (got, want)) in checked.iter().zip(&reference).enumerate() {
            for (what, (g, w)) in ["x", "worker error", "server error"]
                .iter()
                .zip(got.iter().zip(want))
            {
                first_difference(&format!("call {}: {what}", call + 1), g, w)?;
            }
        }
        Ok(())
    });
    CaseReport {
        case,
        on_gpu,
        outcome,
    }
}

/// [`compressed_case`]'s three calls on `comm`.
fn compressed_calls(
    comm: &dyn Communicator,
    device: &Device,
    len: usize,
    options: CompressionOptions,
) -> Result<Calls, String> {
    let mut state =
        CompressedAllreduce::compressing_alone(len, comm, options).map_err(|e| e.to_string())?;
    let server_len = state.error_lens().1;
    let (client, mut error) = on_device(device, &vec![0.0; len]);
    let (_, mut server) = on_device(device, &vec![0.0; server_len.max(1)]);
    let mut calls = Vec::new();
    for call in 0..3u64 {
        let (_, x) = on_device(device, &values(mix64(len as u64) ^ call, len));
        let mut messages =
            DeviceMessages::new(client.clone(), (x, error, len), (server, server_len));
        state
            .allreduce_mean_in(comm, &mut messages)
            .map_err(|e| format!("call {}: {e}", call + 1))?;
        let x;
        (x, error, server) = messages.into_parts();
        calls.push([
            read_f32(&client, &x, len),
            read_f32(&client, &error, len),
            read_f32(&client, &server, server_len),
        ]);
    }
    Ok(calls)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_difference_is_named_by_its_first_element() {
        assert_eq!(first_difference("x", &[1.0, 2.0], &[1.0, 2.0]), Ok(()));
        assert_eq!(
            first_difference("x", &[1.0, 2.5, 3.0], &[1.0, 2.0, 4.0]),
            Err("x: element 1 is 2.5e0, not 2e0".into())
        );
        // -0.0 and 0.0 are equal as floats, not as bits.
        assert!(first_difference("x", &[-0.0], &[0.0]).is_err());
        assert!(first_difference("x", &[1.0], &[1.0, 2.0]).is_err());
    }
}
