//! What the lavapipe tests of the device layers share: the device and
//! deterministic inputs.

use burn::tensor::{Device, DeviceKind};

/// Mesa's Vulkan driver on the CPU (needs `XDG_RUNTIME_DIR`).
pub fn lavapipe() -> Device {
    Device::wgpu(DeviceKind::Cpu)
}

/// Deterministic values in [-1, 1), a different sequence per `seed`.
pub fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let h = (i as u32 ^ seed.wrapping_mul(0x9e37_79b9)).wrapping_mul(0x85eb_ca6b);
            let h = (h ^ (h >> 13)).wrapping_mul(0xc2b2_ae35);
            ((h ^ (h >> 16)) as f32 / u32::MAX as f32) * 2.0 - 1.0
        })
        .collect()
}
