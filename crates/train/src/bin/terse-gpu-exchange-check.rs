//! `terse-gpu-exchange-check`: on one GPU, the exchanges a device training
//! step hands NCCL by CUDA address (the gradient's fp32 mean, the 1-bit
//! stages' compressed allreduce of packed signs and scales), run on cubecl
//! buffers through NCCL in a world of one, each against the same step's
//! code with `local`, bit for bit (terse-optim's `gpu_exchange_check`).
//! Training on one GPU never reaches these paths (one rank averages and
//! compresses nothing); `terse-comm-check --nccl` checks NCCL's collectives
//! on buffers of its own. In the GPU bundle: `run.sh --nccl-check`.

use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use terse_comm::{Communicator, LocalComm, NcclComm};
use terse_optim::gpu_exchange_check::check_gpu_exchanges;
use terse_train::DeviceChoice;

/// Check the GPU exchanges of a training step on one GPU, bit for bit
/// against the host path.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// The device: `cuda` or `cuda:N` (the GPU, offset by the node-local
    /// rank as in training), or `wgpu`/`lavapipe` (no CUDA memory: every
    /// case compares two host paths; for checking this program).
    #[arg(long, default_value = "cuda")]
    device: DeviceChoice,
    /// The communicator under check: `nccl` (a world of this process
    /// alone, bootstrapped without MPI), or `local` (for checking this program: two host paths).
    #[arg(long, value_enum, default_value_t = Under::Nccl)]
    comm: Under,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Under {
    Nccl,
    Local,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.device.is_cpu() {
        return fail("--device cpu has no GPU buffers: use cuda (or wgpu/lavapipe)");
    }
    // The exchanges move f32 buffers; no model is computed.
    let device = match args.device.open(terse_train::Precision::Fp32) {
        Ok(device) => device,
        Err(e) => return fail(&e.to_string()),
    };
    let outcome = match args.comm {
        Under::Local => {
            let reports = LocalComm::run(1, std::time::Duration::from_secs(3600), |local| {
                report(local, &device, false)
            });
            reports
                .into_iter()
                .next()
                .expect("one rank")
                .unwrap_or(false)
        }
        Under::Nccl => {
            let gpu = terse_comm::gpu_of_process(match args.device {
                DeviceChoice::Cuda(index) => index,
                _ => 0,
            });
            // A machine without the driver or NCCL is told in one line,
            // before NCCL opens the GPU.
            match NcclComm::start(gpu) {
                Ok(nccl) if nccl.world_size() != 1 => {
                    return fail("runs in a world of one: start it without mpirun, or -np 1");
                }
                Ok(nccl) => report(&nccl, &device, matches!(args.device, DeviceChoice::Cuda(_))),
                Err(e) => return fail(&e.to_string()),
            }
        }
    };
    if outcome {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Runs the cases with `comm`, one line each; whether all passed (and,
/// with `need_gpu`, each took the GPU path).
fn report(comm: &dyn Communicator, device: &burn::tensor::Device, need_gpu: bool) -> bool {
    let mut passed = true;
    for case in check_gpu_exchanges(comm, device) {
        let path = if case.on_gpu {
            "by device address"
        } else {
            "through the host"
        };
        match (&case.outcome, case.on_gpu || !need_gpu) {
            (Ok(()), true) => println!("ok    {} ({path}): the local path's bits", case.case),
            (Ok(()), false) => {
                passed = false;
                println!(
                    "FAIL  {}: went {path}, not by device address (the buffers are not CUDA \
                     memory, or the communicator moves no GPU memory)",
                    case.case
                );
            }
            (Err(why), _) => {
                passed = false;
                println!("FAIL  {} ({path}): {why}", case.case);
            }
        }
    }
    passed
}

fn fail(message: &str) -> ExitCode {
    eprintln!("terse-gpu-exchange-check: {message}");
    ExitCode::FAILURE
}
