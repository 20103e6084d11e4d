//! Throughput of the 1-bit compression (error-feedback sign pack with one
//! scale per 2^20-element block) against a memcpy of the same bytes,
//! measured in the same run.
//!
//! The compression reads x and e and writes e and the bits: about 12.1 bytes
//! per element, the memory-bound floor. A parallel memcpy of 6.05 bytes per
//! element moves as many (read + write), so `memcpy time / compress time` is
//! the fraction of the floor reached (target ≥ 50%), taken as the median over
//! rounds that alternate the two. The cubecl kernels are
//! timed on a wgpu device for information: lavapipe (a CPU rasteriser)
//! here, a real GPU with `--device wgpu` on a machine that has one.
//!
//! `cargo xtask bench kernels [--quick] [--device lavapipe|wgpu]`; writes
//! `results/bench/kernels.json` (`kernels-quick.json` with `--quick`).

use std::time::Instant;

use cubecl::device::{WgpuDevice, WgpuDeviceKind};
use cubecl::prelude::*;
use rayon::prelude::*;
use terse_kernels::device::{self, DeviceCompressed};
use terse_kernels::onebit::{self, Scale, blocks_for, words_for};
use terse_rng::SplitMix64;

const BLOCK: usize = 1 << 20;

fn best_of(repeats: usize, mut f: impl FnMut()) -> f64 {
    (0..repeats)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64() * 1e3
        })
        .fold(f64::INFINITY, f64::min)
}

/// Where the cubecl kernels are timed.
#[derive(Clone, Copy, PartialEq, clap::ValueEnum)]
enum Device {
    /// Mesa's CPU Vulkan driver
    Lavapipe,
    /// The default wgpu adapter (a GPU where there is one)
    Wgpu,
}

/// The benchmark's arguments, after `--` under cargo.
#[derive(clap::Parser)]
#[command(
    name = "kernels",
    bin_name = "kernels",
    about = "Times the 1-bit compression (sign pack with block scales, error feedback) against a \
             memcpy of the same bytes on the CPU, and the cubecl kernel on a wgpu device; \
             `cargo xtask bench kernels` runs it"
)]
struct Args {
    /// A smoke run: 2^22 elements and fewer rounds (2^26 otherwise)
    #[arg(long)]
    quick: bool,
    /// Where the cubecl kernels run
    #[arg(long, value_enum, default_value = "lavapipe")]
    device: Device,
    /// Passed by `cargo bench`; ignored
    #[arg(long, hide = true)]
    bench: bool,
}

fn main() {
    let Args { quick, device, .. } = clap::Parser::parse();
    let gpu = device == Device::Wgpu;
    let d: usize = if quick { 1 << 22 } else { 1 << 26 };
    let repeats = if quick { 3 } else { 5 };
    let rounds = if quick { 5 } else { 21 };
    let mut rng = SplitMix64::new(3);
    let x: Vec<f32> = (0..d).map(|_| rng.normal()).collect();
    let mut e = vec![0.0f32; d];
    let mut bits = vec![0u32; words_for(d)];
    let mut scales = vec![0.0f32; blocks_for(d, BLOCK)];

    // The floor: a parallel copy moving the same bytes (read + write).
    let bytes = d * 4 * 3 + words_for(d) * 4;
    let src = vec![1u8; bytes / 2];
    let mut dst = vec![0u8; bytes / 2];
    // This VM's memory bandwidth drifts by ±30% between seconds, so the
    // copy and the compression alternate and the fraction is the median of
    // the per-round ratios (times printed are the best of each).
    let mut copy = || {
        dst.par_chunks_mut(1 << 18)
            .zip(src.par_chunks(1 << 18))
            .for_each(|(d, s)| d.copy_from_slice(s));
    };
    let mut ratios = Vec::new();
    let (mut memcpy_ms, mut cpu_ms) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..rounds {
        let copy_ms = best_of(1, &mut copy);
        let compress_ms = best_of(1, || {
            onebit::compress(&x, &mut e, BLOCK, Scale::L1, &mut bits, &mut scales);
        });
        ratios.push(copy_ms / compress_ms);
        memcpy_ms = memcpy_ms.min(copy_ms);
        cpu_ms = cpu_ms.min(compress_ms);
    }
    ratios.sort_by(f64::total_cmp);
    let fraction = ratios[ratios.len() / 2];
    let decompress_ms = best_of(repeats, || {
        onebit::decompress(&bits, &scales, BLOCK, &mut e);
    });

    let kind = if gpu {
        WgpuDeviceKind::DefaultDevice
    } else {
        WgpuDeviceKind::Cpu
    };
    let client = cubecl::Device::Wgpu(WgpuDevice::new(kind)).client();
    // wgpu caps one buffer at 256 MiB by default: time the device on at most
    // 2^24 elements.
    let dd = d.min(1 << 24);
    let x_dev = client.create_from_slice(f32::as_bytes(&x[..dd]));
    let e_dev = client.create_from_slice(f32::as_bytes(&vec![0.0f32; dd]));
    let out = DeviceCompressed {
        bits: client.empty(words_for(dd) * 4),
        scales: client.empty(blocks_for(dd, BLOCK) * 4),
    };
    // The first call compiles the kernels; reading the scales back waits
    // for the queue.
    device::compress(&client, &x_dev, &e_dev, dd, BLOCK, Scale::L1, &out);
    let _ = client.read_one_unchecked(out.scales.clone());
    let device_ms = best_of(repeats, || {
        device::compress(&client, &x_dev, &e_dev, dd, BLOCK, Scale::L1, &out);
        let _ = client.read_one_unchecked(out.scales.clone());
    });

    let device_name = if gpu {
        "wgpu (default adapter)"
    } else {
        "lavapipe"
    };
    println!(
        "{d} elements, one scale per {BLOCK}; {} threads",
        rayon::current_num_threads()
    );
    println!(
        "memcpy of {:.1} MB (floor)   {memcpy_ms:8.2} ms",
        bytes as f64 / 2e6
    );
    println!(
        "cpu compress                 {cpu_ms:8.2} ms  {:.2} Gelem/s  {:.0}% of the floor (median of {rounds} paired rounds)",
        d as f64 / cpu_ms / 1e6,
        100.0 * fraction
    );
    println!("cpu decompress               {decompress_ms:8.2} ms");
    println!(
        "{device_name} compress of {dd} {device_ms:8.2} ms  {:.2} Gelem/s (for information)",
        dd as f64 / device_ms / 1e6
    );
    let json = format!(
        "{{\n  \"elements\": {d},\n  \"block\": {BLOCK},\n  \"threads\": {},\n  \
         \"memcpy_same_bytes_ms\": {memcpy_ms:.3},\n  \"cpu_compress_ms\": {cpu_ms:.3},\n  \
         \"cpu_fraction_of_floor\": {fraction:.3},\n  \"cpu_decompress_ms\": {decompress_ms:.3},\n  \
         \"device\": \"{device_name}\",\n  \"device_elements\": {dd},\n  \"device_compress_ms\": {device_ms:.3}\n}}\n",
        rayon::current_num_threads()
    );
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../results/bench");
    std::fs::create_dir_all(&out).unwrap();
    let name = match (quick, gpu) {
        (_, true) => "kernels-wgpu.json",
        (true, false) => "kernels-quick.json",
        (false, false) => "kernels.json",
    };
    std::fs::write(out.join(name), json).unwrap();
    println!("wrote results/bench/{name}");
}
