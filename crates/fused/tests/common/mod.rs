//! What the tests of terse-fused share: the lavapipe device and
//! deterministic inputs. (Not every test binary uses every helper.)

use burn::tensor::{Device, DeviceKind, Tensor};
use terse_kernels::dispatches::DispatchCounter;

/// Mesa's Vulkan driver on the CPU (needs `XDG_RUNTIME_DIR`).
#[allow(dead_code)]
pub fn lavapipe() -> Device {
    Device::wgpu(DeviceKind::Cpu)
}

/// Deterministic values in [-1, 1), a different sequence per `seed`.
#[allow(dead_code)]
pub fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let h = (i as u32 ^ seed.wrapping_mul(0x9e37_79b9)).wrapping_mul(0x85eb_ca6b);
            let h = (h ^ (h >> 13)).wrapping_mul(0xc2b2_ae35);
            ((h ^ (h >> 16)) as f32 / u32::MAX as f32) * 2.0 - 1.0
        })
        .collect()
}

/// `t`'s values on the host. (Not every test binary uses every helper.)
#[allow(dead_code)]
pub fn vec_of<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().try_to_vec::<f32>().unwrap()
}

/// The largest `|got - want| / (1 + |want|)`.
#[allow(dead_code)]
pub fn max_error(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(want)
        .map(|(g, w)| (f64::from(*g) - w).abs() / (1.0 + w.abs()))
        .fold(0.0, f64::max)
}

/// An attention mask bias `[batch, seq]` (row-major): 0 where attended,
/// the lowest float on padding, which is the second sequence's last third.
#[allow(dead_code)]
pub fn padding_bias(batch: usize, seq: usize) -> Vec<f32> {
    (0..batch * seq)
        .map(|i| {
            if i / seq == 1 && i % seq >= seq - seq / 3 {
                f32::MIN
            } else {
                0.0
            }
        })
        .collect()
}

/// The launches of cubecl's contiguous copy (`CopyKernel`,
/// `CopyKernelPack`: a strided tensor made contiguous) that `counter` saw,
/// by kernel.
#[allow(dead_code)]
pub fn contiguous_copies(counter: &DispatchCounter) -> Vec<(&'static str, u64)> {
    counter
        .by_kernel()
        .into_iter()
        .filter(|(name, _)| name.contains("tensor::contiguous"))
        .collect()
}

/// Bytes in use on lavapipe (cubecl's memory manager, every stream; reads
/// nothing from the device).
#[allow(dead_code)]
pub fn bytes_in_use() -> u64 {
    use burn_cubecl::cubecl::{self, MemoryScope, device::WgpuDevice, device::WgpuDeviceKind};
    cubecl::Device::Wgpu(WgpuDevice::new(WgpuDeviceKind::Cpu))
        .client()
        .memory_report(MemoryScope::Device)
        .usage()
        .bytes_in_use
}
