//! A self-check of a communicator, like `nccl-tests`: every collective on
//! several lengths against values each rank can work out alone, the traffic
//! meter against the analytic volumes, a length mismatch reported on every
//! rank, and the compressed and sparse allreduce against an in-process
//! [`LocalComm`] world run on the same inputs (bit for bit).
//!
//! The `terse-comm-check` binary runs it under `mpirun`; the tests run it on
//! `local` worlds and, through that binary, on real MPI jobs.

use std::time::Duration;

use terse_rng::SplitMix64;

use crate::traffic::volume;
use crate::{
    Collective, CommError, Communicator, CompressedAllreduce, CompressionOptions, Geometry,
    LocalComm, Mask, ReduceOp, Scale, SparseAllreduce, SparseValues,
};

/// Lengths every collective is checked on (0, odd, word-straddling, large).
pub const LENGTHS: [usize; 6] = [0, 1, 7, 33, 1000, 65_537];

/// Runs every check; the first failure is returned as a message naming the
/// collective, length and element.
pub fn run(comm: &dyn Communicator) -> Result<(), String> {
    collectives(comm)?;
    traffic(comm)?;
    mismatch(comm)?;
    compressed(comm)?;
    sparse(comm)?;
    split(comm)?;
    comm.barrier().map_err(|e| e.to_string())
}

/// An integer-valued input: sums of these are exact in f32 in any order.
pub(crate) fn value(rank: usize, i: usize) -> f32 {
    ((rank * 7919 + i * 31) % 1000) as f32 - 500.0
}

/// The two halves of a split update against the allreduce they stand for:
/// a reduce-scatter over uneven ranges (the first ones empty from 3 ranks)
/// gives each rank the allreduce's bits in its range, and sharing the ranges
/// back gives every rank the whole allreduce. Values that are not integers,
/// so a different order of addition would show.
fn split(comm: &dyn Communicator) -> Result<(), String> {
    let (n, r) = (comm.world_size(), comm.rank());
    let e = |e: CommError| e.to_string();
    for len in LENGTHS {
        let ranges: Vec<std::ops::Range<usize>> = (0..n)
            .map(|k| k * k * len / (n * n)..(k + 1) * (k + 1) * len / (n * n))
            .collect();
        let values = || -> Vec<f32> { (0..len).map(|i| r as f32 + 0.1 + i as f32 / 3.0).collect() };
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let mut whole = values();
        comm.allreduce_f32(&mut whole, ReduceOp::Mean).map_err(e)?;
        let mut halves = values();
        comm.reduce_scatter_mean_f32(&mut halves, &ranges)
            .map_err(e)?;
        let mine = ranges[r].clone();
        expect_eq(
            &format!("reduce_scatter_mean_f32 of {len}, rank {r}'s range"),
            &bits(&halves[mine.clone()]),
            &bits(&whole[mine]),
        )?;
        comm.share_ranges_f32(&mut halves, &ranges).map_err(e)?;
        expect_eq(
            &format!("share_ranges_f32 of {len}"),
            &bits(&halves),
            &bits(&whole),
        )?;
    }
    Ok(())
}

fn fail<T>(what: String) -> Result<T, String> {
    Err(what)
}

fn expect_eq<T: PartialEq + std::fmt::Debug>(
    what: &str,
    got: &[T],
    want: &[T],
) -> Result<(), String> {
    if got.len() != want.len() {
        return fail(format!(
            "{what}: {} elements, expected {}",
            got.len(),
            want.len()
        ));
    }
    match got.iter().zip(want).position(|(g, w)| g != w) {
        Some(i) => fail(format!(
            "{what}: element {i} is {:?}, expected {:?}",
            got[i], want[i]
        )),
        None => Ok(()),
    }
}

fn collectives(comm: &dyn Communicator) -> Result<(), String> {
    let (n, r) = (comm.world_size(), comm.rank());
    let e = |e: CommError| e.to_string();
    for len in LENGTHS {
        for op in [ReduceOp::Sum, ReduceOp::Mean] {
            let mut buf: Vec<f32> = (0..len).map(|i| value(r, i)).collect();
            comm.allreduce_f32(&mut buf, op).map_err(e)?;
            let want: Vec<f32> = (0..len)
                .map(|i| {
                    let sum: f32 = (0..n).map(|k| value(k, i)).sum();
                    if op == ReduceOp::Mean {
                        sum * (1.0 / n as f32)
                    } else {
                        sum
                    }
                })
                .collect();
            expect_eq(&format!("allreduce {op:?} of {len}"), &buf, &want)?;
        }
        for root in 0..n {
            let mut f: Vec<f32> = (0..len).map(|i| value(r, i)).collect();
            comm.broadcast_f32(&mut f, root).map_err(e)?;
            let want: Vec<f32> = (0..len).map(|i| value(root, i)).collect();
            expect_eq(&format!("broadcast_f32 of {len} from {root}"), &f, &want)?;
            let mut u: Vec<u32> = (0..len).map(|i| (r * len + i) as u32).collect();
            comm.broadcast_u32(&mut u, root).map_err(e)?;
            let want: Vec<u32> = (0..len).map(|i| (root * len + i) as u32).collect();
            expect_eq(&format!("broadcast_u32 of {len} from {root}"), &u, &want)?;
            let mut b: Vec<u8> = (0..len).map(|i| (r + i) as u8).collect();
            comm.broadcast_u8(&mut b, root).map_err(e)?;
            let want: Vec<u8> = (0..len).map(|i| (root + i) as u8).collect();
            expect_eq(&format!("broadcast_u8 of {len} from {root}"), &b, &want)?;
        }
        // All-gather: rank k contributes f(k, i) for i < len.
        let f = |k: usize, i: usize| (k * 100_000 + i) as u32;
        let send: Vec<u32> = (0..len).map(|i| f(r, i)).collect();
        let want: Vec<u32> = (0..n)
            .flat_map(|k| (0..len).map(move |i| f(k, i)))
            .collect();
        widths(
            ("all_gather", &format!("of {len}")),
            (&send, &want, |x| x as u8),
            |s, g| comm.all_gather_u32(s, g),
            |s, g| comm.all_gather_f32(s, g),
            |s, g| comm.all_gather_u8(s, g),
        )?;
        // All-to-all: rank k's chunk j holds g(k, j, i).
        let g = |k: usize, j: usize, i: usize| (k * 1_000_000 + j * 10_000 + i) as u32;
        let send: Vec<u32> = (0..n)
            .flat_map(|j| (0..len).map(move |i| g(r, j, i)))
            .collect();
        let want: Vec<u32> = (0..n)
            .flat_map(|k| (0..len).map(move |i| g(k, r, i)))
            .collect();
        widths(
            ("all_to_all", &format!("of {len} per rank")),
            (&send, &want, |x| (x ^ (x >> 8)) as u8),
            |s, g| comm.all_to_all_u32(s, g),
            |s, g| comm.all_to_all_f32(s, g),
            |s, g| comm.all_to_all_u8(s, g),
        )?;
        comm.barrier().map_err(e)?;
    }
    Ok(())
}

/// The u32 values an exchange sends (`send`) and must receive (`want`),
/// and the byte of each that its u8 call is checked with.
type Sent<'a> = (&'a [u32], &'a [u32], fn(u32) -> u8);

/// Checks the u32, f32 and u8 calls of the exchange `what` (its name, and
/// the size for messages): the f32 call on the same values, the u8 call on
/// their bytes.
fn widths(
    what: (&str, &str),
    (send, want, byte): Sent<'_>,
    u32s: impl FnOnce(&[u32], &mut [u32]) -> Result<(), CommError>,
    f32s: impl FnOnce(&[f32], &mut [f32]) -> Result<(), CommError>,
    u8s: impl FnOnce(&[u8], &mut [u8]) -> Result<(), CommError>,
) -> Result<(), String> {
    let (name, size) = what;
    let e = |e: CommError| e.to_string();
    let mut got = vec![u32::MAX; want.len()];
    u32s(send, &mut got).map_err(e)?;
    expect_eq(&format!("{name}_u32 {size}"), &got, want)?;
    let sendf: Vec<f32> = send.iter().map(|&x| x as f32).collect();
    let mut gotf = vec![f32::NAN; want.len()];
    f32s(&sendf, &mut gotf).map_err(e)?;
    let wantf: Vec<f32> = want.iter().map(|&x| x as f32).collect();
    expect_eq(&format!("{name}_f32 {size}"), &gotf, &wantf)?;
    let sendb: Vec<u8> = send.iter().map(|&x| byte(x)).collect();
    let mut gotb = vec![0xaa; want.len()];
    u8s(&sendb, &mut gotb).map_err(e)?;
    let wantb: Vec<u8> = want.iter().map(|&x| byte(x)).collect();
    expect_eq(&format!("{name}_u8 {size}"), &gotb, &wantb)
}

fn traffic(comm: &dyn Communicator) -> Result<(), String> {
    let (n, r) = (comm.world_size(), comm.rank());
    let e = |e: CommError| e.to_string();
    let len = 1000;
    let check = |kind: Collective,
                 root: usize,
                 bytes: usize,
                 run: &dyn Fn() -> Result<(), CommError>| {
        let before = comm.traffic();
        run().map_err(e)?;
        let delta = (comm.traffic() - before).of(kind);
        let (sent, received) = volume(kind, n, r, root, bytes);
        if (delta.calls, delta.sent, delta.received) != (1, sent, received) {
            return fail(format!(
                "traffic of {kind}: {delta:?}, expected 1 call, {sent} sent, {received} received"
            ));
        }
        Ok(())
    };
    check(Collective::Allreduce, 0, 4 * len, &|| {
        comm.allreduce_f32(&mut vec![1.0; len], ReduceOp::Sum)
    })?;
    check(Collective::Broadcast, n - 1, len, &|| {
        comm.broadcast_u8(&mut vec![0; len], n - 1)
    })?;
    check(Collective::AllGather, 0, 4 * len, &|| {
        comm.all_gather_u32(&vec![0; len], &mut vec![0; n * len])
    })?;
    check(Collective::AllToAll, 0, 4 * n * len, &|| {
        comm.all_to_all_f32(&vec![0.0; n * len], &mut vec![0.0; n * len])
    })?;
    check(Collective::Barrier, 0, 0, &|| comm.barrier())?;
    // The closed forms themselves, for n > 1: ring allreduce 2(n-1)/n·B.
    if n > 1 && volume(Collective::Allreduce, n, r, 0, 4 * n).0 != 8 * (n as u64 - 1) {
        return fail("ring allreduce volume is not 2(n-1)/n·B".into());
    }
    Ok(())
}

fn mismatch(comm: &dyn Communicator) -> Result<(), String> {
    let n = comm.world_size();
    if n == 1 {
        return Ok(());
    }
    let last = n - 1;
    let len = if comm.rank() == last { 11 } else { 10 };
    match comm.allreduce_f32(&mut vec![0.0; len], ReduceOp::Sum) {
        Err(CommError::RankMismatch {
            rank,
            expected: 10,
            actual: 11,
            ..
        }) if rank == last => {}
        other => return fail(format!("a length mismatch on rank {last} gave {other:?}")),
    }
    // A rank calling another collective is named too, and the world goes on.
    let result = if comm.rank() == last {
        comm.barrier()
    } else {
        comm.broadcast_u8(&mut [], 0)
    };
    match result {
        Err(CommError::CallMismatch { rank, .. }) if rank == last => Ok(()),
        other => fail(format!(
            "a collective mismatch on rank {last} gave {other:?}"
        )),
    }
}

/// Rank `rank`'s input to call `call` of a compressed-allreduce check.
pub fn compressed_input(seed: u64, rank: usize, call: usize, len: usize) -> Vec<f32> {
    let mut rng = SplitMix64::new(seed ^ ((rank as u64) << 32) ^ (call as u64) << 48);
    (0..len)
        .map(|i| rng.normal() * (1.0 + (i % 7) as f32))
        .collect()
}

/// The option sets the checks run.
pub const OPTIONS: [CompressionOptions; 4] = [
    CompressionOptions {
        scale: Scale::L1,
        scale_block: None,
        geometry: Geometry::Chunks,
    },
    CompressionOptions {
        scale: Scale::L2,
        scale_block: None,
        geometry: Geometry::Chunks,
    },
    CompressionOptions {
        scale: Scale::L1,
        scale_block: Some(64),
        geometry: Geometry::Chunks,
    },
    CompressionOptions {
        scale: Scale::L2,
        scale_block: None,
        geometry: Geometry::DeepSpeed,
    },
];

fn compressed(comm: &dyn Communicator) -> Result<(), String> {
    let (n, r) = (comm.world_size(), comm.rank());
    let calls = 10;
    for len in [1usize, 33, 1000, 4099] {
        for options in OPTIONS {
            // The same inputs through an in-process world of threads.
            let reference = LocalComm::run(n, Duration::from_secs(60), |local| {
                let mut state =
                    CompressedAllreduce::new(len, local, options).map_err(|e| e.to_string())?;
                let (mut worker_error, mut server_error) = state.zeroed_errors();
                (0..calls)
                    .map(|call| {
                        let mut x = compressed_input(7, local.rank(), call, len);
                        state
                            .allreduce_mean(local, &mut x, &mut worker_error, &mut server_error)
                            .map_err(|e| e.to_string())?;
                        Ok(x)
                    })
                    .collect::<Result<Vec<_>, String>>()
            });
            let reference = match reference.into_iter().next() {
                Some(Ok(outputs)) => outputs?,
                _ => return fail("the in-process reference world failed".into()),
            };
            let mut state =
                CompressedAllreduce::new(len, comm, options).map_err(|e| e.to_string())?;
            let (mut worker_error, mut server_error) = state.zeroed_errors();
            for (call, want) in reference.iter().enumerate() {
                let mut x = compressed_input(7, r, call, len);
                state
                    .allreduce_mean(comm, &mut x, &mut worker_error, &mut server_error)
                    .map_err(|e| e.to_string())?;
                let what = format!("compressed allreduce {options:?}, len {len}, call {call}");
                let bits: Vec<u32> = x.iter().map(|v| v.to_bits()).collect();
                let want: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
                expect_eq(&what, &bits, &want)?;
            }
        }
    }
    Ok(())
}

fn sparse(comm: &dyn Communicator) -> Result<(), String> {
    let len = 50_000;
    let masks = [
        Mask::Hash { seed: 3, k: 0.1 },
        Mask::Cyclic {
            seed: 3,
            k: 0.25,
            len,
        },
    ];
    for mask in masks {
        for precision in [SparseValues::F32, SparseValues::F16] {
            sparse_with(comm, mask, precision, len)?;
        }
    }
    Ok(())
}

/// What rank `r`'s value `v` becomes after travelling at `precision`.
fn travel(precision: SparseValues, v: f32) -> f32 {
    match precision {
        SparseValues::F32 => v,
        SparseValues::F16 => half::f16::from_f32(v).to_f32(),
    }
}

fn sparse_with(
    comm: &dyn Communicator,
    mask: Mask,
    precision: SparseValues,
    len: usize,
) -> Result<(), String> {
    let (n, r) = (comm.world_size(), comm.rank());
    let what = |t: u64| format!("sparse allreduce {mask:?} {precision:?} step {t}");
    let mut sparse =
        SparseAllreduce::with_precision(mask, vec![100..120, 40_000..40_005], precision);
    for t in 1..=4u64 {
        let mut buf: Vec<f32> = (0..len).map(|i| value(r, i + t as usize)).collect();
        let before = comm.traffic();
        let selection = sparse
            .allreduce_mean(comm, t, &mut buf)
            .map_err(|e| e.to_string())?;
        let mut selected = vec![false; len];
        selection.indices().for_each(|j| selected[j] = true);
        let count = selection.len();
        let want: Vec<f32> = (0..len)
            .map(|i| {
                if !selected[i] {
                    return value(r, i + t as usize);
                }
                let sum = (0..n)
                    .map(|k| travel(precision, value(k, i + t as usize)))
                    .sum::<f32>();
                travel(precision, sum * (1.0 / n as f32))
            })
            .collect();
        expect_eq(&what(t), &buf, &want)?;
        if !(100..120).chain(40_000..40_005).all(|j| selected[j]) {
            return fail(format!(
                "{}: an always-synchronised element was left out",
                what(t)
            ));
        }
        let traffic = comm.traffic() - before;
        let (sent, expected) = match precision {
            SparseValues::F32 => (
                traffic.of(Collective::Allreduce).sent,
                volume(Collective::Allreduce, n, r, 0, 4 * count).0,
            ),
            SparseValues::F16 => {
                let part = count.div_ceil(n);
                (
                    traffic.sent(),
                    volume(Collective::AllToAll, n, r, 0, 2 * n * part).0
                        + volume(Collective::AllGather, n, r, 0, 2 * part).0,
                )
            }
        };
        if sent != expected {
            return fail(format!(
                "{}: {sent} bytes sent for {count} values, expected {expected}",
                what(t)
            ));
        }
    }
    Ok(())
}
