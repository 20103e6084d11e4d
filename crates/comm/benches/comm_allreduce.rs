//! Compressed against uncompressed allreduce: wall time and bytes per rank,
//! for 2^20, 2^24 and 110M elements (BERT-base), on the ranks of an
//! `mpirun` job (`cargo xtask bench comm` starts 4).
//!
//! Baselines measured in the same run: the fp32 `MPI_Allreduce` (through the
//! same communicator and meter) and a memcpy of the buffer. The worker's
//! compression is also timed alone on the same buffer: the part of the
//! compressed allreduce no network can hide. Times are the slowest rank's,
//! best of the repetitions, with the input copy subtracted. Writes
//! `results/bench/comm.json` (`comm-quick.json` with `--quick`).

use std::time::Instant;

use terse_comm::{Communicator, CompressedAllreduce, MpiComm, ReduceOp, Traffic};
use terse_compress::onebit::{self, Scale};
use terse_rng::SplitMix64;

struct Row {
    elements: usize,
    memcpy_ms: f64,
    fp32_ms: f64,
    fp32_bytes: u64,
    compressed_ms: f64,
    compress_only_ms: f64,
    compressed_bytes: u64,
}

impl Row {
    fn bytes_ratio(&self) -> f64 {
        self.fp32_bytes as f64 / self.compressed_bytes as f64
    }

    fn time_ratio(&self) -> f64 {
        self.fp32_ms / self.compressed_ms
    }
}

/// The slowest rank's value, in ms.
fn slowest(comm: &dyn Communicator, seconds: f64) -> f64 {
    let mut all = vec![0.0f32; comm.world_size()];
    comm.all_gather_f32(&[seconds as f32], &mut all).unwrap();
    all.iter().cloned().fold(0.0f32, f32::max) as f64 * 1e3
}

fn best_of(comm: &dyn Communicator, repeats: usize, mut f: impl FnMut()) -> f64 {
    (0..repeats)
        .map(|_| {
            comm.barrier().unwrap();
            let start = Instant::now();
            f();
            slowest(comm, start.elapsed().as_secs_f64())
        })
        .fold(f64::INFINITY, f64::min)
}

/// Bytes this rank sent while running `f`.
fn sent(comm: &dyn Communicator, f: impl FnOnce()) -> u64 {
    let before: Traffic = comm.traffic();
    f();
    (comm.traffic() - before).sent()
}

/// The benchmark's arguments, after `--` under cargo.
#[derive(clap::Parser)]
#[command(
    name = "comm_allreduce",
    bin_name = "comm_allreduce",
    about = "Times the compressed allreduce against MPI's fp32 allreduce and a memcpy, with \
             the bytes each rank sends, on the ranks of an mpirun job; `cargo xtask bench comm` \
             starts it"
)]
struct Args {
    /// A smoke run: 2^20 and 2^22 elements (2^20, 2^24 and 110M otherwise)
    #[arg(long)]
    quick: bool,
    /// Passed by `cargo bench`; ignored
    #[arg(long, hide = true)]
    bench: bool,
}

fn main() {
    let Args { quick, .. } = clap::Parser::parse();
    let comm = MpiComm::init().expect("MPI starts (run under mpirun)");
    let n = comm.world_size();
    let sizes: &[usize] = if quick {
        &[1 << 20, 1 << 22]
    } else {
        &[1 << 20, 1 << 24, 110_000_000]
    };
    let mut rows = Vec::new();
    for &d in sizes {
        let repeats = if d >= 100_000_000 { 2 } else { 3 };
        let mut rng = SplitMix64::new(17 + comm.rank() as u64);
        let input: Vec<f32> = (0..d).map(|_| rng.normal()).collect();
        let mut buf = input.clone();

        let memcpy_ms = best_of(&comm, repeats, || buf.copy_from_slice(&input));
        let fp32_ms = best_of(&comm, repeats, || {
            buf.copy_from_slice(&input);
            comm.allreduce_f32(&mut buf, ReduceOp::Mean).unwrap();
        }) - memcpy_ms;
        let fp32_bytes = sent(&comm, || {
            comm.allreduce_f32(&mut buf, ReduceOp::Mean).unwrap();
        });

        let mut state = CompressedAllreduce::new(d, &comm, Default::default()).unwrap();
        let (mut worker_error, mut server_error) = state.zeroed_errors();
        let compressed_ms = best_of(&comm, repeats, || {
            buf.copy_from_slice(&input);
            state
                .allreduce_mean(&comm, &mut buf, &mut worker_error, &mut server_error)
                .unwrap();
        }) - memcpy_ms;
        let compressed_bytes = sent(&comm, || {
            state
                .allreduce_mean(&comm, &mut buf, &mut worker_error, &mut server_error)
                .unwrap();
        });
        let mut error = vec![0.0f32; d];
        let mut bits = vec![0u32; onebit::words_for(d)];
        let chunk = d.div_ceil(n);
        let mut scales = vec![0.0f32; onebit::blocks_for(d, chunk)];
        let compress_only_ms = best_of(&comm, repeats, || {
            onebit::compress(&input, &mut error, chunk, Scale::L1, &mut bits, &mut scales);
        });
        rows.push(Row {
            elements: d,
            memcpy_ms,
            fp32_ms,
            fp32_bytes,
            compressed_ms,
            compress_only_ms,
            compressed_bytes,
        });
    }
    if comm.rank() == 0 {
        report(n, quick, &rows);
    }
}

fn report(n: usize, quick: bool, rows: &[Row]) {
    println!("{n} MPI ranks; times: slowest rank, best of repetitions; bytes: sent per rank");
    println!(
        "{:>11} {:>9} {:>9} {:>12} {:>9} {:>9} {:>11} {:>8} {:>7}",
        "elements",
        "memcpy",
        "fp32",
        "fp32 bytes",
        "1-bit",
        "compress",
        "1-bit bytes",
        "bytes÷",
        "time÷"
    );
    for r in rows {
        println!(
            "{:>11} {:>7.1}ms {:>7.1}ms {:>12} {:>7.1}ms {:>7.1}ms {:>11} {:>7.1}x {:>6.2}x",
            r.elements,
            r.memcpy_ms,
            r.fp32_ms,
            r.fp32_bytes,
            r.compressed_ms,
            r.compress_only_ms,
            r.compressed_bytes,
            r.bytes_ratio(),
            r.time_ratio()
        );
    }
    let entries: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "    {{\"elements\": {}, \"memcpy_ms\": {:.3}, \"fp32_allreduce_ms\": {:.3}, \
                 \"fp32_bytes_sent\": {}, \"compressed_allreduce_ms\": {:.3}, \
                 \"compress_only_ms\": {:.3}, \"compressed_bytes_sent\": {}, \
                 \"bytes_ratio\": {:.2}, \"time_ratio\": {:.3}}}",
                r.elements,
                r.memcpy_ms,
                r.fp32_ms,
                r.fp32_bytes,
                r.compressed_ms,
                r.compress_only_ms,
                r.compressed_bytes,
                r.bytes_ratio(),
                r.time_ratio()
            )
        })
        .collect();
    let json = format!(
        "{{\n  \"ranks\": {n},\n  \"backend\": \"mpi\",\n  \"cpus\": {},\n  \"rows\": [\n{}\n  ]\n}}\n",
        std::thread::available_parallelism().map_or(0, |p| p.get()),
        entries.join(",\n")
    );
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../results/bench");
    std::fs::create_dir_all(&out).unwrap();
    let file = out.join(if quick {
        "comm-quick.json"
    } else {
        "comm.json"
    });
    std::fs::write(&file, json).unwrap();
    println!("wrote {}", file.display());
}
