//! The `local` backend with real threads: the whole self-check (every
//! collective against values worked out independently, the traffic meter,
//! mismatch detection, compressed and sparse allreduce bit-identical to a
//! second world) for 1, 2, 3, 4 and 8 ranks; a value handed from rank 0 to
//! every rank; and failure: a rank that
//! panics, errors or never arrives makes every other rank fail promptly.
//! Ranks read each other's buffers in place (no copy is posted), so a test
//! also frees every buffer the moment its call returns and checks what the
//! next calls read.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use terse_comm::{
    CommError, Communicator, HandedValue, LocalComm, ReduceOp, SingleRank, selfcheck,
};

#[test]
fn every_collective_passes_the_self_check() {
    for n in [1, 2, 3, 4, 8] {
        for (rank, outcome) in
            LocalComm::run(n, Duration::from_secs(60), |comm| selfcheck::run(comm))
                .into_iter()
                .enumerate()
        {
            outcome
                .expect("no rank panics")
                .unwrap_or_else(|e| panic!("{n} ranks, rank {rank}: {e}"));
        }
    }
}

#[test]
fn allreduce_sums_in_rank_order_and_agrees_everywhere() {
    for n in [2, 3, 4] {
        let results = LocalComm::run(n, Duration::from_secs(60), |comm| {
            let r = comm.rank() as f32;
            // Non-integer values: the sum's rounding depends on the order.
            let mut sum: Vec<f32> = (0..1001).map(|i| r + 0.1 + i as f32 / 3.0).collect();
            comm.allreduce_f32(&mut sum, ReduceOp::Sum).unwrap();
            sum
        });
        let results: Vec<Vec<f32>> = results.into_iter().map(Result::unwrap).collect();
        for (i, &got) in results[0].iter().enumerate() {
            let mut want = 0.0f32;
            for r in 0..n {
                want += r as f32 + 0.1 + i as f32 / 3.0;
            }
            assert_eq!(got.to_bits(), want.to_bits(), "n {n} element {i}");
        }
        assert!(results.windows(2).all(|w| w[0] == w[1]), "ranks disagree");
    }
}

#[test]
fn reduce_scatter_then_all_gather_of_ranges_is_the_allreduce() {
    // Uneven ranges, the first ones empty for 3 and 4 ranks.
    for n in [2, 3, 4] {
        let len = 1001;
        let ranges: Vec<std::ops::Range<usize>> = (0..n)
            .map(|r| r * r * len / (n * n)..(r + 1) * (r + 1) * len / (n * n))
            .collect();
        let results = LocalComm::run(n, Duration::from_secs(60), |comm| {
            assert!(comm.shares_cores());
            let r = comm.rank();
            let values =
                || -> Vec<f32> { (0..len).map(|i| r as f32 + 0.1 + i as f32 / 3.0).collect() };
            let mut whole = values();
            comm.allreduce_f32(&mut whole, ReduceOp::Mean).unwrap();
            let mut halves = values();
            comm.reduce_scatter_mean_f32(&mut halves, &ranges).unwrap();
            let mine = ranges[r].clone();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&halves[mine.clone()]),
                bits(&whole[mine]),
                "n {n} rank {r}"
            );
            comm.share_ranges_f32(&mut halves, &ranges).unwrap();
            assert_eq!(
                bits(&halves),
                bits(&whole),
                "n {n} rank {r} after the gather"
            );
            // A range beyond the buffer is refused on every rank alike.
            let mut bad = ranges.clone();
            bad[n - 1].end = len + 1;
            assert!(comm.share_ranges_f32(&mut halves, &bad).is_err());
        });
        for result in results {
            result.expect("no rank panics");
        }
    }
}

#[test]
fn buffers_freed_after_each_call_are_never_read_again() {
    // Each call gets a fresh buffer of a new length and content, dropped as
    // soon as the call returns: a rank reading a stale or freed buffer would
    // see another call's values (or crash) and fail the exact comparison.
    let n = 4;
    let results = LocalComm::run(n, Duration::from_secs(60), |comm| {
        let r = comm.rank();
        for call in 0..200usize {
            let len = 1 + (call * 7919) % 5000;
            let value = |rank: usize, i: usize| (rank * 1_000_003 + call * 31 + i) as f32;
            let mut sum: Vec<f32> = (0..len).map(|i| value(r, i)).collect();
            comm.allreduce_f32(&mut sum, ReduceOp::Sum).unwrap();
            for (i, &got) in sum.iter().enumerate() {
                let mut want = 0.0f32;
                for rank in 0..n {
                    want += value(rank, i);
                }
                assert_eq!(got.to_bits(), want.to_bits(), "call {call} element {i}");
            }
            drop(sum);
            let send: Vec<u32> = (0..len as u32).map(|i| i ^ (r as u32) << 24).collect();
            let mut all = vec![0u32; len * n];
            comm.all_gather_u32(&send, &mut all).unwrap();
            drop(send);
            for (rank, part) in all.chunks(len).enumerate() {
                assert!(
                    part.iter()
                        .enumerate()
                        .all(|(i, &w)| w == (i as u32) ^ (rank as u32) << 24),
                    "call {call}: rank {rank}'s part"
                );
            }
        }
        // Rank 2 fails between calls; the others' next call must report it,
        // not read the buffer it no longer has.
        if r == 2 {
            comm.abort("stopped on purpose");
            return Err(CommError::PeerFailed {
                rank: 2,
                reason: "self".into(),
            });
        }
        let mut buf = vec![1.0f32; 4096];
        comm.allreduce_f32(&mut buf, ReduceOp::Sum)
    });
    for (rank, result) in results.into_iter().enumerate() {
        let err = result.expect("no rank panics").unwrap_err();
        if rank != 2 {
            assert_eq!(err.to_string(), "rank 2 failed: stopped on purpose");
        }
    }
}

#[test]
fn rank_zero_hands_one_value_to_every_rank_of_its_process() {
    for n in [2, 3, 4] {
        let made = AtomicUsize::new(0);
        let results = LocalComm::run(n, Duration::from_secs(60), |comm| {
            let mut make = || -> HandedValue {
                made.fetch_add(1, Ordering::SeqCst);
                Arc::new(vec![comm.rank() as u32 + 7; 3])
            };
            let handed = comm.hand_out(&mut make).unwrap().expect("threads share");
            // The next call's value is a new one: the first was not kept.
            let again = comm.hand_out(&mut make).unwrap().expect("threads share");
            (handed, again)
        });
        let results: Vec<_> = results.into_iter().map(Result::unwrap).collect();
        assert_eq!(
            made.load(Ordering::SeqCst),
            2,
            "{n} ranks: made on rank 0 only"
        );
        for (handed, again) in &results {
            assert!(Arc::ptr_eq(handed, &results[0].0), "one value, not copies");
            assert!(!Arc::ptr_eq(handed, again));
            assert_eq!(handed.downcast_ref::<Vec<u32>>(), Some(&vec![7; 3]));
        }
    }
    // A world of one, and ranks in separate processes, share nothing and
    // make nothing.
    fn never() -> HandedValue {
        panic!("nothing to hand out")
    }
    let one = LocalComm::run(1, Duration::from_secs(60), |comm| {
        comm.hand_out(&mut never).unwrap().is_none()
    });
    assert!(one[0].as_ref().unwrap());
    assert!(SingleRank::new().hand_out(&mut never).unwrap().is_none());
    // A rank in another collective is reported on every rank.
    let results = LocalComm::run(2, Duration::from_secs(60), |comm| {
        if comm.rank() == 0 {
            comm.hand_out(&mut || Arc::new(1u8)).map(|_| ())
        } else {
            comm.barrier()
        }
    });
    for r in results {
        assert!(
            matches!(r.unwrap(), Err(CommError::CallMismatch { rank: 1, .. })),
            "a hand-out met a barrier"
        );
    }
}

#[test]
fn a_bad_local_buffer_is_reported_here_and_at_the_other_ranks() {
    let results = LocalComm::run(3, Duration::from_secs(60), |comm| {
        // Rank 1's receive buffer is one element short.
        let recv_len = if comm.rank() == 1 { 5 } else { 6 };
        comm.all_gather_u32(&[1, 2], &mut vec![0; recv_len])
    });
    let results: Vec<_> = results.into_iter().map(Result::unwrap).collect();
    assert!(
        matches!(
            results[1],
            Err(CommError::LengthMismatch {
                expected: 6,
                actual: 5,
                ..
            })
        ),
        "{:?}",
        results[1]
    );
    for r in [0, 2] {
        assert!(
            matches!(results[r], Err(CommError::RankMismatch { rank: 1, .. })),
            "rank {r}: {:?}",
            results[r]
        );
    }
    let results = LocalComm::run(2, Duration::from_secs(60), |comm| {
        comm.broadcast_f32(&mut [0.0], 2)
    });
    for r in results {
        assert!(matches!(
            r.unwrap(),
            Err(CommError::BadRank { rank: 2, .. })
        ));
    }
}

#[test]
fn a_panicking_rank_fails_the_others_at_once() {
    let start = Instant::now();
    let results = LocalComm::run(4, Duration::from_secs(600), |comm| {
        comm.barrier().unwrap();
        if comm.rank() == 2 {
            panic!("rank 2 dies");
        }
        let mut buf = vec![1.0f32; 100];
        comm.allreduce_f32(&mut buf, ReduceOp::Sum)
    });
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "took {:?}",
        start.elapsed()
    );
    for (rank, result) in results.into_iter().enumerate() {
        if rank == 2 {
            assert!(result.is_err(), "rank 2 panicked");
        } else {
            let result = result.expect("the survivors return");
            let err = result.expect_err("a survivor cannot complete the allreduce");
            assert!(
                matches!(&err, CommError::PeerFailed { rank: 2, reason } if reason == "panicked"),
                "rank {rank}: {err}"
            );
        }
    }
}

#[test]
fn an_erroring_rank_reports_its_reason_to_the_others() {
    let results = LocalComm::run(3, Duration::from_secs(600), |comm| {
        if comm.rank() == 0 {
            comm.abort("data file corrupt at line 7");
            return Err(CommError::PeerFailed {
                rank: 0,
                reason: "self".into(),
            });
        }
        comm.barrier()
    });
    for result in results.into_iter().skip(1) {
        let err = result.unwrap().unwrap_err();
        assert_eq!(
            err.to_string(),
            "rank 0 failed: data file corrupt at line 7"
        );
    }
}

#[test]
fn a_rank_that_never_arrives_is_reported_after_the_timeout() {
    let start = Instant::now();
    let results = LocalComm::run(2, Duration::from_millis(300), |comm| {
        if comm.rank() == 1 {
            // Stuck in computation: alive, holding its communicator.
            std::thread::sleep(Duration::from_secs(2));
            return comm.barrier();
        }
        comm.barrier()
    });
    let results: Vec<_> = results.into_iter().map(Result::unwrap).collect();
    assert!(
        matches!(&results[0], Err(CommError::Timeout { op: "barrier", missing, .. }) if missing == &[1]),
        "{:?}",
        results[0]
    );
    let message = results[0].as_ref().unwrap_err().to_string();
    assert!(
        message.contains("rank 1 did not arrive within 300ms"),
        "{message}"
    );
    // The late rank learns that rank 0 gave up instead of waiting forever.
    assert!(
        matches!(results[1], Err(CommError::PeerFailed { rank: 0, .. })),
        "{:?}",
        results[1]
    );
    assert!(start.elapsed() < Duration::from_secs(5));
}
