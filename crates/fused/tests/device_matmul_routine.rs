//! The linear layers on a cubecl device (lavapipe: Mesa's Vulkan driver on
//! the CPU) with a named matmul routine (`matmul_routine.rs`): output and
//! all three gradients against a float64 reference, for the routines
//! lavapipe can run and for one it cannot (which must fall back to burn's
//! matmul, counted). Its own test binary: the routine is named per process.

use burn::tensor::{Tensor, TensorData};
use terse_fused as fused;

mod common;
use common::{lavapipe, max_error, values, vec_of};

/// `a` `[m, k]` times `b` `[k, n]` in float64, each given by an element
/// function.
fn product(
    (m, k, n): (usize, usize, usize),
    a: impl Fn(usize, usize) -> f32,
    b: impl Fn(usize, usize) -> f32,
) -> Vec<f64> {
    let mut out = vec![0.0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k)
                .map(|l| f64::from(a(i, l)) * f64::from(b(l, j)))
                .sum();
        }
    }
    out
}

/// `y = x·W + b` and, for `L = Σ y·r`, `∂L/∂x = r·Wᵀ`, `∂L/∂W = xᵀ·r`,
/// `∂L/∂b = Σ_rows r`, all in float64; W `[d_in, d_out]`.
fn reference(
    x: &[f32],
    w: &[f32],
    b: &[f32],
    r: &[f32],
    (rows, d_in, d_out): (usize, usize, usize),
) -> [Vec<f64>; 4] {
    let mut y = product(
        (rows, d_in, d_out),
        |i, l| x[i * d_in + l],
        |l, j| w[l * d_out + j],
    );
    for row in y.chunks_mut(d_out) {
        for (v, bias) in row.iter_mut().zip(b) {
            *v += f64::from(*bias);
        }
    }
    let dx = product(
        (rows, d_out, d_in),
        |i, l| r[i * d_out + l],
        |l, j| w[j * d_out + l],
    );
    let dw = product(
        (d_in, rows, d_out),
        |i, l| x[l * d_in + i],
        |l, j| r[l * d_out + j],
    );
    let db = product((1, rows, d_out), |_, _| 1.0, |l, j| r[l * d_out + j]);
    [y, dx, dw, db]
}

/// `fused::linear` (W `[in, out]`) and `fused::linear_transposed` (W stored
/// `[out, in]`, the tied decoder) with the routine named `name`: each of
/// y, ∂x, ∂W, ∂b within `tolerance` of float64.
fn check_routine(name: &str, tolerance: f64) {
    fused::name_linear_matmul(Some(name)).unwrap();
    let device = lavapipe().autodiff();
    let (batch, seq, d_in, d_out) = (4, 33, 40, 72);
    let rows = batch * seq;
    let (x, w, b, r) = (
        values(rows * d_in, 31),
        values(d_in * d_out, 32),
        values(d_out, 33),
        values(rows * d_out, 34),
    );
    let want = reference(&x, &w, &b, &r, (rows, d_in, d_out));
    let tensor = |v: &[f32], shape: Vec<usize>| {
        Tensor::<3>::from_data(TensorData::new(v.to_vec(), shape), &device)
    };
    let x_t = tensor(&x, vec![batch, seq, d_in]).require_grad();
    let r_t = tensor(&r, vec![batch, seq, d_out]);
    let b_t = Tensor::<1>::from_data(TensorData::new(b.clone(), [d_out]), &device).require_grad();

    // W [in, out] as a `Linear`'s weight.
    let mut layer = burn::nn::LinearConfig::new(d_in, d_out).init(&device);
    let w_t = Tensor::<2>::from_data(TensorData::new(w.clone(), [d_in, d_out]), &device);
    layer.weight = layer.weight.map(|_| w_t.clone().require_grad());
    layer.bias = layer.bias.map(|p| p.map(|_| b_t.clone()));
    let y = fused::linear(x_t.clone(), &layer);
    let grads = (y.clone() * r_t.clone()).sum().backward();
    let got = [
        vec_of(y),
        vec_of(x_t.grad(&grads).unwrap()),
        vec_of(layer.weight.grad(&grads).unwrap()),
        vec_of(layer.bias.as_ref().unwrap().grad(&grads).unwrap()),
    ];
    for (what, (got, want)) in ["y", "∂x", "∂W", "∂b"].iter().zip(got.iter().zip(&want)) {
        let err = max_error(got, want);
        assert!(err < tolerance, "{name}: linear {what}: {err:e}");
    }

    // The same W stored [out, in] (its transpose), rows as a 2-D x.
    let w_stored: Vec<f32> = (0..d_out * d_in)
        .map(|i| w[(i % d_in) * d_out + i / d_in])
        .collect();
    let x2 =
        Tensor::<2>::from_data(TensorData::new(x.clone(), [rows, d_in]), &device).require_grad();
    let w2 =
        Tensor::<2>::from_data(TensorData::new(w_stored, [d_out, d_in]), &device).require_grad();
    let b2 = Tensor::<1>::from_data(TensorData::new(b.clone(), [d_out]), &device).require_grad();
    let r2 = Tensor::<2>::from_data(TensorData::new(r.clone(), [rows, d_out]), &device);
    let y2 = fused::linear_transposed(x2.clone(), w2.clone(), b2.clone());
    let grads = (y2.clone() * r2).sum().backward();
    let dw_stored = vec_of(w2.grad(&grads).unwrap());
    let dw: Vec<f32> = (0..d_in * d_out)
        .map(|i| dw_stored[(i % d_out) * d_in + i / d_out])
        .collect();
    let got = [
        vec_of(y2),
        vec_of(x2.grad(&grads).unwrap()),
        dw,
        vec_of(b2.grad(&grads).unwrap()),
    ];
    for (what, (got, want)) in ["y", "∂x", "∂W", "∂b"].iter().zip(got.iter().zip(&want)) {
        let err = max_error(got, want);
        assert!(err < tolerance, "{name}: transposed linear {what}: {err:e}");
    }
}

/// The unit routines and `auto` run on lavapipe and decline nothing; a
/// tensor-core routine, and cuBLAS, are declined there (no matrix
/// instructions; not CUDA) and the layers still compute the same products
/// through burn's matmul. An unknown name is refused with the list.
#[test]
fn named_matmul_routines_give_the_linear_layers_products() {
    // Sums of ≤132 products of values in [-1, 1): f32 rounding is ~1e-6.
    for name in ["simple_unit", "double_unit", "auto"] {
        let declined = fused::declined_matmuls();
        check_routine(name, 1e-5);
        assert_eq!(
            fused::declined_matmuls(),
            declined,
            "{name} declined a product"
        );
    }
    let declined = fused::declined_matmuls();
    check_routine("ordered_double_mma", 1e-5);
    assert!(
        fused::declined_matmuls() > declined,
        "lavapipe has no matrix instructions, yet ordered_double_mma ran"
    );
    let why = fused::first_decline_reason().unwrap_or_default();
    assert!(why.starts_with("ordered_double_mma: "), "{why}");
    // cuBLAS is CUDA's: on lavapipe every product is declined (not CUDA
    // memory), counted, and burn's matmul gives the same products.
    for name in ["cublas", "cublas_tf32"] {
        assert!(fused::is_cublas_routine(name), "{name}");
        let declined = fused::declined_matmuls();
        check_routine(name, 1e-5);
        assert!(
            fused::declined_matmuls() > declined,
            "{name} took a product on lavapipe"
        );
        let why = fused::first_decline_reason().unwrap_or_default();
        assert!(why.contains("cuBLAS: NotCuda"), "{name}: {why}");
    }
    assert!(!fused::is_cublas_routine("simple_unit"));
    let err = fused::name_linear_matmul(Some("fastest")).unwrap_err();
    assert!(
        err.contains("`fastest`") && err.contains("simple_unit"),
        "{err}"
    );
    fused::name_linear_matmul(None).unwrap();
    assert_eq!(fused::named_linear_matmul(), None);
}
