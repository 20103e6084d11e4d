//! `cargo xtask bench`: benchmark one layer of the stack.
//!
//! The papers' speed-ups come from three places: cheap compression kernels, an
//! optimizer step that adds little over Adam, and collectives that move fewer
//! bytes. Each suite times one of them and prints ratios against a baseline
//! measured in the same run (STYLE.md). `optim` (`crates/optim/benches/
//! optim_step.rs`) and `comm` (`crates/comm/benches/comm_allreduce.rs`,
//! started under `mpirun -np 4`) run today, built in the workspace's one
//! profile; `kernels` fails with [`NotImplemented`] until its issue lands.

use anyhow::{Context, Result, bail};
use clap::ValueEnum;

use crate::mpi;
use crate::not_implemented::{NotImplemented, Tracking, cli_name};
use crate::terse_binary;

/// Arguments of `cargo xtask bench`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct Args {
    /// The suite to run
    #[arg(value_enum)]
    pub name: Suite,

    /// Fewer sizes and repetitions: a smoke run for CI, not numbers to quote
    #[arg(long)]
    pub quick: bool,

    /// Where `bench kernels` times the cubecl kernels: lavapipe (Vulkan on
    /// the CPU, always available), wgpu (the machine's default GPU adapter),
    /// or cuda (needs a build with burn's `cuda` feature, which these
    /// machines cannot make)
    #[arg(long, value_enum, default_value = "lavapipe")]
    pub device: KernelDevice,
}

/// The device `bench kernels` launches the cubecl kernels on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KernelDevice {
    /// Mesa's software Vulkan device
    Lavapipe,
    /// The default wgpu adapter (a GPU where there is one)
    Wgpu,
    /// CUDA through cubecl-cuda
    Cuda,
}

/// A benchmark suite.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Suite {
    /// Compression kernels (1-bit pack/unpack, error feedback, masking), CPU and GPU
    Kernels,
    /// One step of each optimizer on a BERT-sized flat parameter vector, against Adam
    Optim,
    /// Compressed vs fp32 allreduce (time, bytes) on 4 MPI ranks; results/bench/comm.json
    Comm,
}

impl Suite {
    /// The issue that will implement this suite, if it is not implemented yet.
    pub fn tracking(self) -> Option<Tracking> {
        match self {
            Suite::Kernels => None,
            Suite::Optim => None,
            Suite::Comm => None,
        }
    }
}

/// Runs `bench`.
pub fn run(args: &Args) -> Result<()> {
    if let Some(tracking) = args.name.tracking() {
        let command = format!("bench {}", cli_name(&args.name));
        return Err(NotImplemented::new(command, tracking).into());
    }
    if args.name == Suite::Comm {
        return run_comm(args.quick);
    }
    if args.name == Suite::Kernels {
        return run_kernels(args.quick, args.device);
    }
    run_cargo_bench("optim_step", quick_flag(args.quick))
}

fn quick_flag(quick: bool) -> &'static [&'static str] {
    if quick { &["--quick"] } else { &[] }
}

/// Runs bench target `bench` through `cargo test` with `args` after `--`.
/// `--workspace` resolves features as the tests do, so nothing is rebuilt.
fn run_cargo_bench(bench: &str, args: &[&str]) -> Result<()> {
    let status = terse_binary::cargo()
        .args(["test", "--quiet", "--workspace", "--bench", bench, "--"])
        .args(args)
        .status()
        .with_context(|| format!("cannot start cargo for the `{bench}` benchmark"))?;
    if !status.success() {
        bail!("the `{bench}` benchmark failed ({status})");
    }
    Ok(())
}

/// Builds and runs the kernels benchmark (CPU against memcpy, cubecl on
/// `device` for information).
fn run_kernels(quick: bool, device: KernelDevice) -> Result<()> {
    if device == KernelDevice::Cuda {
        bail!(
            "bench kernels --device cuda needs cubecl's cuda runtime, which burn's `cuda` \
             feature builds by downloading LLVM; terse does not build it by default. On a \
             machine with an NVIDIA GPU, `--device wgpu` times the same kernels through Vulkan"
        );
    }
    let mut args = quick_flag(quick).to_vec();
    if device == KernelDevice::Wgpu {
        args.extend(["--device", "wgpu"]);
    }
    run_cargo_bench("kernels", &args)
}

/// Ranks of the comm benchmark (the issue's setting).
const COMM_RANKS: usize = 4;

/// Builds the comm benchmark and starts it under `mpirun`.
fn run_comm(quick: bool) -> Result<()> {
    mpi::require_mpirun()?;
    let executable = terse_binary::build_bench("comm_allreduce")?;
    let mut args = Vec::new();
    if quick {
        args.push("--quick".to_string());
    }
    mpi::launch(COMM_RANKS, &executable, &args)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Command;
    use crate::testing;

    #[test]
    fn quick_is_off_unless_given() {
        for (argv, quick) in [
            (&["bench", "kernels"][..], false),
            (&["bench", "comm", "--quick"][..], true),
        ] {
            match testing::command(argv) {
                Command::Bench(args) => assert_eq!(args.quick, quick, "{argv:?}"),
                other => panic!("parsed as {other:?}"),
            }
        }
    }

    #[test]
    fn each_suite_names_its_issue() {
        assert_eq!(Suite::Kernels.tracking(), None, "bench kernels runs");
        assert_eq!(Suite::Optim.tracking(), None, "bench optim runs");
        assert_eq!(Suite::Comm.tracking(), None, "bench comm runs");
    }

    #[test]
    fn rejects_unknown_suite() {
        let message = testing::rejection(&["bench", "models"]);
        for valid in ["kernels", "optim", "comm"] {
            assert!(message.contains(valid), "{valid} not listed:\n{message}");
        }
    }
}
