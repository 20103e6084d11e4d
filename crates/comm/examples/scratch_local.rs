use std::time::{Duration, Instant};
use terse_comm::{Communicator, LocalComm, ReduceOp};
fn main() {
    let n: usize = 11_200_000;
    for ranks in [2usize, 4] {
        let times = LocalComm::run(ranks, Duration::from_secs(60), |comm| {
            let mut buf: Vec<f32> = (0..n)
                .map(|i| (i % 97) as f32 * 0.01 + comm.rank() as f32)
                .collect();
            let mut best = f64::MAX;
            for _ in 0..8 {
                comm.barrier().unwrap();
                let t = Instant::now();
                comm.allreduce_f32(&mut buf, ReduceOp::Mean).unwrap();
                best = best.min(t.elapsed().as_secs_f64() * 1e3);
            }
            best
        });
        let t: Vec<f64> = times.into_iter().map(|r| r.unwrap()).collect();
        println!(
            "{ranks} ranks allreduce {n} f32: best {:.1} ms (max over ranks)",
            t.iter().cloned().fold(0.0, f64::max)
        );
    }
}
