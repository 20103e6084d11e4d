//! Attention probabilities `softmax(z·scale + bias)` with dropout and
//! their gradient on a cubecl device (lavapipe), `fused::attention_probs`
//! there being one step of one kernel each way, the dropout factors hashed
//! inside (`device_softmax.rs`): against a float64 re-implementation whose
//! factors come from the CPU's `SiteMask`, and the kernels one pass
//! dispatches.

use std::collections::BTreeMap;
use std::sync::Mutex;

use burn::tensor::activation::softmax;
use burn::tensor::{Device, Tensor, TensorData};
use terse_fused::{self as fused, SiteMask};
use terse_kernels::dispatches::DispatchCounter;
use terse_kernels::tensor::device_dropout_factors;

mod common;
use common::{bytes_in_use, lavapipe, padding_bias, values, vec_of};

/// Kernel launches by name.
type Dispatched = BTreeMap<&'static str, u64>;

/// Held by each test while it runs: the dispatch counter counts the whole
/// process's launches.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Scores `[batch·heads, seq, keys]` in [-4, 4), the padding bias
/// `[batch, keys]` and the upstream gradient `w`, as host vectors.
struct Case {
    shape: [usize; 4],
    z: Vec<f32>,
    bias: Vec<f32>,
    w: Vec<f32>,
    scale: f64,
    dropout: Option<(f32, u64)>,
}

impl Case {
    fn new(shape @ [batch, heads, seq, keys]: [usize; 4], dropout: Option<(f32, u64)>) -> Self {
        let n = batch * heads * seq * keys;
        Case {
            shape,
            z: values(n, 31).iter().map(|v| 4.0 * v).collect(),
            bias: padding_bias(batch, keys),
            w: values(n, 32),
            scale: 1.0 / (keys as f64).sqrt(),
            dropout,
        }
    }

    /// The output and `∂z` of the loss `Σ out·w` in float64: with `p =
    /// softmax(z·scale + bias)` per row and the dropout factors `f`, `out =
    /// p·f`, `∂z = scale·p·(h − Σ h·p)` for `h = w·f`.
    fn float64(&self) -> (Vec<f64>, Vec<f64>) {
        let [_, heads, seq, keys] = self.shape;
        let mask = self.dropout.map(|(prob, key)| SiteMask::new(prob, key));
        let factor = |i: usize| mask.map_or(1.0, |mask| f64::from(mask.factor(i)));
        let (mut out, mut dz) = (vec![0.0; self.z.len()], vec![0.0; self.z.len()]);
        for (row, z) in self.z.chunks(keys).enumerate() {
            let bias = &self.bias[row / (heads * seq) * keys..][..keys];
            let s: Vec<f64> = z
                .iter()
                .zip(bias)
                .map(|(&z, &b)| f64::from(z) * self.scale + f64::from(b))
                .collect();
            let max = s.iter().copied().fold(f64::MIN, f64::max);
            let e: Vec<f64> = s.iter().map(|s| (s - max).exp()).collect();
            let total: f64 = e.iter().sum();
            let p: Vec<f64> = e.iter().map(|e| e / total).collect();
            let at = |j: usize| row * keys + j;
            let h: Vec<f64> = (0..keys)
                .map(|j| f64::from(self.w[at(j)]) * factor(at(j)))
                .collect();
            let dot: f64 = h.iter().zip(&p).map(|(h, p)| h * p).sum();
            for j in 0..keys {
                out[at(j)] = p[j] * factor(at(j));
                dz[at(j)] = self.scale * p[j] * (h[j] - dot);
            }
        }
        (out, dz)
    }

    /// The output and `∂z` from `fused::attention_probs` on `device`, with
    /// the kernels dispatched forward (up to the output read back) and
    /// backward.
    fn run(&self, device: &Device) -> (Vec<f32>, Vec<f32>, [Dispatched; 2]) {
        let device = device.clone().autodiff();
        let [batch, heads, seq, keys] = self.shape;
        let dims = [batch * heads, seq, keys];
        let z =
            Tensor::<3>::from_data(TensorData::new(self.z.clone(), dims), &device).require_grad();
        let bias =
            Tensor::<2>::from_data(TensorData::new(self.bias.clone(), [batch, keys]), &device);
        let w = Tensor::<3>::from_data(TensorData::new(self.w.clone(), dims), &device);
        let forward = DispatchCounter::start();
        let p = fused::attention_probs(z.clone(), bias, self.scale, self.dropout);
        let p_host = vec_of(p.clone().inner());
        let forward = forward.by_kernel();
        let loss = (p * w).sum();
        vec_of(loss.clone().inner());
        let backward = DispatchCounter::start();
        let grads = loss.backward();
        let dz = vec_of(z.grad(&grads).unwrap());
        (p_host, dz, [forward, backward.by_kernel()])
    }
}

/// The largest `|got − want|` over the largest `|want|`.
fn relative_error(got: &[f32], want: &[f64]) -> f64 {
    let scale = want.iter().fold(0.0f64, |m, w| m.max(w.abs()));
    let worst = got
        .iter()
        .zip(want)
        .fold(0.0f64, |m, (g, w)| m.max((f64::from(*g) - w).abs()));
    if worst == 0.0 { 0.0 } else { worst / scale }
}

/// Rows shorter and longer than a cube (256 units), one key, padding in
/// the second sequence, dropout at 0, 0.1 and 0.5: the output and `∂z`
/// within 1e-6 of float64 (relative to the largest value), on lavapipe and
/// on flex (burn's ops and the CPU's mask).
#[test]
fn attention_probs_match_float64() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let cases = [
        ([2, 3, 7, 7], None),
        ([2, 3, 7, 7], Some((0.1, 7))),
        ([3, 2, 16, 16], Some((0.5, 8))),
        ([2, 1, 5, 300], Some((0.1, 9))),
        ([2, 2, 3, 1], None),
        ([1, 3, 5, 40], Some((0.2, 11))),
        ([2, 4, 128, 128], Some((0.1, u64::MAX - 3))),
    ];
    for (shape, dropout) in cases {
        let case = Case::new(shape, dropout);
        let (want_p, want_dz) = case.float64();
        for (name, device) in [("lavapipe", lavapipe()), ("flex", Device::flex())] {
            let (p, dz, _) = case.run(&device);
            for (what, got, want) in [("output", &p, &want_p), ("∂z", &dz, &want_dz)] {
                let error = relative_error(got, want);
                println!("{shape:?} {dropout:?} {name}: {what} {error:.2e}");
                assert!(
                    error <= 1e-6,
                    "{shape:?} {dropout:?} {name}: {what} {error:e} from float64"
                );
            }
        }
    }
}

/// On the device the probabilities with dropout are one kernel forward and
/// their gradient one backward: no reduction, no copy, no dropout factors
/// made. (burn's softmax on the bias repeated per head, then the mask's
/// factors and product, dispatched 8 kernels forward here, among them a
/// copy, two reductions and the factors, and 3 backward, two of them
/// reductions.)
#[test]
fn attention_probs_are_one_kernel_each_way() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let case = Case::new([3, 2, 16, 16], Some((0.1, 5)));
    let (_, _, [forward, backward]) = case.run(&lavapipe());
    println!("forward: {forward:#?}\nbackward: {backward:#?}");
    let count = |map: &Dispatched, part: &str| -> u64 {
        map.iter()
            .filter(|(name, _)| name.contains(part))
            .map(|(_, n)| n)
            .sum()
    };
    assert_eq!(forward.values().sum::<u64>(), 1, "forward: {forward:?}");
    assert_eq!(count(&forward, "MaskedSoftmaxKernel"), 1);
    assert_eq!(count(&backward, "MaskedSoftmaxGradKernel"), 1);
    // The backward pass of the loss `Σ p·w` reduces nothing either.
    assert_eq!(count(&backward, "Reduce"), 0, "backward: {backward:?}");
    assert_eq!(count(&backward, "contiguous"), 0, "backward: {backward:?}");
    assert_eq!(count(&backward, "Factors"), 0, "backward: {backward:?}");
}

/// What the forward pass leaves alive on the device until its backward
/// pass, in tensors of the scores' size: the output and what autodiff
/// keeps. `probs` computes the output from the scores, the bias and the
/// dropout's probability and key.
fn kept_by(
    probs: impl Fn(Tensor<3>, Tensor<2>, (f32, u64)) -> Tensor<3>,
    [batch, heads, seq, keys]: [usize; 4],
) -> f64 {
    let device = lavapipe().autodiff();
    let dims = [batch * heads, seq, keys];
    let z = Tensor::<3>::from_data(
        TensorData::new(values(dims.iter().product(), 41), dims),
        &device,
    )
    .require_grad();
    let bias = Tensor::<2>::from_data(
        TensorData::new(padding_bias(batch, keys), [batch, keys]),
        &device,
    );
    // The scores' own buffer is the caller's, before and after: make it
    // and the bias exist on the device first.
    let z = z.clone() * 1.0;
    vec_of(z.clone().inner());
    let before = bytes_in_use();
    let out = probs(z.clone(), bias, (0.1, 3));
    vec_of(out.clone().inner());
    let after = bytes_in_use();
    let size = (dims.iter().product::<usize>() * size_of::<f32>()) as f64;
    drop(out);
    (after - before) as f64 / size
}

/// Beyond the scores, which the caller holds here, the forward pass leaves
/// one tensor of their size alive for its backward pass, its output (which
/// the next product keeps anyway), where burn's softmax and a separate
/// dropout left four (the output, the factors, the exponentials, the
/// probabilities). In a model the scores are the product's output, which
/// burn's ops let go and the fused step keeps: per layer 2 score-sized
/// tensors instead of 4.
#[test]
fn attention_probs_keep_less_for_the_backward_pass() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let shape = [4, 4, 128, 128];
    let fused = kept_by(
        |z, bias, dropout| fused::attention_probs(z, bias, 1.0 / 8.0, Some(dropout)),
        shape,
    );
    let composed = kept_by(
        |z, bias, (prob, key)| {
            let [heads_batch, _, keys] = z.dims();
            let batch = bias.dims()[0];
            let bias = bias
                .reshape([batch, 1, 1, keys])
                .expand([batch, heads_batch / batch, 1, keys])
                .reshape([heads_batch, 1, keys]);
            let p = softmax(z.mul_scalar(1.0 / 8.0) + bias, 2);
            let mask = SiteMask::new(prob, key);
            let factors = device_dropout_factors::<3>(&mask, p.shape(), &p.device()).unwrap();
            p * factors
        },
        shape,
    );
    println!(
        "score-sized tensors alive after the forward pass: fused {fused:.2}, burn's ops {composed:.2}"
    );
    assert!(fused <= 1.05, "fused: {fused:.2} score-sized tensors");
    assert!(
        composed >= 3.95,
        "burn's ops: {composed:.2} score-sized tensors"
    );
}
