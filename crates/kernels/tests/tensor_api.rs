//! `terse_kernels::tensor`: one call over burn tensors on flex (the CPU
//! loops, bit-identical to `onebit`) and on wgpu (the cubecl kernels, on
//! lavapipe here): packed words equal to the CPU's, scales within 1e-6
//! relative, errors within 1e-6, for lengths 1, 31, 32, 33, 1000, 2^20+7
//! and fresh random inputs per run; decompression back into a tensor on the
//! same device.

use burn::tensor::{Device, DeviceKind, Tensor, TensorData};
use terse_kernels::onebit::{self, Scale, blocks_for, words_for};
use terse_kernels::server::Compressed;
use terse_kernels::tensor;
use terse_rng::SplitMix64;

fn fresh_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

fn to_vec(t: Tensor<1>) -> Vec<f32> {
    t.into_data().try_to_vec::<f32>().unwrap()
}

#[test]
fn tensors_compress_as_the_cpu_does_on_every_device() {
    let seed = fresh_seed();
    let mut rng = SplitMix64::new(seed);
    for device in [Device::flex(), Device::wgpu(DeviceKind::Cpu)] {
        let exact = device == Device::flex();
        for (len, block, scale) in [
            (1usize, 1usize << 20, Scale::L1),
            (31, 32, Scale::L2),
            (32, 32, Scale::L1),
            (33, 1 << 20, Scale::L1),
            (1000, 96, Scale::L2),
            ((1 << 20) + 7, 1 << 16, Scale::L1),
        ] {
            let what = format!("seed {seed}, {device:?}, len {len}, block {block}, {scale:?}");
            let x: Vec<f32> = (0..len).map(|_| rng.normal()).collect();
            let e0: Vec<f32> = (0..len).map(|_| 0.1 * rng.normal()).collect();
            let mut e_cpu = e0.clone();
            let mut bits = vec![0u32; words_for(len)];
            let mut scales = vec![0f32; blocks_for(len, block)];
            onebit::compress(&x, &mut e_cpu, block, scale, &mut bits, &mut scales);

            let xt = Tensor::<1>::from_data(TensorData::new(x.clone(), [len]), &device);
            let mut et = Tensor::<1>::from_data(TensorData::new(e0, [len]), &device);
            let (t_bits, t_scales) = tensor::compress(&xt, &mut et, block, scale).unwrap();
            assert_eq!(et.device(), device, "{what}: the error stays on its device");
            assert_eq!(t_bits, bits, "{what}: packed words");
            for (a, b) in t_scales.iter().zip(&scales) {
                let tol = if exact { 0.0 } else { 1e-6 * b.abs() };
                assert!((a - b).abs() <= tol, "{what}: scale {a} vs {b}");
            }
            for (i, (a, b)) in to_vec(et).iter().zip(&e_cpu).enumerate() {
                let tol = if exact { 0.0 } else { 1e-6 };
                assert!((a - b).abs() <= tol, "{what}: error {i}: {a} vs {b}");
            }
            // Decompression lands on the device, equal to the CPU's.
            let mut expected = vec![0f32; len];
            onebit::decompress(&bits, &scales, block, &mut expected);
            let packed = Compressed {
                bits: &bits,
                scales: &scales,
            };
            let out = tensor::decompress(packed, len, block, &device).unwrap();
            assert_eq!(out.device(), device);
            assert_eq!(to_vec(out), expected, "{what}: decompressed");
        }
    }
}

#[test]
fn mismatched_tensors_are_refused_with_the_reason() {
    let device = Device::flex();
    let x = Tensor::<1>::zeros([10], &device);
    let mut e = Tensor::<1>::zeros([9], &device);
    let err = tensor::compress(&x, &mut e, 32, Scale::L1).unwrap_err();
    assert_eq!(err.to_string(), "x has 10 elements, its error 9");
    assert_eq!(e.dims(), [9], "the error tensor is given back untouched");
    let lavapipe = Device::wgpu(DeviceKind::Cpu);
    let mut e = Tensor::<1>::zeros([10], &lavapipe);
    let err = tensor::compress(&x, &mut e, 32, Scale::L1).unwrap_err();
    assert!(err.to_string().starts_with("x is on"), "{err}");
}

/// A flat buffer taken from a tensor another one shares, or from a slice
/// at an offset into a larger buffer, is copied on the device into storage
/// of its own with the same values; one owned alone is taken as it is.
#[test]
fn shared_and_offset_tensors_become_buffers_of_their_own() {
    let lavapipe = Device::wgpu(DeviceKind::Cpu);
    let values: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5).collect();
    let whole = Tensor::<1>::from_data(TensorData::new(values.clone(), [1000]), &lavapipe);
    let read = |t: burn::backend::wgpu::CubeTensor| {
        terse_kernels::cube::tensor::<1>(t)
            .into_data()
            .try_to_vec::<f32>()
            .unwrap()
    };
    let shared = tensor::into_cube_buffer(whole.clone()).unwrap().unwrap();
    // Its own storage: doubling it in place leaves `whole` as it was.
    terse_kernels::device::optim::scale(&shared.client, &shared.handle, 1000, 2.0);
    let doubled: Vec<f32> = values.iter().map(|v| 2.0 * v).collect();
    assert_eq!(read(shared), doubled);
    assert_eq!(
        whole.clone().into_data().try_to_vec::<f32>().unwrap(),
        values
    );
    let slice = tensor::into_cube_buffer(whole.clone().slice(37..537))
        .unwrap()
        .unwrap();
    assert_eq!(read(slice), values[37..537]);
    assert!(
        tensor::into_cube_buffer(Tensor::<1>::zeros([3], &Device::flex()))
            .unwrap()
            .is_none()
    );
}
