//! The linear layers and LayerNorm on a cubecl device (lavapipe: Mesa's
//! Vulkan driver on the CPU), terse's autodiff steps whose reductions run
//! cubek's parallel routines (`device_linear.rs`, `device_layer_norm.rs`),
//! against a float64 reference and burn's own layers: the loss is `Σ y·r`
//! for a fixed `r`, so `∂L/∂y = r` and the bias gradient is exactly the
//! column sums of `r`. GELU (`fused::dense_gelu`) against its exact
//! derivative.

use std::sync::Mutex;

use burn::nn::{LayerNormConfig, Linear, LinearConfig};
use burn::tensor::{Device, Tensor, TensorData};
use terse_fused as fused;
use terse_kernels::dispatches::DispatchCounter;

mod common;
use common::{lavapipe, max_error, values, vec_of};

/// Held by each test while it runs: the dispatch counter counts the whole
/// process's launches.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn column_sums(r: &[f32], d: usize) -> Vec<f64> {
    let mut sums = vec![0.0f64; d];
    for row in r.chunks(d) {
        for (s, v) in sums.iter_mut().zip(row) {
            *s += f64::from(*v);
        }
    }
    sums
}

/// A `Linear` on `device` with terse's deterministic weights.
fn dense(d_in: usize, d_out: usize, device: &Device) -> Linear {
    let mut layer = LinearConfig::new(d_in, d_out).init(device);
    let w = Tensor::<2>::from_data(
        TensorData::new(values(d_in * d_out, 11), [d_in, d_out]),
        device,
    );
    let b = Tensor::<1>::from_data(TensorData::new(values(d_out, 12), [d_out]), device);
    layer.weight = layer.weight.map(|_| w.require_grad());
    layer.bias = layer.bias.map(|p| p.map(|_| b.require_grad()));
    layer
}

/// A BERT-base-shaped bias gradient (`[4096, 768]`, batch 32 × seq 128)
/// and an odd one: the bias gradient of `fused::linear` on lavapipe is the
/// float64 column sums of `∂L/∂y`, W's is `xᵀ·∂L/∂y` within float
/// rounding, and x's gradient and the output equal burn's own `Linear` on
/// the same device.
#[test]
fn linear_bias_gradient_is_the_column_sums_on_the_device() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let device = lavapipe().autodiff();
    for (batch, seq, d_in, d_out) in [(32, 128, 8, 768), (3, 7, 5, 37)] {
        let layer = dense(d_in, d_out, &device);
        let x_values = values(batch * seq * d_in, 13);
        let r_values = values(batch * seq * d_out, 14);
        let x = || {
            Tensor::<3>::from_data(
                TensorData::new(x_values.clone(), [batch, seq, d_in]),
                &device,
            )
            .require_grad()
        };
        let r = Tensor::<3>::from_data(
            TensorData::new(r_values.clone(), [batch, seq, d_out]),
            &device,
        );
        let run = |y: Tensor<3>, x: &Tensor<3>| {
            let grads = (y.clone() * r.clone()).sum().backward();
            let dx = vec_of(x.grad(&grads).unwrap());
            let dw = vec_of(layer.weight.grad(&grads).unwrap());
            let db = vec_of(layer.bias.as_ref().unwrap().grad(&grads).unwrap());
            (vec_of(y), dx, dw, db)
        };
        let x_terse = x();
        let terse = run(fused::linear(x_terse.clone(), &layer), &x_terse);
        let x_burn = x();
        let burn = run(layer.forward(x_burn.clone()), &x_burn);

        let want_db = column_sums(&r_values, d_out);
        let err = max_error(&terse.3, &want_db);
        assert!(
            err < 2e-5,
            "[{batch}, {seq}, {d_out}] bias gradient: {err:e}"
        );
        assert_eq!(terse.0, burn.0, "output");
        assert_eq!(terse.1, burn.1, "x's gradient");
        // W's gradient `xᵀ·r`: the same matmul as burn's, though fusion
        // may pick another kernel for it next to another op.
        let mut want_dw = vec![0.0f64; d_in * d_out];
        for (x, r) in x_values.chunks(d_in).zip(r_values.chunks(d_out)) {
            for (i, xi) in x.iter().enumerate() {
                for (j, rj) in r.iter().enumerate() {
                    want_dw[i * d_out + j] += f64::from(*xi) * f64::from(*rj);
                }
            }
        }
        let (err, burn_err) = (max_error(&terse.2, &want_dw), max_error(&burn.2, &want_dw));
        // 4096-term f32 dot products: 3.7e-5 here, burn's own 1.4e-5.
        assert!(err < 1e-4, "W's gradient: {err:e} (burn's {burn_err:e})");
    }
}

/// `fused::linear_transposed` (the tied MLM decoder, W stored `[out, in]`)
/// on lavapipe: bias gradient the column sums, W's gradient in its stored
/// layout equal to burn's ops.
#[test]
fn transposed_linear_gradients_on_the_device() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let device = lavapipe().autodiff();
    let (rows, d_in, d_out) = (300, 16, 1000);
    let param = |n: &[usize], seed| {
        let len = n.iter().product();
        Tensor::<2>::from_data(TensorData::new(values(len, seed), n.to_vec()), &device)
            .require_grad()
    };
    let r_values = values(rows * d_out, 24);
    let r = Tensor::<2>::from_data(TensorData::new(r_values.clone(), [rows, d_out]), &device);
    let run = |terse: bool| {
        let (x, w) = (param(&[rows, d_in], 21), param(&[d_out, d_in], 22));
        let b = Tensor::<1>::from_data(TensorData::new(values(d_out, 23), [d_out]), &device)
            .require_grad();
        let y = if terse {
            fused::linear_transposed(x.clone(), w.clone(), b.clone())
        } else {
            x.clone().matmul(w.clone().transpose()) + b.clone().unsqueeze_dim(0)
        };
        let grads = (y.clone() * r.clone()).sum().backward();
        let grad = |t: Tensor<2>| vec_of(t.grad(&grads).unwrap());
        (vec_of(y), grad(x), grad(w), vec_of(b.grad(&grads).unwrap()))
    };
    let (terse, burn) = (run(true), run(false));
    let err = max_error(&terse.3, &column_sums(&r_values, d_out));
    assert!(err < 2e-5, "bias gradient: {err:e}");
    assert_eq!(terse.0, burn.0, "output");
    assert_eq!(terse.1, burn.1, "x's gradient");
    assert_eq!(terse.2, burn.2, "W's gradient");
}

/// `fused::layer_norm` on lavapipe, BERT-base's shape: the output is
/// `x̂·γ + β` and β's gradient the column sums of `∂L/∂y`, γ's those of
/// `∂L/∂y · x̂` (x̂ normalised in float64); the output and x's gradient
/// are within float rounding of burn's `LayerNorm`. (burn's own sums, cubek's `Unit` routine, measured
/// 2.8e-5 and 5.5e-5 here; terse's 1.0e-5 and 9.8e-6.)
#[test]
fn layer_norm_parameter_gradients_on_the_device() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let device = lavapipe().autodiff();
    let (rows, d, eps) = (4096, 768, 1e-12);
    let mut norm = LayerNormConfig::new(d).with_epsilon(eps).init(&device);
    let gamma_values = values(d, 31);
    let gamma = Tensor::<1>::from_data(TensorData::new(gamma_values.clone(), [d]), &device);
    norm.gamma = norm.gamma.map(|_| gamma.require_grad());
    let beta_values = values(d, 34);
    let beta = Tensor::<1>::from_data(TensorData::new(beta_values.clone(), [d]), &device);
    norm.beta = norm.beta.map(|p| p.map(|_| beta.require_grad()));
    let x_values: Vec<f32> = values(rows * d, 32).iter().map(|v| 3.0 * v + 0.5).collect();
    let r_values = values(rows * d, 33);
    // BERT-base's activations, `[batch 32, seq 128, hidden 768]`.
    let shape = [32, rows / 32, d];
    let r = Tensor::<3>::from_data(TensorData::new(r_values.clone(), shape), &device);
    let run = |terse: bool| {
        let x = Tensor::<3>::from_data(TensorData::new(x_values.clone(), shape), &device)
            .require_grad();
        let y = if terse {
            fused::layer_norm(x.clone(), &norm, eps)
        } else {
            norm.forward(x.clone())
        };
        let grads = (y.clone() * r.clone()).sum().backward();
        let dx = vec_of(x.grad(&grads).unwrap());
        let dgamma = vec_of(norm.gamma.grad(&grads).unwrap());
        let dbeta = vec_of(norm.beta.as_ref().unwrap().grad(&grads).unwrap());
        (vec_of(y), dx, dgamma, dbeta)
    };
    let (terse, burn) = (run(true), run(false));

    let mut want_dgamma = vec![0.0f64; d];
    let mut want_dx = vec![0.0f64; rows * d];
    let mut want_y = vec![0.0f64; rows * d];
    for (row, x) in x_values.chunks(d).enumerate() {
        let mean = x.iter().map(|v| f64::from(*v)).sum::<f64>() / d as f64;
        let var = x
            .iter()
            .map(|v| (f64::from(*v) - mean).powi(2))
            .sum::<f64>()
            / d as f64;
        let denom = (var + eps).sqrt();
        let xhat: Vec<f64> = x.iter().map(|&v| (f64::from(v) - mean) / denom).collect();
        let r = &r_values[row * d..(row + 1) * d];
        for j in 0..d {
            want_dgamma[j] += xhat[j] * f64::from(r[j]);
            want_y[row * d + j] = xhat[j] * f64::from(gamma_values[j]) + f64::from(beta_values[j]);
        }
        // ∂x = (a − mean(a) − x̂·mean(a·x̂)) / denom with a = g·γ.
        let a: Vec<f64> = (0..d)
            .map(|j| f64::from(r[j]) * f64::from(gamma_values[j]))
            .collect();
        let mean_a = a.iter().sum::<f64>() / d as f64;
        let mean_ax = a.iter().zip(&xhat).map(|(a, x)| a * x).sum::<f64>() / d as f64;
        for j in 0..d {
            want_dx[row * d + j] = (a[j] - mean_a - xhat[j] * mean_ax) / denom;
        }
    }
    let err = max_error(&terse.0, &want_y);
    eprintln!("output: {err:e} from float64");
    assert!(err < 2e-6, "output: {err:e}");
    let err = max_error(&terse.1, &want_dx);
    eprintln!("x's gradient: {err:e} from float64");
    assert!(err < 2e-5, "x's gradient: {err:e}");
    let err = max_error(&terse.3, &column_sums(&r_values, d));
    assert!(err < 2e-5, "β's gradient: {err:e}");
    let err = max_error(&terse.2, &want_dgamma);
    assert!(err < 2e-5, "γ's gradient: {err:e}");
    let close = |a: &[f32], b: &[f32], what: &str| {
        let worst = a
            .iter()
            .zip(b)
            .map(|(a, b)| (a - b).abs() / (1.0 + b.abs()))
            .fold(0.0f32, f32::max);
        assert!(worst < 1e-5, "{what}: {worst:e}");
    };
    close(&terse.0, &burn.0, "output");
    close(&terse.1, &burn.1, "x's gradient");
}

/// LayerNorm's forward pass on a cubecl device is one kernel
/// (`terse_kernels::device::layer_norm_forward`), with autodiff (training:
/// x̂ and the denominators kept) and without (evaluation). As burn's ops
/// under fusion it was four here: two row sums and two fused element-wise
/// steps.
#[test]
fn layer_norm_forward_is_one_kernel() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let (rows, d) = (48, 96);
    for device in [lavapipe(), lavapipe().autodiff()] {
        let norm = LayerNormConfig::new(d).init(&device);
        // γ's and β's fills run before the count (fusion defers them).
        vec_of(norm.gamma.val());
        vec_of(norm.beta.as_ref().unwrap().val());
        let x = Tensor::<2>::from_data(TensorData::new(values(rows * d, 35), [rows, d]), &device);
        let counter = DispatchCounter::start();
        let y = fused::layer_norm(x, &norm, 1e-12);
        vec_of(y);
        let dispatched = counter.by_kernel();
        assert_eq!(
            dispatched.values().sum::<u64>(),
            1,
            "{device:?}: {dispatched:?}"
        );
        let (name, _) = dispatched.first_key_value().unwrap();
        assert!(name.contains("layer_norm::forward_kernel"), "{name}");
    }
}

/// Without autodiff (evaluation) the op on a cubecl device is burn's
/// `linear`, bit for bit.
#[test]
fn forward_without_autodiff_on_the_device() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let device = lavapipe();
    let layer = LinearConfig::new(4, 6).init(&device);
    let x = Tensor::<2>::from_data(TensorData::new(values(12, 41), [3, 4]), &device);
    let want = vec_of(layer.forward(x.clone()));
    assert_eq!(vec_of(fused::linear(x, &layer)), want);
}

/// `fused::dense_gelu` on lavapipe (`device_gelu.rs`): the output and x's
/// gradient against float64 with the exact GELU, `x·Φ(x)` and its
/// derivative `Φ(x) + x·φ(x)`, over pre-activations from −6 to 6. burn's
/// own `gelu` (its backward the tanh approximation's derivative, up to
/// 8.7e-4 off) fails this at 1e-4.
#[test]
fn dense_gelu_has_the_exact_derivative_on_the_device() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let device = lavapipe().autodiff();
    let (rows, d_in, d_out) = (64, 8, 96);
    let layer = dense(d_in, d_out, &device);
    // Inputs to ±3 so that the pre-activations reach ±6.
    let x_values: Vec<f32> = values(rows * d_in, 21).iter().map(|v| 3.0 * v).collect();
    let r_values = values(rows * d_out, 22);
    let x = Tensor::<2>::from_data(TensorData::new(x_values.clone(), [rows, d_in]), &device)
        .require_grad();
    let r = Tensor::<2>::from_data(TensorData::new(r_values.clone(), [rows, d_out]), &device);
    let y = fused::dense_gelu(x.clone(), &layer);
    let grads = (y.clone() * r).sum().backward();
    let (y, dx) = (vec_of(y), vec_of(x.grad(&grads).unwrap()));

    let w = values(d_in * d_out, 11);
    let b = values(d_out, 12);
    let (mut want_y, mut want_dx) = (vec![0.0f64; rows * d_out], vec![0.0f64; rows * d_in]);
    let (mut lowest, mut highest) = (0.0f64, 0.0f64);
    for i in 0..rows {
        for j in 0..d_out {
            let z = f64::from(b[j])
                + (0..d_in)
                    .map(|l| f64::from(x_values[i * d_in + l]) * f64::from(w[l * d_out + j]))
                    .sum::<f64>();
            (lowest, highest) = (lowest.min(z), highest.max(z));
            let cdf = 0.5 * (1.0 + libm::erf(z / std::f64::consts::SQRT_2));
            let pdf = (-0.5 * z * z).exp() / (2.0 * std::f64::consts::PI).sqrt();
            want_y[i * d_out + j] = z * cdf;
            let g = f64::from(r_values[i * d_out + j]) * (cdf + z * pdf);
            for l in 0..d_in {
                want_dx[i * d_in + l] += g * f64::from(w[l * d_out + j]);
            }
        }
    }
    assert!(
        lowest < -5.0 && highest > 5.0,
        "pre-activations {lowest}..{highest}"
    );
    let (y_err, dx_err) = (max_error(&y, &want_y), max_error(&dx, &want_dx));
    assert!(y_err < 1e-5, "GELU's output: {y_err:e}");
    assert!(dx_err < 1e-5, "x's gradient through GELU: {dx_err:e}");
}

/// `fused::dropout_add_layer_norm`, a post-LN block's LayerNorm of
/// `dropout(x) + r`, on lavapipe: one kernel forward, the sum formed inside
/// it, and the output and the gradients of x, r, γ and β bit for bit those
/// of the two steps it replaces (`fused::dropout_add`, then
/// `fused::layer_norm`, each checked against flex and float64 by its own
/// test).
#[test]
fn dropout_add_layer_norm_is_one_kernel_with_the_two_steps_bits() {
    use burn::nn::DropoutConfig;
    use terse_fused::{DropoutStream, with_dropout_stream};
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let device = lavapipe().autodiff();
    let (rows, d, eps) = (3 * 37, 96, 1e-12);
    let dropout = DropoutConfig::new(0.1).init();
    let mut norm = LayerNormConfig::new(d).with_epsilon(eps).init(&device);
    let gamma = Tensor::<1>::from_data(TensorData::new(values(d, 51), [d]), &device);
    let beta = Tensor::<1>::from_data(TensorData::new(values(d, 52), [d]), &device);
    norm.gamma = norm.gamma.map(|_| gamma.require_grad());
    norm.beta = norm.beta.map(|p| p.map(|_| beta.require_grad()));
    vec_of(norm.gamma.val());
    vec_of(norm.beta.as_ref().unwrap().val());
    let shape = [3, rows / 3, d];
    let tensor = |seed| {
        let values: Vec<f32> = values(rows * d, seed)
            .iter()
            .map(|v| 2.0 * v + 0.3)
            .collect();
        Tensor::<3>::from_data(TensorData::new(values, shape), &device)
    };
    let w = tensor(55);
    vec_of(w.clone());
    let run = |fused_step: bool| {
        let (x, r) = (tensor(53).require_grad(), tensor(54).require_grad());
        vec_of(x.clone());
        vec_of(r.clone());
        let counter = DispatchCounter::start();
        let y = with_dropout_stream(DropoutStream::new(3, 5, 1, 0), || {
            if fused_step {
                fused::dropout_add_layer_norm(x.clone(), r.clone(), &dropout, &norm, eps)
            } else {
                fused::layer_norm(
                    fused::dropout_add(x.clone(), r.clone(), &dropout),
                    &norm,
                    eps,
                )
            }
        });
        let y_host = vec_of(y.clone());
        let forward = counter.by_kernel();
        let grads = (y * w.clone()).sum().backward();
        let grad = |t: &Tensor<3>| vec_of(t.grad(&grads).unwrap());
        let dgamma = vec_of(norm.gamma.grad(&grads).unwrap());
        let dbeta = vec_of(norm.beta.as_ref().unwrap().grad(&grads).unwrap());
        ([y_host, grad(&x), grad(&r), dgamma, dbeta], forward)
    };
    let (fused_values, forward) = run(true);
    let (two_steps, two_steps_forward) = run(false);
    println!("forward: {forward:?}\ntwo steps: {two_steps_forward:?}");
    for (what, (a, b)) in [
        "output",
        "x's gradient",
        "r's gradient",
        "γ's gradient",
        "β's gradient",
    ]
    .iter()
    .zip(fused_values.iter().zip(&two_steps))
    {
        assert_eq!(a, b, "{what}");
    }
    assert!(fused_values[1].contains(&0.0), "no element dropped");
    assert_eq!(forward.values().sum::<u64>(), 1, "{forward:?}");
    assert_eq!(
        two_steps_forward.values().sum::<u64>(),
        2,
        "{two_steps_forward:?}"
    );
}
