//! Each fused op against burn's unfused composition of the same function
//! (burn's LayerNorm module, linear layers, embedding, attention with
//! softmax, GELU, cross-entropy, and dropout as a product with the same
//! keep mask, burn's Conv2d and training BatchNorm, with ReLU) on random
//! inputs of several shapes,
//! odd sizes and padding included: the forward value and the gradient of
//! every input agree within 1e-5 relative (max |fused − burn| over max
//! |burn|).

use burn::nn::conv::Conv2dConfig;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{BatchNormConfig, DropoutConfig, LayerNormConfig, LinearConfig, PaddingConfig2d};
use burn::tensor::activation::{gelu, relu, softmax};
use burn::tensor::{Device, Int, Tensor, TensorData};
use terse_fused::{self as fused, DropoutStream, SiteMask, with_dropout_stream};
use terse_rng::SplitMix64;

mod common;
use common::padding_bias;

fn device() -> Device {
    Device::flex().autodiff()
}

fn random<const D: usize>(rng: &mut SplitMix64, shape: [usize; D], spread: f32) -> Tensor<D> {
    let n = shape.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|_| ((rng.next_u64() % 20_001) as f32 / 10_000.0 - 1.0) * spread)
        .collect();
    Tensor::from_data(TensorData::new(v, shape), &device())
}

fn values<const D: usize>(t: &Tensor<D>) -> Vec<f32> {
    t.clone().inner().into_data().try_to_vec::<f32>().unwrap()
}

#[track_caller]
fn assert_close<const D: usize>(what: &str, fused: &Tensor<D>, burn: &Tensor<D>) {
    let (a, b) = (values(fused), values(burn));
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    let scale = b.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1e-20);
    let worst = a
        .iter()
        .zip(&b)
        .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()));
    assert!(
        worst <= 1e-5 * scale,
        "{what}: max |fused - burn| = {worst:e}, max |burn| = {scale:e}"
    );
}

/// `t`'s gradient in the fused graph against its gradient in burn's.
#[track_caller]
fn assert_grads_close<const D: usize>(
    what: &str,
    t: &Tensor<D>,
    fused: &burn::tensor::Gradients,
    burn: &burn::tensor::Gradients,
) {
    assert_close(what, &t.grad(fused).unwrap(), &t.grad(burn).unwrap());
}

/// The mask the fused dropout drew at site `site` of `stream`, as a tensor.
fn mask_tensor<const D: usize>(
    stream: DropoutStream,
    site: u64,
    prob: f64,
    shape: [usize; D],
) -> Tensor<D> {
    let mask = SiteMask::new(prob as f32, stream.site_key(site));
    let n = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|j| mask.factor(j)).collect();
    Tensor::from_data(TensorData::new(v, shape), &device())
}

#[test]
fn layer_norm_matches_burn() {
    let mut rng = SplitMix64::new(1);
    for shape in [[2, 3, 7], [4, 5, 33], [1, 2, 768]] {
        let d = shape[2];
        let mut norm = LayerNormConfig::new(d).with_epsilon(1e-12).init(&device());
        norm.gamma = norm
            .gamma
            .map(|_| random(&mut rng, [d], 2.0).require_grad());
        norm.beta = norm
            .beta
            .map(|b| b.map(|_| random(&mut rng, [d], 1.0).require_grad()));
        let x = random(&mut rng, shape, 3.0).require_grad();
        let w = random(&mut rng, shape, 1.0);
        let fused_out = fused::layer_norm(x.clone(), &norm, 1e-12);
        let fused_grads = (fused_out.clone() * w.clone()).sum().backward();
        let burn_out = norm.forward(x.clone());
        let burn_grads = (burn_out.clone() * w).sum().backward();
        assert_close("layer norm", &fused_out, &burn_out);
        assert_grads_close("∂x", &x, &fused_grads, &burn_grads);
        let (gamma, beta) = (norm.gamma.val(), norm.beta.as_ref().unwrap().val());
        assert_grads_close("∂γ", &gamma, &fused_grads, &burn_grads);
        assert_grads_close("∂β", &beta, &fused_grads, &burn_grads);
    }
}

#[test]
fn dense_gelu_matches_burn() {
    let mut rng = SplitMix64::new(3);
    for [rows, d_in, d_out] in [[3, 4, 5], [7, 16, 33], [2, 64, 128]] {
        let dense = LinearConfig::new(d_in, d_out).init(&device());
        let dense = burn::nn::Linear {
            weight: dense
                .weight
                .map(|_| random(&mut rng, [d_in, d_out], 0.5).require_grad()),
            bias: dense
                .bias
                .map(|b| b.map(|_| random(&mut rng, [d_out], 1.0).require_grad())),
        };
        let x = random(&mut rng, [rows, 3, d_in], 2.0).require_grad();
        let w = random(&mut rng, [rows, 3, d_out], 1.0);
        let fused_out = fused::dense_gelu(x.clone(), &dense);
        let fused_grads = (fused_out.clone() * w.clone()).sum().backward();
        let burn_out = gelu(dense.forward(x.clone()));
        let burn_grads = (burn_out.clone() * w).sum().backward();
        assert_close("bias + gelu", &fused_out, &burn_out);
        assert_grads_close("∂x", &x, &fused_grads, &burn_grads);
        let weight = dense.weight.val();
        assert_grads_close("∂W", &weight, &fused_grads, &burn_grads);
        let bias = dense.bias.as_ref().unwrap().val();
        assert_grads_close("∂b", &bias, &fused_grads, &burn_grads);
    }
}

#[test]
fn dropout_matches_the_product_with_its_mask() {
    let mut rng = SplitMix64::new(4);
    for (shape, prob) in [([3, 5, 7], 0.1), ([2, 128, 64], 0.1), ([1, 1, 9], 0.0)] {
        let x = random(&mut rng, shape, 2.0).require_grad();
        let w = random(&mut rng, shape, 1.0);
        let layer = DropoutConfig::new(prob).init();
        let stream = DropoutStream::new(9, 3, 1, 2);
        let fused_out = with_dropout_stream(stream, || fused::dropout(x.clone(), &layer));
        let fused_grads = (fused_out.clone() * w.clone()).sum().backward();
        let burn_out = if prob > 0.0 {
            x.clone() * mask_tensor(stream, 0, prob, shape)
        } else {
            x.clone()
        };
        let burn_grads = (burn_out.clone() * w).sum().backward();
        assert_close("dropout", &fused_out, &burn_out);
        assert_grads_close("∂x", &x, &fused_grads, &burn_grads);
    }
    // Outside autodiff (evaluation) dropout is the identity.
    let x = Tensor::<2>::ones([4, 4], &Device::flex());
    let same = fused::dropout(x.clone(), &DropoutConfig::new(0.5).init());
    assert_eq!(values(&same), values(&x));
}

#[test]
fn cross_entropy_matches_burn() {
    let mut rng = SplitMix64::new(5);
    for [n, classes] in [[5, 3], [13, 101], [1, 2], [40, 3001]] {
        let logits = random(&mut rng, [n, classes], 8.0).require_grad();
        let labels: Vec<i64> = (0..n)
            .map(|_| (rng.next_u64() % classes as u64) as i64)
            .collect();
        let labels = Tensor::<1, Int>::from_data(TensorData::new(labels, [n]), &device());
        let fused_loss = fused::cross_entropy(logits.clone(), labels.clone()).mul_scalar(1.7);
        let fused_grads = fused_loss.backward();
        let burn_loss = CrossEntropyLossConfig::new()
            .init(&device())
            .forward(logits.clone(), labels)
            .mul_scalar(1.7);
        let burn_grads = burn_loss.backward();
        let (fl, bl) = (values(&fused_loss)[0], values(&burn_loss)[0]);
        assert!((fl - bl).abs() <= 1e-5 * bl.abs(), "loss {fl} vs {bl}");
        assert_grads_close("∂logits", &logits, &fused_grads, &burn_grads);
    }
}

/// A linear layer with random weights and bias, both tracked.
fn random_linear(rng: &mut SplitMix64, d_in: usize, d_out: usize) -> burn::nn::Linear {
    let dense = LinearConfig::new(d_in, d_out).init(&device());
    burn::nn::Linear {
        weight: dense
            .weight
            .map(|_| random(rng, [d_in, d_out], 0.5).require_grad()),
        bias: dense
            .bias
            .map(|b| b.map(|_| random(rng, [d_out], 1.0).require_grad())),
    }
}

#[test]
fn linear_and_the_tied_decoder_match_burn() {
    let mut rng = SplitMix64::new(6);
    for [rows, d_in, d_out] in [[3, 4, 5], [7, 16, 33], [2, 64, 301]] {
        let dense = random_linear(&mut rng, d_in, d_out);
        let x = random(&mut rng, [rows, 3, d_in], 2.0).require_grad();
        let w = random(&mut rng, [rows, 3, d_out], 1.0);
        let fused_out = fused::linear(x.clone(), &dense);
        let fused_grads = (fused_out.clone() * w.clone()).sum().backward();
        let burn_out = dense.forward(x.clone());
        let burn_grads = (burn_out.clone() * w).sum().backward();
        assert_close("linear", &fused_out, &burn_out);
        assert_grads_close("∂x", &x, &fused_grads, &burn_grads);
        let weight = dense.weight.val();
        assert_grads_close("∂W", &weight, &fused_grads, &burn_grads);
        let bias = dense.bias.as_ref().unwrap().val();
        assert_grads_close("∂b", &bias, &fused_grads, &burn_grads);

        // The decoder's weight is stored [out, in] (the word embeddings).
        let table = random(&mut rng, [d_out, d_in], 0.5).require_grad();
        let bias = random(&mut rng, [d_out], 1.0).require_grad();
        let h = random(&mut rng, [rows * 2, d_in], 2.0).require_grad();
        let w = random(&mut rng, [rows * 2, d_out], 1.0);
        let fused_out = fused::linear_transposed(h.clone(), table.clone(), bias.clone());
        let fused_grads = (fused_out.clone() * w.clone()).sum().backward();
        let burn_out = h.clone().matmul(table.clone().transpose()) + bias.clone().unsqueeze_dim(0);
        let burn_grads = (burn_out.clone() * w).sum().backward();
        assert_close("tied decoder", &fused_out, &burn_out);
        assert_grads_close("decoder ∂h", &h, &fused_grads, &burn_grads);
        assert_grads_close("decoder ∂table", &table, &fused_grads, &burn_grads);
        assert_grads_close("decoder ∂b", &bias, &fused_grads, &burn_grads);
    }
}

#[test]
fn embedding_matches_burn_with_repeated_ids() {
    let mut rng = SplitMix64::new(7);
    for [batch, seq, vocab, d] in [[2, 5, 7, 3], [3, 17, 50, 33]] {
        let mut table = burn::nn::EmbeddingConfig::new(vocab, d).init(&device());
        table.weight = table
            .weight
            .map(|_| random(&mut rng, [vocab, d], 1.0).require_grad());
        // Ids drawn from a third of the vocabulary: most repeat.
        let ids: Vec<i64> = (0..batch * seq)
            .map(|_| (rng.next_u64() % (vocab as u64 / 3 + 1)) as i64)
            .collect();
        let ids = Tensor::<2, Int>::from_data(TensorData::new(ids, [batch, seq]), &device());
        let w = random(&mut rng, [batch, seq, d], 1.0);
        let fused_out = fused::embedding(ids.clone(), &table);
        let fused_grads = (fused_out.clone() * w.clone()).sum().backward();
        let burn_out = table.forward(ids);
        let burn_grads = (burn_out.clone() * w).sum().backward();
        assert_close("embedding", &fused_out, &burn_out);
        assert_grads_close("∂table", &table.weight.val(), &fused_grads, &burn_grads);
        // terse's backward adds the rows in flex's order: the same bits.
        let table_grad = |grads| values(&table.weight.val().grad(grads).unwrap());
        assert_eq!(
            table_grad(&fused_grads),
            table_grad(&burn_grads),
            "∂table bits"
        );
    }
}

#[test]
fn attention_core_matches_burn_with_padding_and_dropout() {
    let mut rng = SplitMix64::new(8);
    for ([batch, heads, seq, head_dim], prob) in [
        ([2, 3, 5, 4], 0.0),
        ([3, 2, 7, 5], 0.1),
        ([2, 12, 17, 8], 0.1),
    ] {
        let bias = Tensor::<2>::from_data(
            TensorData::new(padding_bias(batch, seq), [batch, seq]),
            &device(),
        );
        // q, k, v and the result as the model has them, [b, t, hidden];
        // burn's reference splits the heads.
        let split = |t: Tensor<3>| t.reshape([batch, seq, heads, head_dim]).swap_dims(1, 2);
        let hidden = heads * head_dim;
        let [q, k, v] = [0; 3].map(|_| random(&mut rng, [batch, seq, hidden], 2.0).require_grad());
        let w = random(&mut rng, [batch, seq, hidden], 1.0);
        let layer = DropoutConfig::new(prob).init();
        let stream = DropoutStream::new(11, 2, 1, 0);
        let scale = 1.0 / (head_dim as f64).sqrt();
        let fused_out = with_dropout_stream(stream, || {
            fused::attention(
                q.clone(),
                k.clone(),
                v.clone(),
                bias.clone(),
                heads,
                scale,
                &layer,
            )
        });
        let fused_grads = (fused_out.clone() * w.clone()).sum().backward();
        let z = split(q.clone())
            .matmul(split(k.clone()).swap_dims(2, 3))
            .mul_scalar(scale)
            + bias.reshape([batch, 1, 1, seq]);
        let mut probs = softmax(z, 3);
        if prob > 0.0 {
            probs = probs * mask_tensor(stream, 0, prob, [batch, heads, seq, seq]);
        }
        let burn_out = probs
            .matmul(split(v.clone()))
            .swap_dims(1, 2)
            .reshape([batch, seq, hidden]);
        let burn_grads = (burn_out.clone() * w).sum().backward();
        assert_close("attention", &fused_out, &burn_out);
        assert_grads_close("∂q", &q, &fused_grads, &burn_grads);
        assert_grads_close("∂k", &k, &fused_grads, &burn_grads);
        assert_grads_close("∂v", &v, &fused_grads, &burn_grads);
    }
}

#[test]
fn conv2d_matches_burn() {
    let mut rng = SplitMix64::new(9);
    // (batch, c_in, h, w, c_out, [kh, kw], stride, padding, bias): odd
    // sizes, strides 1–3, 1×1 and non-square kernels, more images than one
    // backward task takes, both ways of taking ∂x.
    for (batch, c_in, h, w, c_out, kernel, stride, pad, bias) in [
        (2, 3, 7, 5, 4, [3, 3], 1, 1, false),
        (3, 2, 8, 9, 3, [3, 3], 2, 1, true),
        (2, 5, 6, 6, 2, [1, 1], 1, 0, false),
        (2, 4, 7, 7, 3, [1, 1], 2, 0, false),
        (1, 1, 5, 4, 2, [3, 2], 3, 2, true),
        (9, 16, 8, 8, 16, [3, 3], 1, 1, false),
        // 16+ input channels at stride 1: ∂x as the transposed
        // convolution, also with a 5×5 kernel and with no padding.
        (2, 16, 6, 7, 3, [5, 5], 1, 2, true),
        (3, 17, 5, 5, 2, [3, 3], 1, 0, false),
        (2, 3, 6, 7, 2, [5, 5], 1, 2, false),
        (2, 2, 5, 6, 3, [1, 3], 1, 1, true),
    ] {
        let conv = Conv2dConfig::new([c_in, c_out], kernel)
            .with_stride([stride, stride])
            .with_padding(PaddingConfig2d::Explicit(pad, pad, pad, pad))
            .with_bias(bias)
            .init(&device());
        let conv = burn::nn::conv::Conv2d {
            weight: conv
                .weight
                .map(|_| random(&mut rng, [c_out, c_in, kernel[0], kernel[1]], 0.5).require_grad()),
            bias: conv
                .bias
                .map(|b| b.map(|_| random(&mut rng, [c_out], 1.0).require_grad())),
            ..conv
        };
        let x = random(&mut rng, [batch, c_in, h, w], 2.0).require_grad();
        let fused_out = fused::conv2d(x.clone(), &conv);
        let burn_out = conv.forward(x.clone());
        let g = random(&mut rng, burn_out.dims(), 1.0);
        let fused_grads = (fused_out.clone() * g.clone()).sum().backward();
        let burn_grads = (burn_out.clone() * g).sum().backward();
        assert_close("conv2d", &fused_out, &burn_out);
        assert_grads_close("conv ∂x", &x, &fused_grads, &burn_grads);
        let weight = conv.weight.val();
        assert_grads_close("conv ∂W", &weight, &fused_grads, &burn_grads);
        if let Some(bias) = &conv.bias {
            assert_grads_close("conv ∂b", &bias.val(), &fused_grads, &burn_grads);
        }
    }
}

#[test]
fn batch_norm_with_and_without_relu_matches_burn_running_statistics_included() {
    let mut rng = SplitMix64::new(10);
    for shape in [[4, 3, 5, 5], [2, 16, 8, 8], [3, 2, 1, 7]] {
        for with_relu in [false, true] {
            let c = shape[1];
            let gamma = random(&mut rng, [c], 2.0).require_grad();
            let beta = random(&mut rng, [c], 1.0).require_grad();
            // Two modules (a clone would share its running statistics).
            let fresh = || {
                let mut norm = BatchNormConfig::new(c).init(&device());
                norm.gamma = norm.gamma.map(|_| gamma.clone());
                norm.beta = norm.beta.map(|_| beta.clone());
                norm
            };
            let (norm, twin) = (fresh(), fresh());
            let x = (random(&mut rng, shape, 3.0) + 0.7).require_grad();
            let g = random(&mut rng, shape, 1.0);
            let fused_out = fused::batch_norm(x.clone(), &norm, with_relu);
            let fused_grads = (fused_out.clone() * g.clone()).sum().backward();
            let burn_out = twin.forward(x.clone());
            let burn_out = if with_relu { relu(burn_out) } else { burn_out };
            let burn_grads = (burn_out.clone() * g).sum().backward();
            assert_close("batch norm", &fused_out, &burn_out);
            assert_grads_close("bn ∂x", &x, &fused_grads, &burn_grads);
            assert_grads_close("bn ∂γ", &gamma, &fused_grads, &burn_grads);
            assert_grads_close("bn ∂β", &beta, &fused_grads, &burn_grads);
            assert_close(
                "running mean",
                &norm.running_mean.value(),
                &twin.running_mean.value(),
            );
            assert_close(
                "running var",
                &norm.running_var.value(),
                &twin.running_var.value(),
            );
        }
    }
}

#[test]
fn conv2d_and_batch_norm_bits_do_not_depend_on_the_thread_count() {
    use fused::{BatchNormShape, ConvShape};
    let s = ConvShape {
        batch: 11,
        c_in: 6,
        h: 9,
        w: 7,
        c_out: 5,
        kh: 3,
        kw: 3,
        stride: 1,
        pad: 1,
    };
    let mut rng = SplitMix64::new(11);
    let mut draw = |n: usize| -> Vec<f32> {
        (0..n)
            .map(|_| (rng.next_u64() % 2001) as f32 / 1000.0 - 1.0)
            .collect()
    };
    let x = draw(s.batch * s.c_in * s.h * s.w);
    let w = draw(s.c_out * s.c_in * 9);
    let g = draw(s.batch * s.c_out * s.out_h() * s.out_w());
    let bn = BatchNormShape {
        batch: s.batch,
        channels: s.c_in,
        plane: s.h * s.w,
    };
    let (gamma, beta) = (draw(s.c_in), draw(s.c_in));
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            let out = fused::conv2d_forward(&x, &w, &s);
            let (dx, dw) = fused::conv2d_backward(&x, &w, &g, &s, (true, true));
            let mut y = vec![0.0; x.len()];
            let stats = fused::batch_norm_forward(&x, &gamma, &beta, bn, 1e-5, true, &mut y);
            let mut d = x.clone();
            let (dg, db) = fused::batch_norm_backward(&mut d, &x, &gamma, &beta, &stats, bn, true);
            [
                out,
                dx.unwrap(),
                dw.unwrap(),
                y,
                d,
                dg,
                db,
                stats.mean,
                stats.var,
            ]
        })
    };
    let one = run(1);
    for threads in [2, 3] {
        assert!(one == run(threads), "{threads} threads changed the bits");
    }
}

#[test]
fn add_relu_matches_burn() {
    let mut rng = SplitMix64::new(12);
    for shape in [[2, 3, 5, 7], [3, 16, 8, 8]] {
        let a = random(&mut rng, shape, 2.0).require_grad();
        let b = random(&mut rng, shape, 2.0).require_grad();
        let g = random(&mut rng, shape, 1.0);
        let fused_out = fused::add_relu(a.clone(), b.clone());
        let fused_grads = (fused_out.clone() * g.clone()).sum().backward();
        let burn_out = relu(a.clone() + b.clone());
        let burn_grads = (burn_out.clone() * g).sum().backward();
        assert_close("add relu", &fused_out, &burn_out);
        assert_grads_close("∂a", &a, &fused_grads, &burn_grads);
        assert_grads_close("∂b", &b, &fused_grads, &burn_grads);
    }
}
