//! The distributed optimizer step on the ranks of an `mpirun` job: step
//! time, its communication time and the bytes each rank sends, step by step
//! through the warmup and the compressed stage. Started by `cargo xtask
//! reproduce comm-volume | bandwidth | step-profile | zero-one-adam`, one rank per netlab
//! host, so the network is a shaped link rather than shared memory.
//!
//! Each rank steps a BERT-like flat buffer of `--elements` parameters with
//! its own fixed random gradient (the values do not change the bytes a
//! compressed step sends, only its compression error). Per step: the step's
//! time, its communication time as the optimizer reports it (compression
//! included), the time spent inside the collectives alone, each the slowest
//! rank's; the bytes rank 0's traffic meter counted, the most any rank's
//! counted, and, inside netlab, the bytes rank 0's `lab0` interface actually
//! transmitted (headers included) over the step and the payload bytes TCP
//! retransmitted in them (a retransmitted segment crosses the link twice;
//! on 2 cores with 4 busy ranks a step sometimes resends a few per cent).
//!
//! ```text
//! optim_network --elements N --optimizer adam|onebit_adam|onebit_lamb|slamb|zero_one_adam
//!               --warmup W [--settle S] --steps K --out FILE [--label TEXT]
//!               [--after-warmup PROGRAM ARG…]
//! ```
//! runs W warmup steps (the 1-bit optimizers freeze after them), S settling
//! steps and K measured steps, and appends one JSON line per step to FILE
//! (rank 0). `--after-warmup` takes every argument after it as one command
//! (program and arguments, run without a shell, so no path or value is ever
//! parsed as shell syntax); rank 0 runs it after the warmup and settling
//! steps, while every rank waits (`bandwidth` reshapes the links there, so
//! the fp32 warmup and the first compressed step, which touches the error
//! buffers for the first time, cross fast links and only the measured steps
//! the slow ones).

#[path = "common/bert_layout.rs"]
mod bert_layout;

use std::io::Write;
use std::time::Instant;
use terse_optim::WithCompression;

use terse_comm::{Communicator, MpiComm};
use terse_optim::{
    AdamConfig, LrSchedule, OneBitAdamConfig, OneBitLambConfig, Optimizer, OptimizerConfig,
    SlambConfig, ZeroOneAdamConfig,
};
use terse_rng::SplitMix64;

/// The benchmark's arguments (`--after-warmup` and what follows it are
/// split off first: its command is not ours to parse).
#[derive(clap::Parser)]
#[command(
    name = "optim_network",
    bin_name = "optim_network",
    about = "Steps an optimizer on the ranks of an mpirun job and appends one JSON line per \
             step (times, bytes sent, bytes on the wire) to --out; `cargo xtask reproduce \
             comm-volume | bandwidth | step-profile | zero-one-adam` start it on netlab's hosts",
    after_help = "--after-warmup PROGRAM ARG…  (last) rank 0 runs this command, without a \
                  shell, after the warmup and settling steps while every rank waits"
)]
struct Options {
    /// Parameters in the BERT-like flat buffer
    #[arg(long, default_value_t = 110_000_000)]
    elements: usize,
    /// The optimizer stepped
    #[arg(long, default_value = "adam", value_parser = ["adam", "onebit_adam", "onebit_lamb", "slamb", "zero_one_adam"])]
    optimizer: String,
    /// Warmup steps (the 1-bit optimizers freeze after them)
    #[arg(long, default_value_t = 2)]
    warmup: u64,
    /// Untimed steps after the warmup
    #[arg(long, default_value_t = 0)]
    settle: u64,
    /// Measured steps
    #[arg(long, default_value_t = 3)]
    steps: u64,
    /// Where rank 0 appends its JSON lines
    #[arg(long, value_name = "FILE")]
    out: std::path::PathBuf,
    /// Copied into every line
    #[arg(long, default_value = "")]
    label: String,
    #[arg(skip)]
    after_warmup: Option<Vec<String>>,
    /// Passed by `cargo bench`; ignored
    #[arg(long, hide = true)]
    bench: bool,
}

fn options() -> Options {
    let mut args: Vec<String> = std::env::args().collect();
    // Everything after `--after-warmup` is its command, not our options.
    let after_warmup = args
        .iter()
        .position(|a| a == "--after-warmup")
        .map(|at| args.split_off(at)[1..].to_vec());
    if after_warmup
        .as_ref()
        .is_some_and(|command| command.is_empty())
    {
        eprintln!("error: --after-warmup needs a program (and its arguments) after it");
        std::process::exit(2);
    }
    Options {
        after_warmup,
        ..clap::Parser::parse_from(args)
    }
}

/// The optimizer under test; the 1-bit ones freeze after `warmup` steps
/// (0/1 Adam: its variance stage; SLAMB has no warmup: it is sparse from
/// the first step).
fn config(name: &str, warmup: u64) -> OptimizerConfig {
    match name {
        "adam" => OptimizerConfig::Adam(AdamConfig::default()),
        "onebit_adam" => {
            OptimizerConfig::OnebitAdam(OneBitAdamConfig::default().with_freeze_step(warmup))
        }
        "onebit_lamb" => {
            OptimizerConfig::OnebitLamb(OneBitLambConfig::default().with_freeze_step(warmup))
        }
        "slamb" => OptimizerConfig::Slamb(SlambConfig::default()),
        // Every variance step exact (its interval never doubles), then
        // local steps that synchronise every second step once the first
        // (a synchronisation) is past: each kind of step in a few.
        "zero_one_adam" => OptimizerConfig::ZeroOneAdam(ZeroOneAdamConfig {
            var_freeze_step: warmup,
            var_update_scaler: 1_000_000,
            local_step_scaler: 1,
            local_step_clipper: 2,
            ..ZeroOneAdamConfig::default()
        }),
        other => {
            panic!("--optimizer {other:?}: adam, onebit_adam, onebit_lamb, slamb or zero_one_adam")
        }
    }
}

/// The largest of every rank's `value`.
fn slowest(comm: &dyn Communicator, value: f64) -> f64 {
    let mut all = vec![0.0f32; comm.world_size()];
    comm.all_gather_f32(&[value as f32], &mut all).unwrap();
    all.iter().copied().fold(0.0f32, f32::max) as f64
}

/// The largest of every rank's byte count, exactly (as two u32 halves).
fn most_bytes(comm: &dyn Communicator, bytes: u64) -> u64 {
    let mut all = vec![0u32; 2 * comm.world_size()];
    comm.all_gather_u32(&[bytes as u32, (bytes >> 32) as u32], &mut all)
        .unwrap();
    all.chunks(2)
        .map(|w| u64::from(w[0]) | (u64::from(w[1]) << 32))
        .max()
        .unwrap_or(0)
}

/// Bytes this rank's netlab interface has transmitted, `None` outside
/// netlab. `ip netns exec` mounts the namespace's own /sys, so this is the
/// lab link of the namespace the rank runs in.
fn wire_bytes() -> Option<u64> {
    std::fs::read_to_string("/sys/class/net/lab0/statistics/tx_bytes")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Payload bytes TCP has retransmitted on the sockets of this rank's
/// network namespace so far: the sum of `ss`'s `bytes_retrans` (the
/// kernel's `tcpi_bytes_retrans`, shown only where non-zero). `None`
/// where `ss` (iproute2, which netlab needs) fails.
fn retransmitted_bytes() -> Option<u64> {
    let out = std::process::Command::new("ss")
        .arg("-tinH")
        .output()
        .ok()
        .filter(|out| out.status.success())?;
    Some(
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter_map(|word| word.strip_prefix("bytes_retrans:"))
            .filter_map(|n| n.parse::<u64>().ok())
            .sum(),
    )
}

/// `after - before` as a JSON number, `null` where either is unknown.
fn json_delta(before: Option<u64>, after: Option<u64>) -> String {
    match (before, after) {
        // A socket closed within the step takes its count with it.
        (Some(before), Some(after)) => after.saturating_sub(before).to_string(),
        _ => "null".into(),
    }
}

fn main() {
    let o = options();
    let comm = MpiComm::init().expect("MPI starts (run under mpirun)");
    let layout = bert_layout::layout(o.elements);
    let d = layout.len();
    let mut optimizer = Optimizer::new(
        config(&o.optimizer, o.warmup),
        LrSchedule::Constant { lr: 1e-4 },
        layout,
        &comm,
    )
    .expect("a valid optimizer");
    let mut rng = SplitMix64::new(1 + comm.rank() as u64);
    let gradient: Vec<f32> = (0..d).map(|_| 1e-3 * rng.normal()).collect();
    let mut g = gradient.clone();
    let mut x = vec![0.01f32; d];
    let mut lines = String::new();
    // Only rank 0's lines are written, and only netlab's namespaces hold
    // just this job's sockets: elsewhere no rank starts `ss`.
    let count_resends = comm.rank() == 0 && wire_bytes().is_some();
    let resent = || count_resends.then(retransmitted_bytes).flatten();
    for t in 0..o.warmup + o.settle + o.steps {
        if t == o.warmup + o.settle
            && let Some(command) = &o.after_warmup
        {
            if comm.rank() == 0 {
                let status = std::process::Command::new(&command[0])
                    .args(&command[1..])
                    .status()
                    .unwrap_or_else(|e| panic!("--after-warmup {command:?}: {e}"));
                assert!(
                    status.success(),
                    "--after-warmup {command:?} failed ({status})"
                );
            }
            comm.barrier().unwrap();
        }
        g.copy_from_slice(&gradient);
        // Read outside the timed step: it starts a process.
        let retransmitted_before = resent();
        comm.barrier().unwrap();
        let start = Instant::now();
        let wire_before = wire_bytes();
        let report = optimizer.step_flat(&mut x, &mut g, &comm).unwrap();
        let step_s = start.elapsed().as_secs_f64();
        // A rank leaves the collective once it has what it needs, which can
        // be before its own last message has left its socket's send buffer
        // (a ring allreduce's last chunk, ~1/ranks of the buffer): counted
        // then, the link would miss it. Once every rank has left the step,
        // every byte this rank sent has arrived, so it has crossed the link.
        comm.barrier().unwrap();
        let wire = json_delta(wire_before, wire_bytes());
        let retransmitted = json_delta(retransmitted_before, resent());
        let step_ms = 1e3 * slowest(&comm, step_s);
        let comm_ms = 1e3 * slowest(&comm, report.comm_time.as_secs_f64());
        let collective_ms = 1e3 * slowest(&comm, report.traffic.time().as_secs_f64());
        let sent = report.traffic.sent();
        let sent_max = most_bytes(&comm, sent);
        lines.push_str(&format!(
            "{{\"label\":\"{}\",\"optimizer\":\"{}\",\"elements\":{d},\"ranks\":{},\"step\":{},\
             \"stage\":\"{}\",\"step_ms\":{step_ms:.3},\"comm_ms\":{comm_ms:.3},\
             \"collective_ms\":{collective_ms:.3},\"bytes_sent\":{sent},\
             \"bytes_sent_max\":{sent_max},\"wire_bytes_sent\":{wire},\
             \"wire_bytes_retransmitted\":{retransmitted}}}\n",
            o.label,
            o.optimizer,
            comm.world_size(),
            report.t,
            report.stage,
        ));
    }
    if comm.rank() == 0 {
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&o.out)
            .unwrap_or_else(|e| panic!("cannot open {}: {e}", o.out.display()));
        file.write_all(lines.as_bytes()).unwrap();
        print!("{lines}");
    }
}
