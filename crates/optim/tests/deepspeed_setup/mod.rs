//! Shared by the replays against DeepSpeed's own optimizers: the fixtures'
//! tensors, and distances in float64.

#![allow(dead_code)]

use std::collections::HashMap;

/// Every f32 and i32 tensor of the safetensors file at `path` (relative to
/// the crate), flat, the i32 ones as f32 values (flags and counts); other
/// dtypes (DeepSpeed's float64 coefficients, kept for reading by hand)
/// are left out.
pub fn fixture(path: &str) -> HashMap<String, Vec<f32>> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    file.tensors()
        .into_iter()
        .filter_map(|(name, view)| {
            let value: fn([u8; 4]) -> f32 = match view.dtype() {
                safetensors::Dtype::F32 => f32::from_le_bytes,
                safetensors::Dtype::I32 => |b| i32::from_le_bytes(b) as f32,
                _ => return None,
            };
            let values = view
                .data()
                .chunks_exact(4)
                .map(|b| value(b.try_into().unwrap()))
                .collect();
            Some((name, values))
        })
        .collect()
}

/// `Σv²`.
pub fn squared_norm(v: &[f32]) -> f64 {
    v.iter().map(|&y| f64::from(y).powi(2)).sum()
}

/// `‖a − b‖²`.
pub fn squared_distance(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2))
        .sum()
}

/// `‖a − b‖ / ‖b‖`.
pub fn relative_l2(a: &[f32], b: &[f32]) -> f64 {
    (squared_distance(a, b) / squared_norm(b)).sqrt()
}
