//! The `local` backend with real threads: every collective against values
//! worked out here, results bit-identical on every rank, and a length
//! mismatch reported on every rank instead of corrupting memory.

use terse_comm::{CommError, Communicator, LocalComm, ReduceOp};

/// Runs `body(comm)` on each rank of a world of `n` threads; results by rank.
fn on_world<R: Send>(n: usize, body: impl Fn(&LocalComm) -> R + Sync) -> Vec<R> {
    let world = LocalComm::world(n);
    std::thread::scope(|scope| {
        let handles: Vec<_> = world
            .iter()
            .map(|comm| scope.spawn(|| body(comm)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn allreduce_sums_in_rank_order_and_agrees_everywhere() {
    for n in [1, 2, 3, 4] {
        let results = on_world(n, |comm| {
            let r = comm.rank() as f32;
            // Rank r holds [r + 0.1, 10r, -r, 1/3 + r].
            let mut sum = vec![r + 0.1, 10.0 * r, -r, 1.0 / 3.0 + r];
            comm.allreduce_f32(&mut sum, ReduceOp::Sum).unwrap();
            let mut mean = vec![2.0 * r; 5];
            comm.allreduce_f32(&mut mean, ReduceOp::Mean).unwrap();
            (sum, mean)
        });
        // Σ_r r = n(n-1)/2; the reference adds in rank order like the backend.
        let total = (n * (n - 1) / 2) as f32;
        let mut expected_first = 0.0f32;
        let mut expected_last = 0.0f32;
        for r in 0..n {
            expected_first += r as f32 + 0.1;
            expected_last += 1.0 / 3.0 + r as f32;
        }
        for (sum, mean) in &results {
            assert_eq!(sum, &[expected_first, 10.0 * total, -total, expected_last]);
            let expected_mean = 2.0 * total * (1.0 / n as f32);
            assert!(
                mean.iter().all(|&m| m == expected_mean),
                "{mean:?} vs {expected_mean}"
            );
        }
        assert!(results.windows(2).all(|w| w[0] == w[1]), "ranks disagree");
    }
}

#[test]
fn broadcast_gather_and_all_to_all_move_the_right_chunks() {
    let n = 3;
    let results = on_world(n, |comm| {
        let r = comm.rank();
        let mut b = vec![r as f32; 4];
        comm.broadcast_f32(&mut b, 2).unwrap();

        let mut gathered = vec![0u32; 2 * n];
        comm.all_gather_u32(&[10 * r as u32, 10 * r as u32 + 1], &mut gathered)
            .unwrap();

        // Rank r sends chunk j = [100r + j, 100r + j + 50] to rank j.
        let send: Vec<u32> = (0..n)
            .flat_map(|j| [100 * r as u32 + j as u32, 100 * r as u32 + j as u32 + 50])
            .collect();
        let mut recv = vec![0u32; 2 * n];
        comm.all_to_all_u32(&send, &mut recv).unwrap();
        comm.barrier().unwrap();
        (b, gathered, recv)
    });
    for (r, (b, gathered, recv)) in results.iter().enumerate() {
        assert_eq!(b, &[2.0; 4]);
        assert_eq!(gathered, &[0, 1, 10, 11, 20, 21]);
        // From rank j, rank r receives j's chunk r.
        let expected: Vec<u32> = (0..n as u32)
            .flat_map(|j| [100 * j + r as u32, 100 * j + r as u32 + 50])
            .collect();
        assert_eq!(recv, &expected, "rank {r}");
    }
}

#[test]
fn mismatched_lengths_are_reported_on_every_rank() {
    let results = on_world(3, |comm| {
        let len = if comm.rank() == 1 { 5 } else { 4 };
        let mut buf = vec![1.0f32; len];
        comm.allreduce_f32(&mut buf, ReduceOp::Sum)
    });
    for result in results {
        assert!(
            matches!(
                result,
                Err(CommError::LengthMismatch {
                    op: "allreduce",
                    ..
                })
            ),
            "{result:?}"
        );
    }
    let results = on_world(2, |comm| comm.broadcast_f32(&mut [0.0], 2));
    assert!(
        results
            .iter()
            .all(|r| matches!(r, Err(CommError::BadRank { rank: 2, .. })))
    );
}
