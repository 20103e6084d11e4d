//! `terse-comm-check`: checks a communicator end to end, like `nccl-tests`.
//!
//! Under `mpirun` it checks the MPI backend across the job's processes;
//! started alone it checks the `local` backend with `--local-ranks` threads.
//! With `--nccl` it checks NCCL (each process on the GPU of its node-local
//! rank; alone, a world of one): the compressed and sparse allreduce
//! through NCCL against the in-process `local` world, bit for bit. It is
//! also how the failure tests make a rank die (`--kill-rank`) or fail
//! (`--fail-rank`) in the middle of a job.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use terse_comm::launch::{Backend, Launch};
use terse_comm::{Communicator, LocalComm, selfcheck};

/// Check every collective, the traffic meter, mismatch detection and the
/// compressed and sparse allreduce on a real communicator.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    #[command(flatten)]
    launch: Launch<4>,
    /// After the checks, this rank kills itself with SIGKILL while the others
    /// wait for it in collectives (the others must exit non-zero).
    #[arg(long)]
    kill_rank: Option<usize>,
    /// After the checks, this rank fails with an error (the others must exit
    /// non-zero).
    #[arg(long)]
    fail_rank: Option<usize>,
    /// Check the NCCL backend instead (one GPU per process: the one of its
    /// node-local rank; needs libcuda and NCCL as libnccl.so). Started without
    /// mpirun, a world of one that needs no MPI
    #[arg(long)]
    nccl: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.nccl {
        return run_nccl(&args);
    }
    match args.launch.backend() {
        Backend::Mpi => run_mpi(&args),
        Backend::Local => {
            let outcomes =
                LocalComm::run(args.launch.local_ranks, Duration::from_secs(60), |comm| {
                    check(comm, &args)
                });
            let mut code = ExitCode::SUCCESS;
            for (rank, outcome) in outcomes.into_iter().enumerate() {
                match outcome {
                    Ok(Ok(())) => {}
                    Ok(Err(message)) => {
                        eprintln!("terse-comm-check: rank {rank}: {message}");
                        code = ExitCode::FAILURE;
                    }
                    Err(_) => {
                        eprintln!("terse-comm-check: rank {rank} panicked");
                        code = ExitCode::FAILURE;
                    }
                }
            }
            code
        }
    }
}

#[cfg(feature = "mpi")]
fn run_mpi(args: &Args) -> ExitCode {
    let comm = match terse_comm::MpiComm::init() {
        Ok(comm) => comm,
        Err(e) => {
            eprintln!("terse-comm-check: {e}");
            return ExitCode::FAILURE;
        }
    };
    match check(&comm, args) {
        Ok(()) => ExitCode::SUCCESS,
        // `check` has already aborted the job (MPI_Abort does not return).
        Err(_) => ExitCode::FAILURE,
    }
}

#[cfg(feature = "nccl")]
fn run_nccl(args: &Args) -> ExitCode {
    // Under mpirun, bootstrapped over MPI; started alone, a world of one
    // with no MPI (a bundle's machine lacks OpenMPI's plugins).
    let comm = terse_comm::NcclComm::start(terse_comm::gpu_of_process(0));
    match comm {
        Ok(comm) => {
            if check(&comm, args).is_err() {
                return ExitCode::FAILURE;
            }
            match comm.check_gpu_buffers() {
                Ok(()) if comm.rank() == 0 => {
                    println!(
                        "terse-comm-check: allreduce, all-gather and all-to-all from GPU \
                         buffers (no host copy) give the host path's bits"
                    );
                    ExitCode::SUCCESS
                }
                Ok(()) => ExitCode::SUCCESS,
                Err(message) => {
                    comm.abort(&message);
                    eprintln!("terse-comm-check: {message}");
                    ExitCode::FAILURE
                }
            }
        }
        Err(e) => {
            eprintln!("terse-comm-check: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(not(feature = "nccl"))]
fn run_nccl(_args: &Args) -> ExitCode {
    eprintln!("terse-comm-check: built without the `nccl` feature");
    ExitCode::FAILURE
}

#[cfg(not(feature = "mpi"))]
fn run_mpi(_args: &Args) -> ExitCode {
    eprintln!("terse-comm-check: built without the `mpi` feature");
    ExitCode::FAILURE
}

/// Runs the checks; a failing rank tells the others before it returns.
fn check(comm: &dyn Communicator, args: &Args) -> Result<(), String> {
    let result = run_checks(comm, args);
    if let Err(message) = &result {
        comm.abort(message);
    }
    result
}

fn run_checks(comm: &dyn Communicator, args: &Args) -> Result<(), String> {
    let (rank, n) = (comm.rank(), comm.world_size());
    selfcheck::run(comm).map_err(|e| format!("check failed: {e}"))?;
    if rank == 0 {
        println!(
            "terse-comm-check: {n} ranks on {}: every collective, the traffic meter, \
             mismatch detection, compressed and sparse allreduce passed",
            comm.backend()
        );
    }
    if args.kill_rank == Some(rank) {
        eprintln!("terse-comm-check: rank {rank} kills itself (SIGKILL)");
        let pid = std::process::id().to_string();
        let _ = std::process::Command::new("kill")
            .args(["-9", &pid])
            .status();
    }
    if args.fail_rank == Some(rank) {
        return Err(format!("rank {rank} fails on purpose (--fail-rank)"));
    }
    if args.kill_rank.is_some() || args.fail_rank.is_some() {
        // The survivors keep communicating; they must not hang.
        loop {
            comm.barrier().map_err(|e| e.to_string())?;
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    Ok(())
}
