//! The compressed allreduce against a float64 simulation of ALGORITHMS.md
//! written here, for world sizes 2, 3, 4, 8, lengths not divisible by
//! 32·n, both scales and per-block scales, over 10 successive calls (errors
//! carry over); the output is bit-identical on every rank. Then error
//! feedback at work over 200 calls, and the traffic meter at 2^24 elements.
//! At world size 1 the allreduce is the identity: no quantisation, no error
//! buffers, no traffic.

use std::time::Duration;

use terse_comm::selfcheck::{OPTIONS, compressed_input};
use terse_comm::{
    Collective, Communicator, CompressedAllreduce, CompressionOptions, Geometry, LocalComm,
    ReduceOp, Scale,
};

/// What one rank reports after a call.
#[derive(Clone)]
struct Snapshot {
    output: Vec<f32>,
    worker_error: Vec<f32>,
    server_error: Vec<f32>,
}

/// Runs `calls` compressed allreduces on `n` threads; snapshots per call per rank.
fn run_world(
    n: usize,
    len: usize,
    options: CompressionOptions,
    calls: usize,
    input: impl Fn(usize, usize) -> Vec<f32> + Sync,
) -> Vec<Vec<Snapshot>> {
    run_world_made(CompressedAllreduce::new, n, len, options, calls, input)
}

/// [`run_world`] with the state made by `make` (`new`, or
/// `compressing_alone`).
fn run_world_made(
    make: fn(
        usize,
        &dyn Communicator,
        CompressionOptions,
    ) -> Result<CompressedAllreduce, terse_comm::CommError>,
    n: usize,
    len: usize,
    options: CompressionOptions,
    calls: usize,
    input: impl Fn(usize, usize) -> Vec<f32> + Sync,
) -> Vec<Vec<Snapshot>> {
    LocalComm::run(n, Duration::from_secs(120), |comm| {
        let mut state = make(len, comm, options).unwrap();
        let (mut worker_error, mut server_error) = state.zeroed_errors();
        (0..calls)
            .map(|call| {
                let mut x = input(comm.rank(), call);
                state
                    .allreduce_mean(comm, &mut x, &mut worker_error, &mut server_error)
                    .unwrap();
                Snapshot {
                    output: x,
                    worker_error: worker_error.clone(),
                    server_error: server_error.clone(),
                }
            })
            .collect()
    })
    .into_iter()
    .map(|r| r.expect("no rank panics"))
    .collect()
}

/// `C[y]` with error feedback in f64 over blocks of `block`: (q, new error, scales).
fn compress64(y: &[f64], block: usize, scale: Scale) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let mut q = Vec::with_capacity(y.len());
    let mut scales = Vec::new();
    for b in y.chunks(block.max(1)) {
        let n = b.len() as f64;
        let s = match scale {
            Scale::L1 => b.iter().map(|v| v.abs()).sum::<f64>() / n,
            Scale::L2 => (b.iter().map(|v| v * v).sum::<f64>() / n).sqrt(),
        };
        scales.push(s);
        q.extend(b.iter().map(|&v| if v >= 0.0 { s } else { -s }));
    }
    let e = y.iter().zip(&q).map(|(y, q)| y - q).collect();
    (q, e, scales)
}

/// Checks one call of every rank against the simulation started from the
/// states the ranks held before it. Returns how many server elements were
/// too close to zero for f32 and f64 to be sure to agree on their sign.
#[allow(clippy::too_many_arguments)]
fn check_call(
    n: usize,
    len: usize,
    options: CompressionOptions,
    inputs: &[Vec<f32>],
    before: &[(Vec<f32>, Vec<f32>)],
    after: &[Snapshot],
    what: &str,
) -> usize {
    // DeepSpeed's geometry (runtime/comm/nccl.py and its optimizers'
    // `corrected_tensor_size`): padded to a multiple of n·lcm(n, 8), equal
    // chunks, one worker scale over the whole padded buffer.
    let deepspeed = options.geometry == Geometry::DeepSpeed;
    let total = if deepspeed {
        let lcm = (1..=8 * n).find(|m| m % n == 0 && m % 8 == 0).unwrap();
        len.div_ceil(n * lcm) * n * lcm
    } else {
        len
    };
    let chunk = if deepspeed {
        total / n
    } else {
        len.div_ceil(n).div_ceil(32) * 32
    };
    let range = |j: usize| (j * chunk).min(total)..((j + 1) * chunk).min(total);
    let block = |real: usize| options.scale_block.unwrap_or(real.max(1));
    let close = |got: f32, want: f64, scale: f64, name: &str| {
        let tol = 1e-5 * scale.max(1e-12);
        assert!(
            (f64::from(got) - want).abs() <= tol,
            "{what}: {name}: {got} vs {want} (tolerance {tol})"
        );
    };
    // Phase 1: every worker compresses every chunk.
    let mut dequant = vec![vec![0.0f64; total]; n];
    let worker_chunks = |j: usize| if deepspeed { 0..total } else { range(j) };
    let workers_chunks = if deepspeed { 1 } else { n };
    for i in 0..n {
        for j in 0..workers_chunks {
            let r = worker_chunks(j);
            let input = |k: usize| inputs[i].get(k).copied().unwrap_or(0.0);
            let y: Vec<f64> = r
                .clone()
                .map(|k| f64::from(input(k)) + f64::from(before[i].0[k]))
                .collect();
            let (q, e, scales) = compress64(&y, block(r.len()), options.scale);
            let smax = scales.iter().cloned().fold(0.0, f64::max);
            for (o, k) in r.enumerate() {
                dequant[i][k] = q[o];
                close(
                    after[i].worker_error[k],
                    e[o],
                    smax,
                    &format!("rank {i} worker error {k}"),
                );
            }
        }
    }
    // Phase 3: each server averages, adds its error, recompresses.
    let mut ambiguous = 0;
    let mut output = vec![0.0f64; total];
    let mut output_scale = vec![0.0f64; total];
    for j in 0..n {
        let r = range(j);
        let z: Vec<f64> = r
            .clone()
            .enumerate()
            .map(|(o, k)| {
                (0..n).map(|i| dequant[i][k]).sum::<f64>() / n as f64 + f64::from(before[j].1[o])
            })
            .collect();
        let (q, e, scales) = compress64(&z, block(r.len()), options.scale);
        let smax = scales.iter().cloned().fold(0.0, f64::max);
        for (o, k) in r.enumerate() {
            if z[o].abs() <= 1e-5 * smax {
                // f32 rounding may have given the other sign: skip.
                ambiguous += 1;
                output[k] = f64::NAN;
                continue;
            }
            output[k] = q[o];
            output_scale[k] = smax;
            close(
                after[j].server_error[o],
                e[o],
                smax,
                &format!("rank {j} server error {o}"),
            );
        }
    }
    for (i, snapshot) in after.iter().enumerate() {
        for k in 0..len {
            if !output[k].is_nan() {
                close(
                    snapshot.output[k],
                    output[k],
                    output_scale[k],
                    &format!("rank {i} output {k}"),
                );
            }
        }
        let bits: Vec<u32> = snapshot.output.iter().map(|v| v.to_bits()).collect();
        let first: Vec<u32> = after[0].output.iter().map(|v| v.to_bits()).collect();
        assert_eq!(bits, first, "{what}: rank {i} differs from rank 0");
    }
    ambiguous
}

#[test]
fn matches_a_float64_simulation_over_successive_calls() {
    let calls = 10;
    let mut ambiguous = 0;
    let mut checked = 0;
    for n in [2, 3, 4, 8] {
        for len in [1usize, 33, 1000, 5003] {
            assert!(len % (32 * n) != 0);
            for options in OPTIONS {
                let input = |rank: usize, call: usize| compressed_input(11, rank, call, len);
                let snapshots = run_world(n, len, options, calls, input);
                let mut before: Vec<(Vec<f32>, Vec<f32>)> = snapshots
                    .iter()
                    .map(|rank| {
                        let (worker, server) =
                            (rank[0].worker_error.len(), rank[0].server_error.len());
                        (vec![0.0; worker], vec![0.0; server])
                    })
                    .collect();
                for call in 0..calls {
                    let inputs: Vec<Vec<f32>> = (0..n).map(|i| input(i, call)).collect();
                    let after: Vec<Snapshot> = snapshots.iter().map(|r| r[call].clone()).collect();
                    let what = format!("n {n}, len {len}, {options:?}, call {call}");
                    ambiguous += check_call(n, len, options, &inputs, &before, &after, &what);
                    checked += len;
                    before = after
                        .iter()
                        .map(|s| (s.worker_error.clone(), s.server_error.clone()))
                        .collect();
                }
                // Errors really carried over: they are not zero after the
                // calls (one element is its own scale: no error to keep).
                let worker = &snapshots[0][calls - 1].worker_error;
                assert!(
                    len == 1 || worker.iter().any(|&e| e != 0.0),
                    "n {n} len {len}: no worker error kept"
                );
            }
        }
    }
    assert!(
        ambiguous * 1000 <= checked,
        "{ambiguous} of {checked} elements too close to call"
    );
}

/// A world of one made to compress (`compressing_alone`, what
/// `terse-gpu-exchange-check` runs on one GPU) quantises, keeps its errors
/// and exchanges its messages with itself as the simulation of one rank
/// does; `new` leaves the same input as it is (below).
#[test]
fn a_world_of_one_made_to_compress_matches_the_simulation() {
    let calls = 4;
    for len in [33usize, 1000, 5003] {
        for options in OPTIONS {
            let input = |rank: usize, call: usize| compressed_input(11, rank, call, len);
            let snapshots = run_world_made(
                CompressedAllreduce::compressing_alone,
                1,
                len,
                options,
                calls,
                input,
            );
            let rank = &snapshots[0];
            let mut before = vec![(
                vec![0.0; rank[0].worker_error.len()],
                vec![0.0; rank[0].server_error.len()],
            )];
            for (call, after) in rank.iter().enumerate() {
                let what = format!("alone, len {len}, {options:?}, call {call}");
                let after = vec![after.clone()];
                let ambiguous =
                    check_call(1, len, options, &[input(0, call)], &before, &after, &what);
                assert!(
                    ambiguous * 100 <= len,
                    "{what}: {ambiguous} elements too close to call"
                );
                before = vec![(after[0].worker_error.clone(), after[0].server_error.clone())];
            }
            assert!(
                rank[0].output != input(0, 0),
                "alone, len {len}: the output is its input (nothing compressed)"
            );
        }
    }
}

#[test]
fn a_world_of_one_returns_its_input_bit_for_bit() {
    for len in [0usize, 1, 33, 5003] {
        for options in OPTIONS {
            let results = LocalComm::run(1, Duration::from_secs(60), |comm| {
                let mut state = CompressedAllreduce::new(len, comm, options).unwrap();
                let (mut worker_error, mut server_error) = state.zeroed_errors();
                let before = comm.traffic();
                let mut same = true;
                for call in 0..5 {
                    let input = compressed_input(11, 0, call, len);
                    let mut x = input.clone();
                    state
                        .allreduce_mean(comm, &mut x, &mut worker_error, &mut server_error)
                        .unwrap();
                    same &= x
                        .iter()
                        .zip(&input)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                }
                // Zeros included: sign(0) = +1 must not turn them into ±s.
                let mut zeros = vec![0.0f32; len];
                state
                    .allreduce_mean(comm, &mut zeros, &mut worker_error, &mut server_error)
                    .unwrap();
                same &= zeros.iter().all(|v| v.to_bits() == 0);
                let errors = worker_error.len() + server_error.len();
                (same, errors, (comm.traffic() - before).sent())
            });
            let (same, errors, sent) = results.into_iter().next().unwrap().unwrap();
            assert!(same, "len {len}, {options:?}: output differs from input");
            assert_eq!(errors, 0, "len {len}: error buffers at world size 1");
            assert_eq!(sent, 0, "len {len}: bytes sent at world size 1");
        }
    }
}

#[test]
fn error_feedback_keeps_the_running_sum_close_to_the_true_mean() {
    let (n, len, calls) = (4, 3000, 200);
    // Inputs with a persistent per-element mean: compression without error
    // feedback loses the small components for good.
    let input = |rank: usize, call: usize| -> Vec<f32> {
        let noise = compressed_input(5, rank, call, len);
        (0..len)
            .map(|k| 0.05 * ((k % 17) as f32 - 8.0) + 0.5 * noise[k])
            .collect()
    };
    let drift = |fresh_each_call: bool| -> Vec<f64> {
        let snapshots: Vec<Vec<Snapshot>> = if fresh_each_call {
            (0..calls)
                .map(|call| run_world(n, len, Default::default(), 1, |r, _| input(r, call)))
                .map(|world| world.into_iter().map(|mut calls| calls.remove(0)).collect())
                .collect::<Vec<Vec<Snapshot>>>()
        } else {
            let world = run_world(n, len, Default::default(), calls, input);
            (0..calls)
                .map(|c| world.iter().map(|r| r[c].clone()).collect())
                .collect()
        };
        let mut sum_out = vec![0.0f64; len];
        let mut sum_mean = vec![0.0f64; len];
        let mut worst = Vec::with_capacity(calls);
        for (call, ranks) in snapshots.iter().enumerate() {
            let inputs: Vec<Vec<f32>> = (0..n).map(|i| input(i, call)).collect();
            for k in 0..len {
                sum_out[k] += f64::from(ranks[0].output[k]);
                sum_mean[k] += inputs.iter().map(|x| f64::from(x[k])).sum::<f64>() / n as f64;
            }
            let d = sum_out
                .iter()
                .zip(&sum_mean)
                .map(|(a, b)| (a - b).powi(2))
                .sum::<f64>();
            worst.push((d / len as f64).sqrt());
        }
        worst
    };
    let with_feedback = drift(false);
    let early = with_feedback[..100].iter().cloned().fold(0.0, f64::max);
    let late = with_feedback[100..].iter().cloned().fold(0.0, f64::max);
    // Bounded: the distance is the current errors, never an accumulation.
    assert!(
        late <= 2.0 * early + 0.5,
        "drift grows: {early} then {late}"
    );
    assert!(late < 3.0, "rms distance {late}");
    let without = drift(true);
    eprintln!(
        "rms distance of running sums: with feedback ≤ {early:.3} (calls 1-100), \
         ≤ {late:.3} (101-200); without: {:.3} after {calls}",
        without[calls - 1]
    );
    assert!(
        without[calls - 1] > 10.0 * late,
        "without error feedback the distance should grow ({} vs {late})",
        without[calls - 1]
    );
}

#[test]
fn sends_32_times_fewer_bytes_than_the_fp32_allreduce() {
    let (n, len) = (4usize, 1usize << 24);
    let results = LocalComm::run(n, Duration::from_secs(300), |comm| {
        let mut x = compressed_input(1, comm.rank(), 0, len);
        let mut state = CompressedAllreduce::new(len, comm, Default::default()).unwrap();
        let (mut worker_error, mut server_error) = state.zeroed_errors();
        let before = comm.traffic();
        state
            .allreduce_mean(comm, &mut x, &mut worker_error, &mut server_error)
            .unwrap();
        let compressed = comm.traffic() - before;
        let before = comm.traffic();
        comm.allreduce_f32(&mut x, ReduceOp::Mean).unwrap();
        let plain = comm.traffic() - before;
        (compressed, plain)
    });
    for result in results {
        let (compressed, plain) = result.unwrap();
        // Two phases of (n-1)/n of d/8 bytes, plus one 4-byte scale per message.
        let analytic =
            2.0 * (n - 1) as f64 / n as f64 * len as f64 / 8.0 + (2 * (n - 1) * 4) as f64;
        let sent = compressed.sent() as f64;
        assert!(
            (sent - analytic).abs() <= 0.01 * analytic,
            "{sent} vs {analytic}"
        );
        assert_eq!(compressed.of(Collective::AllToAll).calls, 1);
        assert_eq!(compressed.of(Collective::AllGather).calls, 1);
        assert_eq!(compressed.of(Collective::Allreduce).calls, 0);
        let ratio = plain.sent() as f64 / sent;
        assert!(ratio >= 30.0, "only {ratio:.1}x fewer bytes");
    }
}

/// An empty buffer on several ranks (a 1-bit optimizer whose every
/// parameter is kept out of compression) sends nothing and returns, on
/// every rank, for every option.
#[test]
fn an_empty_buffer_sends_nothing() {
    for n in [2usize, 3] {
        for options in OPTIONS {
            let results = LocalComm::run(n, Duration::from_secs(60), |comm| {
                let mut state = CompressedAllreduce::new(0, comm, options).unwrap();
                let before = comm.traffic();
                state
                    .allreduce_mean(comm, &mut [], &mut [], &mut [])
                    .unwrap();
                (state.compresses(), (comm.traffic() - before).sent())
            });
            for result in results {
                let (compresses, sent) = result.unwrap();
                assert!(!compresses, "{n} ranks, {options:?}");
                assert_eq!(sent, 0, "{n} ranks, {options:?}: bytes sent");
            }
        }
    }
}
