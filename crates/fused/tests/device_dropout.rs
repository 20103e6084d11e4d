//! Dropout on a cubecl device (lavapipe: Mesa's Vulkan driver on the CPU)
//! draws the CPU's mask: terse-kernels' device factors, and `fused::dropout`
//! and `fused::dropout_add` under autodiff (one kernel each way, the
//! factors hashed inside) against flex, bit for bit.

use std::sync::Mutex;

use burn::nn::DropoutConfig;
use burn::tensor::{Device, DeviceKind, FloatDType, Tensor, TensorData};
use terse_fused::{self as fused, DropoutStream, SiteMask, with_dropout_stream};
use terse_kernels::dispatches::DispatchCounter;
use terse_kernels::tensor;

mod common;
use common::bytes_in_use;

/// Held by each test while it runs: the dispatch counter counts the whole
/// process's launches.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Dropout on a cubecl device draws its mask there, with the CPU's bits:
/// the device factors equal `SiteMask::factor` for every element (several
/// probabilities and keys, a length that is no multiple of the launch), and
/// `fused::dropout` under autodiff on lavapipe gives the flex result and
/// its gradient.
#[test]
fn dropout_masks_on_the_device_are_the_cpus() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
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

/// Kernel launches by name.
type Dispatched = std::collections::BTreeMap<&'static str, u64>;

/// `fused::dropout_add(x, r)` on `device` under autodiff with `x` in
/// `dtype` and r in f32, and the loss `Σ y·w`: the output, x's gradient
/// (as f32) and r's, and the kernels dispatched forward (up to the output
/// read back) and backward.
fn dropout_add_on(device: &Device, dtype: FloatDType) -> ([Vec<f32>; 3], [Dispatched; 2]) {
    let layer = DropoutConfig::new(0.1).init();
    let device = device.clone().autodiff();
    let tensor = |k: f32| {
        let values: Vec<f32> = (0..3 * 1001).map(|i| 3.0 * (i as f32 * k).sin()).collect();
        Tensor::<2>::from_data(TensorData::new(values, [3, 1001]), &device)
    };
    let x = tensor(0.37).cast(dtype).require_grad();
    let (r, w) = (tensor(0.11).require_grad(), tensor(0.73));
    x.clone().into_data();
    let stream = DropoutStream::new(3, 5, 1, 0);
    let forward = DispatchCounter::start();
    let y = with_dropout_stream(stream, || fused::dropout_add(x.clone(), r.clone(), &layer));
    let host = |t: Tensor<2>| t.into_data().try_to_vec::<f32>().unwrap();
    let y_host = host(y.clone());
    let forward = forward.by_kernel();
    let loss = (y * w).sum();
    loss.clone().into_data();
    let backward = DispatchCounter::start();
    let grads = loss.backward();
    let dx = host(x.grad(&grads).unwrap().cast(FloatDType::F32));
    let dr = host(r.grad(&grads).unwrap());
    ([y_host, dx, dr], [forward, backward.by_kernel()])
}

/// `fused::dropout_add` on lavapipe with `x` in `dtype` equals flex's
/// `widen(dropout(x)) + r` bit for bit (the output and both gradients) and
/// dispatches `forward_kernel` alone forward and one `backward_kernel` for
/// x's gradient, no factors kernel.
fn dropout_add_matches_flex(dtype: FloatDType, forward_kernel: &str, backward_kernel: &str) {
    let (cpu, _) = dropout_add_on(&Device::flex(), dtype);
    let (dev, [forward, backward]) = dropout_add_on(&Device::wgpu(DeviceKind::Cpu), dtype);
    for (what, (dev, cpu)) in ["forward", "x's gradient", "the residual's gradient"]
        .iter()
        .zip(dev.iter().zip(&cpu))
    {
        assert_eq!(dev, cpu, "{dtype:?}: {what}");
    }
    let dropped = cpu[1].iter().filter(|v| **v == 0.0).count();
    assert!((200..400).contains(&dropped), "{dropped} of 3003 dropped");
    println!("forward: {forward:#?}\nbackward: {backward:#?}");
    assert_eq!(forward.len(), 1, "forward: {forward:?}");
    assert!(forward.keys().all(|name| name.ends_with(forward_kernel)));
    let named = |part: &str| -> u64 {
        backward
            .iter()
            .filter(|(name, _)| name.contains(part))
            .map(|(_, n)| n)
            .sum()
    };
    assert_eq!(named(backward_kernel), 1, "backward: {backward:?}");
    assert_eq!(named("Factors"), 0, "backward: {backward:?}");
}

/// `fused::dropout_add` (a residual block's `dropout(x) + r`) on lavapipe
/// equals flex's dropout and sum bit for bit, forward and both gradients,
/// and dispatches one kernel forward and one backward for the pair (the
/// factors hashed inside; no factors kernel, no separate product or sum).
/// The loss `Σ y·w` makes x's gradient `w·f` and r's `w`.
#[test]
fn dropout_add_is_one_kernel_each_way_with_the_cpus_bits() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    dropout_add_matches_flex(FloatDType::F32, "::DroppedAddKernel", "::DroppedKernel");
}

/// Under mixed precision a residual block adds a half projection's dropout
/// to the f32 residual stream: `fused::dropout_add` of an fp16 `x` on
/// lavapipe is one kernel forward and one for x's gradient, and equals
/// flex bit for bit: the output, x's fp16 gradient (`fp16(f32(fp16(g))·f)`)
/// and r's.
#[test]
fn a_half_dropout_add_is_one_kernel_each_way_with_the_cpus_bits() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    dropout_add_matches_flex(
        FloatDType::F16,
        "::DroppedHalfAddKernel",
        "DroppedHalfGradKernel",
    );
}

/// What a residual block's `dropout(x) + r` leaves alive on lavapipe until
/// its backward pass, in tensors of `x`'s size: `fused::dropout_add` its
/// output alone (the factors are hashed again backward); the factors made
/// as a tensor and multiplied (the path before it) the output and the
/// factors, which autodiff keeps for the product's gradient. At BERT-base's
/// batch 32 and seq 128 that tensor is 12.6 MB, two per layer.
#[test]
fn dropout_add_keeps_no_factors_for_the_backward_pass() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let device = Device::wgpu(DeviceKind::Cpu).autodiff();
    let dims = [512, 768];
    let n = dims[0] * dims[1];
    let kept_by = |sum: &dyn Fn(Tensor<2>, Tensor<2>) -> Tensor<2>| -> f64 {
        let tensor = |k: f32| {
            let values: Vec<f32> = (0..n).map(|i| (i as f32 * k).sin()).collect();
            Tensor::<2>::from_data(TensorData::new(values, dims), &device).require_grad()
        };
        // x and r exist on the device before the count, and after it.
        let (x, r) = (tensor(0.37), tensor(0.11));
        x.clone().inner().into_data();
        r.clone().inner().into_data();
        let before = bytes_in_use() as f64;
        let y = sum(x.clone(), r.clone());
        y.clone().inner().into_data();
        let after = bytes_in_use() as f64;
        drop((x, r));
        (after - before) / (n * size_of::<f32>()) as f64
    };
    let layer = DropoutConfig::new(0.1).init();
    let fused_sum = kept_by(&|x, r| {
        with_dropout_stream(DropoutStream::new(3, 5, 1, 0), || {
            fused::dropout_add(x, r, &layer)
        })
    });
    let with_factors = kept_by(&|x, r| {
        let mask = SiteMask::new(0.1, 7);
        let factors = tensor::device_dropout_factors::<2>(&mask, x.shape(), &x.device()).unwrap();
        x * factors + r
    });
    println!(
        "x-sized tensors alive after the forward pass: fused {fused_sum:.2}, with the factors {with_factors:.2}"
    );
    assert!(fused_sum <= 1.05, "fused: {fused_sum:.2}");
    assert!(with_factors >= 1.95, "with the factors: {with_factors:.2}");
}
