//! Dropout on a cubecl device (lavapipe: Mesa's Vulkan driver on the CPU)
//! draws the CPU's mask: terse-kernels' device factors and the fused
//! dropout op under autodiff against flex.

use burn::tensor::{Device, DeviceKind, Tensor, TensorData};
use terse_fused::{self as fused, DropoutStream, SiteMask, with_dropout_stream};
use terse_kernels::tensor;

/// Dropout on a cubecl device draws its mask there, with the CPU's bits:
/// the device factors equal `SiteMask::factor` for every element (several
/// probabilities and keys, a length that is no multiple of the launch), and
/// `fused::dropout` under autodiff on lavapipe gives the flex result and
/// its gradient.
#[test]
fn dropout_masks_on_the_device_are_the_cpus() {
    use burn::nn::DropoutConfig;
    let lavapipe = Device::wgpu(DeviceKind::Cpu);
    let n = 100_003;
    for (prob, key) in [(0.1f32, 7u64), (0.5, u64::MAX - 3), (0.0, 1)] {
        let mask = SiteMask::new(prob, key);
        let factors: Tensor<1> =
            tensor::device_dropout_factors(&mask, [n].into(), &lavapipe).unwrap();
        let got = factors.into_data().try_to_vec::<f32>().unwrap();
        let want: Vec<f32> = (0..n).map(|j| mask.factor(j)).collect();
        assert_eq!(got, want, "p {prob}, key {key}");
    }
    assert!(
        tensor::device_dropout_factors::<1>(&SiteMask::new(0.1, 1), [4].into(), &Device::flex())
            .is_none()
    );

    let layer = DropoutConfig::new(0.1).init();
    let values: Vec<f32> = (0..4 * 999).map(|i| (i as f32 * 0.37).sin()).collect();
    let run = |device: &Device| {
        let device = device.clone().autodiff();
        let x = Tensor::<2>::from_data(TensorData::new(values.clone(), [4, 999]), &device)
            .require_grad();
        let stream = DropoutStream::new(3, 5, 1, 0);
        let y = with_dropout_stream(stream, || fused::dropout(x.clone(), &layer));
        let grads = (y.clone() * y.clone()).sum().backward();
        let dx = x
            .grad(&grads)
            .unwrap()
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        (y.into_data().try_to_vec::<f32>().unwrap(), dx)
    };
    let (y_cpu, dx_cpu) = run(&Device::flex());
    let (y_dev, dx_dev) = run(&lavapipe);
    assert_eq!(y_dev, y_cpu, "forward");
    assert_eq!(dx_dev, dx_cpu, "gradient");
    let dropped = y_cpu.iter().filter(|v| **v == 0.0).count();
    assert!((300..500).contains(&dropped), "{dropped} of 3996 dropped");
}
