//! The mean cross-entropy on a cubecl device (lavapipe: Mesa's Vulkan
//! driver on the CPU), terse's one-step op with parallel row reductions
//! (`device_cross_entropy.rs`), against a float64 reference at the MLM
//! loss's shape and against burn's `CrossEntropyLoss` on the same device.

use burn::nn::loss::CrossEntropyLossConfig;
use burn::tensor::{Device, Int, Tensor, TensorData};
use terse_fused as fused;

mod common;
use common::{lavapipe, values};

fn labels(n: usize, classes: usize) -> Vec<i64> {
    (0..n).map(|i| ((i * 7919 + 13) % classes) as i64).collect()
}

/// The loss and the logits' gradient (of the loss itself) on `device`.
fn loss_and_gradient(
    logits: &[f32],
    labels: &[i64],
    classes: usize,
    device: &Device,
    terse: bool,
) -> (f32, Vec<f32>) {
    let n = labels.len();
    let device = device.clone().autodiff();
    let x = Tensor::<2>::from_data(TensorData::new(logits.to_vec(), [n, classes]), &device)
        .require_grad();
    let y = Tensor::<1, Int>::from_data(TensorData::new(labels.to_vec(), [n]), &device);
    let loss = if terse {
        fused::cross_entropy(x.clone(), y)
    } else {
        CrossEntropyLossConfig::new()
            .init(&device)
            .forward(x.clone(), y)
    };
    let grads = loss.backward();
    let value = loss.into_data().try_to_vec::<f32>().unwrap()[0];
    let dx = x
        .grad(&grads)
        .unwrap()
        .into_data()
        .try_to_vec::<f32>()
        .unwrap();
    (value, dx)
}

/// The MLM loss's shape at BERT batch 32 (~640 masked tokens, 30 522
/// words): the loss and every element of the gradient
/// `(softmax − onehot) / n` within float rounding of float64.
#[test]
fn mlm_sized_cross_entropy_matches_float64_on_the_device() {
    let (n, classes) = (640, 30_522);
    let logits: Vec<f32> = values(n * classes, 51).iter().map(|v| 6.0 * v).collect();
    let labels = labels(n, classes);
    let (loss, dx) = loss_and_gradient(&logits, &labels, classes, &lavapipe(), true);

    let mut want_loss = 0.0f64;
    let mut worst = 0.0f64;
    for (i, row) in logits.chunks(classes).enumerate() {
        let max = row.iter().fold(f64::MIN, |m, v| m.max(f64::from(*v)));
        let sum: f64 = row.iter().map(|v| (f64::from(*v) - max).exp()).sum();
        let lse = sum.ln() + max;
        let label = labels[i] as usize;
        want_loss += lse - f64::from(row[label]);
        for (j, v) in row.iter().enumerate() {
            let onehot = if j == label { 1.0 } else { 0.0 };
            let want = ((f64::from(*v) - lse).exp() - onehot) / n as f64;
            // Relative to the largest gradient element, 1/n.
            worst = worst.max((f64::from(dx[i * classes + j]) - want).abs() * n as f64);
        }
    }
    want_loss /= n as f64;
    let loss_error = (f64::from(loss) - want_loss).abs() / want_loss;
    assert!(
        loss_error < 1e-6,
        "loss {loss} against {want_loss}: {loss_error:e}"
    );
    assert!(worst < 1e-6, "gradient: {worst:e} of 1/n");
}

/// A few rows on lavapipe: the same loss and gradient as burn's
/// `CrossEntropyLoss` there, within float rounding; and the NSP head's
/// two classes.
#[test]
fn cross_entropy_matches_burns_on_the_device() {
    for (n, classes) in [(5, 7), (32, 2), (3, 1000)] {
        let logits: Vec<f32> = values(n * classes, 52).iter().map(|v| 4.0 * v).collect();
        let labels = labels(n, classes);
        let terse = loss_and_gradient(&logits, &labels, classes, &lavapipe(), true);
        let burn = loss_and_gradient(&logits, &labels, classes, &lavapipe(), false);
        assert!(
            (terse.0 - burn.0).abs() <= 1e-6 * burn.0.abs(),
            "[{n}, {classes}] loss {} against burn's {}",
            terse.0,
            burn.0
        );
        let worst = terse
            .1
            .iter()
            .zip(&burn.1)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(
            worst * (n as f32) < 1e-6,
            "[{n}, {classes}] gradient: {worst:e}"
        );
    }
}

/// Without autodiff (evaluation) the op gives burn's loss.
#[test]
fn cross_entropy_without_autodiff_on_the_device() {
    let (n, classes) = (4, 9);
    let device = lavapipe();
    let x = Tensor::<2>::from_data(
        TensorData::new(values(n * classes, 53), [n, classes]),
        &device,
    );
    let y = Tensor::<1, Int>::from_data(TensorData::new(labels(n, classes), [n]), &device);
    let terse = fused::cross_entropy(x.clone(), y.clone()).into_scalar::<f32>();
    let burn = CrossEntropyLossConfig::new()
        .init(&device)
        .forward(x, y)
        .into_scalar::<f32>();
    assert!(
        (terse - burn).abs() <= 1e-6 * burn.abs(),
        "{terse} against {burn}"
    );
}
