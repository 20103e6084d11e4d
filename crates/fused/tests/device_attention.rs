//! Multi-head attention's core on a cubecl device (lavapipe: Mesa's Vulkan
//! driver on the CPU): `fused::attention` there, burn's ops on heads copied
//! out once, against flex's fused attention (its own per-head loops,
//! `attention_core.rs`) with the same padding and dropout mask, and the
//! copies it dispatches: one per head split and per merge, none inside the
//! products.

use std::sync::Mutex;

use burn::nn::DropoutConfig;
use burn::tensor::{Device, Tensor, TensorData};
use terse_fused::{self as fused, DropoutStream, with_dropout_stream};
use terse_kernels::dispatches::DispatchCounter;

mod common;
use common::{contiguous_copies, lavapipe, padding_bias, values};

/// Held by each test while it runs: the dispatch counter counts the whole
/// process's launches, so another test's kernels must not land in it.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Output and q, k, v gradients of `fused::attention` on `device` (loss
/// `Σ out·w`), with the `cubecl_std` copy kernels it dispatched there.
fn attend(
    device: &Device,
    [batch, heads, seq, head_dim]: [usize; 4],
    prob: f64,
) -> (Vec<Vec<f32>>, u64) {
    let device = device.clone().autodiff();
    let hidden = heads * head_dim;
    let tensor = |seed: u32| {
        Tensor::<3>::from_data(
            TensorData::new(values(batch * seq * hidden, seed), [batch, seq, hidden]),
            &device,
        )
    };
    let bias = Tensor::<2>::from_data(
        TensorData::new(padding_bias(batch, seq), [batch, seq]),
        &device,
    );
    let [q, k, v] = [21, 22, 23].map(|seed| tensor(seed).require_grad());
    let w = tensor(24);
    let layer = DropoutConfig::new(prob).init();
    let scale = 1.0 / (head_dim as f64).sqrt();

    let counter = DispatchCounter::start();
    let out = with_dropout_stream(DropoutStream::new(11, 2, 1, 0), || {
        fused::attention(q.clone(), k.clone(), v.clone(), bias, heads, scale, &layer)
    });
    let grads = (out.clone() * w).sum().backward();
    let host = |t: Tensor<3>| t.into_data().try_to_vec::<f32>().unwrap();
    let results = vec![
        host(out.inner()),
        host(q.grad(&grads).unwrap()),
        host(k.grad(&grads).unwrap()),
        host(v.grad(&grads).unwrap()),
    ];
    let copies = contiguous_copies(&counter).iter().map(|(_, n)| n).sum();
    (results, copies)
}

/// BERT-Tiny's head shape and an odd one, with dropout on and off: within
/// 1e-5 (relative to the largest value) of flex in the output and all
/// three gradients.
#[test]
fn attention_on_the_device_matches_flex() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    for (shape, prob) in [
        ([3, 2, 16, 64], 0.1),
        ([2, 3, 7, 5], 0.0),
        ([2, 4, 9, 6], 0.1),
    ] {
        let (device, _) = attend(&lavapipe(), shape, prob);
        let (flex, _) = attend(&Device::flex(), shape, prob);
        for ((what, got), want) in ["output", "∂q", "∂k", "∂v"].iter().zip(&device).zip(&flex)
        {
            let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let worst = got
                .iter()
                .zip(want)
                .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(
                worst <= 1e-5 * scale,
                "{shape:?}, p {prob}: {what}: max |lavapipe - flex| = {worst:e}, max |flex| = {scale:e}"
            );
        }
    }
}

/// One attention forward and backward pass copies eight tensors on the
/// device: q, k and v out of the linear layers' layout into whole heads,
/// the context back, the context's gradient into heads, q's, k's and v's
/// gradients back (the mask bias, repeated per head until the softmax
/// read it per sequence, was a ninth: `device_softmax.rs`). A product handed
/// a view of interleaved heads copies it itself, at each product that
/// reads it (on lavapipe twice: cubek's `Auto` copies before trying its
/// tensor-core routine and again for the fallback): 20 copies before, 16
/// of them inside the products.
#[test]
fn attention_on_the_device_copies_each_head_split_once() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let (_, copies) = attend(&lavapipe(), [3, 2, 16, 64], 0.1);
    assert_eq!(copies, 8, "copy kernels dispatched by one attention pass");
}
