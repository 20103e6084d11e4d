//! The wgpu backend is compiled in and runs here: on a CPU-only machine that
//! is Mesa's lavapipe (`mesa-vulkan-drivers`, installed by `.ci/run`), named
//! explicitly as wgpu's CPU adapter. A matmul and a softmax on it must agree
//! with the flex backend to float tolerance: the same model code runs on both
//! devices, which the GPU kernels and trainer build on.

use burn::tensor::{Device, DeviceKind, Tensor, TensorData, activation};

fn inputs(device: &Device) -> (Tensor<2>, Tensor<2>) {
    let a: Vec<f32> = (0..64 * 48)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
        .collect();
    let b: Vec<f32> = (0..48 * 40)
        .map(|i| ((i * 53 % 97) as f32 - 48.0) / 48.0)
        .collect();
    (
        Tensor::from_data(TensorData::new(a, [64, 48]), device),
        Tensor::from_data(TensorData::new(b, [48, 40]), device),
    )
}

fn compute(device: &Device) -> Vec<f32> {
    let (a, b) = inputs(device);
    activation::softmax(a.matmul(b), 1)
        .into_data()
        .iter::<f32>()
        .collect()
}

#[test]
fn lavapipe_agrees_with_flex() {
    let on_flex = compute(&Device::flex());
    let on_wgpu = compute(&Device::wgpu(DeviceKind::Cpu));
    assert_eq!(on_flex.len(), 64 * 40);
    let worst = on_flex
        .iter()
        .zip(&on_wgpu)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(
        worst <= 1e-5,
        "wgpu (lavapipe) differs from flex by {worst}"
    );
    // Softmax rows sum to one on both devices: the kernels really ran.
    for row in on_wgpu.chunks(40) {
        assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-5);
    }
}
