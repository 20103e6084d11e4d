//! Throwaway: a digest of attention_probs' output and ∂z bits on lavapipe.
use burn::tensor::{Tensor, TensorData};
use terse_fused as fused;
mod common;
use common::{lavapipe, padding_bias, values, vec_of};

#[test]
fn digest_attention_probs() {
    let device = lavapipe().autodiff();
    for (batch, heads, seq, keys) in [(2usize, 3usize, 7usize, 7usize), (3, 2, 16, 16), (1, 3, 5, 40), (2, 4, 128, 128), (2, 1, 5, 300), (2, 2, 3, 1), (4, 2, 64, 64)] {
        let dims = [batch * heads, seq, keys];
        let n = dims.iter().product();
        let z = Tensor::<3>::from_data(TensorData::new(values(n, 1).iter().map(|v| 4.0 * v).collect::<Vec<f32>>(), dims), &device).require_grad();
        let w = Tensor::<3>::from_data(TensorData::new(values(n, 2), dims), &device);
        let bias = Tensor::<2>::from_data(TensorData::new(padding_bias(batch, keys), [batch, keys]), &device);
        let p = fused::attention_probs(z.clone(), bias.clone(), 0.125, Some((0.1, 3)));
        let grads = (p.clone() * w.clone()).sum().backward();
        let dz = vec_of(z.grad(&grads).unwrap().inner());
        let p = vec_of(p.inner());
        let digest = |v: &[f32]| v.iter().enumerate().fold(0u64, |h, (i, x)| h.wrapping_mul(1_000_003).wrapping_add(x.to_bits() as u64 ^ i as u64));
        println!("BITS {dims:?} p {:016x} dz {:016x}", digest(&p), digest(&dz));
    }
}
