//! Throwaway: attention_probs forward + backward time on lavapipe.
use burn::tensor::{Tensor, TensorData};
use terse_fused as fused;
mod common;
use common::{lavapipe, padding_bias, values, vec_of};

#[test]
fn time_attention_probs() {
    let device = lavapipe().autodiff();
    for (batch, heads, seq) in [(8usize, 2usize, 128usize), (8, 12, 128), (2, 2, 512)] {
        let dims = [batch * heads, seq, seq];
        let n = dims.iter().product();
        let z = Tensor::<3>::from_data(TensorData::new(values(n, 1), dims), &device).require_grad();
        let w = Tensor::<3>::from_data(TensorData::new(values(n, 2), dims), &device);
        let bias = Tensor::<2>::from_data(TensorData::new(padding_bias(batch, seq), [batch, seq]), &device);
        let mut times = vec![];
        for it in 0..8 {
            let t = std::time::Instant::now();
            let p = fused::attention_probs(z.clone(), bias.clone(), 0.125, Some((0.1, 3)));
            let grads = (p * w.clone()).sum().backward();
            vec_of(z.grad(&grads).unwrap().inner());
            if it >= 2 { times.push(t.elapsed().as_secs_f64() * 1e3); }
        }
        times.sort_by(|a, b| a.partial_cmp(b).unwrap());
        println!("TIMING [{batch}x{heads}, {seq}, {seq}] median {:.2} ms (min {:.2}, max {:.2})", times[times.len()/2], times[0], times[times.len()-1]);
    }
}
