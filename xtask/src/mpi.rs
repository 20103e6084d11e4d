//! Launching N ranks through OpenMPI's `mpirun`.
//!
//! `--oversubscribe` lets more ranks than cores run (a laptop simulating a
//! cluster); `--allow-run-as-root` only when this is root (containers, CI).
//! Each rank gets `RAYON_NUM_THREADS = cores / ranks` so ranks do not fight
//! over cores with their worker threads.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

/// Fails with the install line when `mpirun` is missing.
pub fn require_mpirun() -> Result<()> {
    match Command::new("mpirun").arg("--version").output() {
        Ok(output) if output.status.success() => Ok(()),
        _ => bail!(
            "`mpirun` not found: install OpenMPI with\n    \
             sudo apt-get install -y openmpi-bin libopenmpi-dev"
        ),
    }
}

/// Worker threads per rank when `ranks` ranks share this machine's cores.
pub fn threads_per_rank(ranks: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / ranks.max(1)).max(1)
}

/// The `mpirun` command that runs `executable args…` on `ranks` MPI ranks of
/// this machine.
pub fn command(ranks: usize, executable: &Path, args: &[String]) -> Command {
    let threads = threads_per_rank(ranks).to_string();
    let mut command = Command::new("mpirun");
    if crate::system_packages::is_root() {
        command.arg("--allow-run-as-root");
    }
    command
        .args([
            "--oversubscribe",
            "--bind-to",
            "none",
            "-np",
            &ranks.to_string(),
        ])
        .args(["-x", "RAYON_NUM_THREADS"])
        .env("RAYON_NUM_THREADS", &threads)
        .arg(executable)
        .args(args);
    command
}

/// Runs `executable args…` on `ranks` MPI ranks of this machine.
pub fn launch(ranks: usize, executable: &Path, args: &[String]) -> Result<()> {
    let status = command(ranks, executable, args)
        .status()
        .with_context(|| format!("cannot start mpirun for {}", executable.display()))?;
    if !status.success() {
        bail!(
            "{} on {ranks} ranks failed ({status})",
            executable.display()
        );
    }
    Ok(())
}
