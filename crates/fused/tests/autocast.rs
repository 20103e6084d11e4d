//! `fused::with_half`: a linear layer under mixed precision computes in the
//! half type from half-rounded operands, and its fp32 parameters receive
//! fp32 gradients. Against a float64 re-implementation: y = x̃·W̃ + b̃ with
//! each operand rounded to the half type (round to nearest even), the
//! product accumulated exactly and rounded once more; dW = x̃ᵀ·1 and
//! db = n·1 for loss = Σy. On flex in bf16 and fp16, and on lavapipe in
//! whatever half type its Vulkan adapter computes (the cubecl path a CUDA
//! run takes).

use burn::nn::{Linear, LinearConfig};
use burn::tensor::{DType, Device, DeviceKind, FloatDType, Tensor, TensorData};
use terse_fused as fused;

const ROWS: usize = 24;
const D_IN: usize = 40;
const D_OUT: usize = 12;

/// `x` rounded to the half type's significand (8 bits for bf16, 11 for
/// fp16), to nearest, ties to even; the values here are far from both
/// types' subnormals and overflow.
fn round(x: f64, dtype: FloatDType) -> f64 {
    let bits = match dtype {
        FloatDType::BF16 => 8,
        FloatDType::F16 => 11,
        _ => return x,
    };
    if x == 0.0 {
        return 0.0;
    }
    let quantum = 2f64.powi(x.abs().log2().floor() as i32 - (bits - 1));
    (x / quantum).round_ties_even() * quantum
}

/// The half type's unit roundoff.
fn unit(dtype: FloatDType) -> f64 {
    match dtype {
        FloatDType::BF16 => 2f64.powi(-8),
        _ => 2f64.powi(-11),
    }
}

fn values(n: usize, salt: f32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            ((i as f32 * 0.731 + salt).sin() * 1.7).round() / 1.7 + (i as f32 * 0.013).cos() * 0.01
        })
        .collect()
}

/// The layer's output and its weight's and bias's gradients under
/// `with_half(dtype)` on `device`, with the output's dtype.
fn run(device: &Device, dtype: FloatDType) -> (Vec<f32>, Vec<f32>, Vec<f32>, DType) {
    let device = device.clone().autodiff();
    let mut layer: Linear = LinearConfig::new(D_IN, D_OUT).init(&device);
    let w = Tensor::<2>::from_data(
        TensorData::new(values(D_IN * D_OUT, 0.3), [D_IN, D_OUT]),
        &device,
    );
    let b = Tensor::<1>::from_data(TensorData::new(values(D_OUT, 1.1), [D_OUT]), &device);
    layer.weight = burn::module::Param::from_tensor(w);
    layer.bias = Some(burn::module::Param::from_tensor(b));
    let x = Tensor::<2>::from_data(
        TensorData::new(values(ROWS * D_IN, 2.9), [ROWS, D_IN]),
        &device,
    );
    let y = fused::with_half(Some(dtype), || fused::linear(x, &layer));
    let out_dtype = y.dtype();
    let grads = fused::widen(y.clone()).sum().backward();
    let vec = |t: Tensor<2>| {
        fused::widen(t)
            .into_data()
            .convert::<f32>()
            .try_to_vec::<f32>()
            .unwrap()
    };
    let dw = layer.weight.grad(&grads).expect("a weight gradient");
    let db = layer
        .bias
        .as_ref()
        .unwrap()
        .grad(&grads)
        .expect("a bias gradient");
    assert_eq!(dw.dtype(), DType::F32, "the fp32 master weight's gradient");
    (
        vec(y),
        dw.into_data().try_to_vec::<f32>().unwrap(),
        db.into_data().try_to_vec::<f32>().unwrap(),
        out_dtype,
    )
}

/// Checks `run`'s results against the float64 re-implementation.
fn check(device: &Device, dtype: FloatDType) {
    let (y, dw, db, out_dtype) = run(device, dtype);
    assert_eq!(out_dtype, DType::from(dtype), "the output's type");
    let (x, w, b) = (
        values(ROWS * D_IN, 2.9),
        values(D_IN * D_OUT, 0.3),
        values(D_OUT, 1.1),
    );
    let r = |v: f32| round(f64::from(v), dtype);
    let u = unit(dtype);
    for i in 0..ROWS {
        for j in 0..D_OUT {
            let exact: f64 = (0..D_IN)
                .map(|k| r(x[i * D_IN + k]) * r(w[k * D_OUT + j]))
                .sum::<f64>();
            // The product rounds once to half (≤ u relative) and the bias
            // add once more; f32 accumulation adds far less.
            let want = exact + r(b[j]);
            let scale: f64 = (0..D_IN)
                .map(|k| (r(x[i * D_IN + k]) * r(w[k * D_OUT + j])).abs())
                .sum::<f64>()
                + r(b[j]).abs();
            let got = f64::from(y[i * D_OUT + j]);
            assert!(
                (got - want).abs() <= 2.5 * u * scale,
                "{dtype:?} y[{i},{j}] = {got}, float64 {want}"
            );
        }
    }
    for k in 0..D_IN {
        let want: f64 = (0..ROWS).map(|i| r(x[i * D_IN + k])).sum();
        let scale: f64 = (0..ROWS).map(|i| r(x[i * D_IN + k]).abs()).sum();
        for j in 0..D_OUT {
            let got = f64::from(dw[k * D_OUT + j]);
            assert!(
                (got - want).abs() <= 2.5 * u * scale,
                "{dtype:?} dW[{k},{j}] = {got}, float64 {want}"
            );
        }
    }
    for (j, got) in db.iter().enumerate() {
        assert!(
            (f64::from(*got) - ROWS as f64).abs() <= 2.5 * u * ROWS as f64,
            "db[{j}] = {got}"
        );
    }
    // Not fp32: some output differs from the unrounded product.
    let fp32_like = (0..ROWS * D_OUT).all(|n| {
        let (i, j) = (n / D_OUT, n % D_OUT);
        let full: f64 = (0..D_IN)
            .map(|k| f64::from(x[i * D_IN + k]) * f64::from(w[k * D_OUT + j]))
            .sum::<f64>()
            + f64::from(b[j]);
        (f64::from(y[n]) - full).abs() <= 1e-6 * full.abs().max(1.0)
    });
    assert!(!fp32_like, "{dtype:?}: computed in fp32");
}

#[test]
fn a_linear_layer_computes_in_the_half_type_on_flex() {
    for dtype in [FloatDType::BF16, FloatDType::F16] {
        check(&Device::flex(), dtype);
    }
}

#[test]
fn a_linear_layer_computes_in_fp16_on_lavapipe() {
    check(&Device::wgpu(DeviceKind::Cpu), FloatDType::F16);
}

/// Dropout of half activations scales each kept one in f32 and rounds it
/// once to the half type (PyTorch's dropout kernel): for every kept
/// element, `round_half(round_f32(x·(1/(1−p))))`. Scaling by the factor
/// rounded to bf16 first (1.109375 for 1.1111 at p = 0.1, what terse did
/// before stop 80) fails it.
#[test]
fn dropout_scales_half_activations_in_f32_and_rounds_once() {
    use burn::nn::DropoutConfig;
    use fused::{DropoutStream, with_dropout_stream};

    let layer = DropoutConfig::new(0.1).init();
    let factor = 1.0f32 / (1.0 - 0.1f32);
    for dtype in [FloatDType::BF16, FloatDType::F16] {
        let device = Device::flex().autodiff();
        let x: Vec<f32> = values(4096, 0.7)
            .iter()
            .map(|&v| round(f64::from(v * 3.0), dtype) as f32)
            .collect();
        let y = fused::with_half(Some(dtype), || {
            let input =
                Tensor::<1>::from_data(TensorData::new(x.clone(), [x.len()]), &device).cast(dtype);
            let stream = DropoutStream::new(3, 5, 1, 0);
            with_dropout_stream(stream, || fused::dropout(input, &layer))
        });
        assert_eq!(y.dtype(), DType::from(dtype));
        let y = y
            .cast(FloatDType::F32)
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        let mut kept = 0;
        for (i, (&xi, &yi)) in x.iter().zip(&y).enumerate() {
            if yi == 0.0 && xi != 0.0 {
                continue;
            }
            kept += 1;
            let want = round(f64::from(xi * factor), dtype);
            assert_eq!(
                f64::from(yi),
                want,
                "{dtype:?} element {i}: {xi} kept as {yi}"
            );
        }
        assert!(kept > 3500, "{kept} of 4096 kept");
    }
}
