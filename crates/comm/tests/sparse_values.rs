//! SLAMB's fp16 value option against a float64 reference: the mean of the
//! fp16-rounded values of every rank, rounded to fp16, on every rank alike,
//! for 1 to 4 ranks and lengths that do not divide by the world size; and
//! half the bytes of the fp32 allreduce. At world size 1 SLAMB's sparse
//! allreduce leaves its buffer untouched (no fp16 rounding) and sends nothing.

use std::time::Duration;

use half::f16;
use terse_comm::{
    Communicator, LocalComm, ReduceOp, SparseAllreduce, SparseValues, allreduce_mean_f16,
};
use terse_compress::mask::Mask;
use terse_rng::{SplitMix64, mix64};

/// Values from 1e-4 to 1e2 in magnitude, both signs.
fn values(rank: usize, len: usize) -> Vec<f32> {
    let mut rng = SplitMix64::new(mix64(rank as u64 + 17));
    (0..len)
        .map(|_| rng.symmetric() * 10f32.powf(4.0 * rng.symmetric().abs() - 2.0))
        .collect()
}

#[test]
fn the_fp16_mean_is_the_rounded_mean_of_rounded_values_on_every_rank() {
    for n in 1..=4 {
        for len in [0usize, 1, 5, 1001, 65_539] {
            let results = LocalComm::run(n, Duration::from_secs(60), |comm| {
                let mut v = values(comm.rank(), len);
                let before = comm.traffic();
                allreduce_mean_f16(comm, &mut v).unwrap();
                (v, (comm.traffic() - before).sent())
            });
            let results: Vec<(Vec<f32>, u64)> = results.into_iter().map(Result::unwrap).collect();
            let inputs: Vec<Vec<f32>> = (0..n).map(|r| values(r, len)).collect();
            let mut exact = 0usize;
            for i in 0..len {
                let mean: f64 = inputs
                    .iter()
                    .map(|v| f64::from(f16::from_f32(v[i]).to_f32()))
                    .sum::<f64>()
                    / n as f64;
                let want = f16::from_f64(mean);
                let got = f16::from_f32(results[0].0[i]);
                assert_eq!(
                    f16::from_f32(results[0].0[i]).to_f32(),
                    results[0].0[i],
                    "the result is an fp16 value"
                );
                // The f32 sum rounds when the ranks' values cancel: allow that
                // rounding (n·2^-24 of the largest input) plus one fp16 ulp.
                let largest = inputs.iter().map(|v| v[i].abs()).fold(0.0f32, f32::max);
                let accumulation = n as f64 * f64::from(largest) * 2f64.powi(-24);
                let ulp =
                    f64::from(f16::from_bits(want.to_bits() + 1).to_f32() - want.to_f32()).abs();
                let error = (f64::from(got.to_f32()) - f64::from(want.to_f32())).abs();
                assert!(
                    error <= ulp + accumulation,
                    "{n} ranks, len {len}, [{i}]: {got} vs {want}"
                );
                let ulps = usize::from(error > 0.0);
                exact += 1 - ulps;
            }
            if len > 1000 {
                assert!(
                    exact * 1000 >= len * 999,
                    "{n} ranks, len {len}: {exact} exact"
                );
            }
            for (rank, (v, _)) in results.iter().enumerate() {
                let same = v
                    .iter()
                    .zip(&results[0].0)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "{n} ranks, len {len}: rank {rank} differs from rank 0"
                );
            }
            // Half an fp32 allreduce: 2·(n-1)/n · 2 bytes per (padded) element.
            let padded = len.div_ceil(n) * n;
            let want_bytes = (2 * (n - 1) * 2 * padded / n) as u64;
            assert_eq!(results[0].1, want_bytes, "{n} ranks, len {len}");
            if n > 1 && len == 65_539 {
                let fp32 = LocalComm::run(n, Duration::from_secs(60), |comm| {
                    let mut v = values(comm.rank(), len);
                    comm.allreduce_f32(&mut v, ReduceOp::Mean).unwrap();
                    comm.traffic().sent()
                });
                let fp32 = *fp32[0].as_ref().unwrap();
                let ratio = fp32 as f64 / want_bytes as f64;
                assert!((ratio - 2.0).abs() < 1e-3, "{n} ranks: ratio {ratio}");
            }
        }
    }
}

#[test]
fn a_world_of_one_keeps_the_buffer_exactly() {
    for precision in [SparseValues::F32, SparseValues::F16] {
        let results = LocalComm::run(1, Duration::from_secs(60), |comm| {
            let mask = Mask::Hash { seed: 3, k: 0.5 };
            let mut sparse = SparseAllreduce::with_precision(mask, vec![0..10, 20..30], precision);
            let input = values(0, 5003);
            let mut v = input.clone();
            let before = comm.traffic();
            let selected = sparse.allreduce_mean(comm, 7, &mut v).unwrap().len();
            let same = v
                .iter()
                .zip(&input)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            (same, selected, (comm.traffic() - before).sent())
        });
        let (same, selected, sent) = results.into_iter().next().unwrap().unwrap();
        assert!(same, "{precision:?}: the buffer changed at world size 1");
        assert!(
            selected > 2000,
            "{precision:?}: the selection is still computed"
        );
        assert_eq!(sent, 0, "{precision:?}: bytes sent at world size 1");
    }
}
