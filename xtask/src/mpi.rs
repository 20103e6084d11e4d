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
    command_on(ranks, None, executable, args)
}

/// The variables a job on other nodes gets from this shell: those of
/// `RAYON_NUM_THREADS`, `TERSE_CACHE` and `TERSE_LOG` that are `set`.
fn passed_on(set: impl Fn(&str) -> bool) -> Vec<&'static str> {
    ["RAYON_NUM_THREADS", "TERSE_CACHE", "TERSE_LOG"]
        .into_iter()
        .filter(|var| set(var))
        .collect()
}

/// [`command`] on the hosts of an OpenMPI `hostfile` (one line per node,
/// `node01 slots=8`), or on this machine without one. On this machine each
/// rank gets cores ÷ ranks rayon threads; across nodes the cores per node
/// are not known here, so `RAYON_NUM_THREADS` is passed on only if set
/// (as are `TERSE_CACHE` and `TERSE_LOG`).
pub fn command_on(
    ranks: usize,
    hostfile: Option<&Path>,
    executable: &Path,
    args: &[String],
) -> Command {
    let mut command = Command::new("mpirun");
    if crate::system_packages::is_root() {
        command.arg("--allow-run-as-root");
    }
    command.args(["--bind-to", "none", "-np", &ranks.to_string()]);
    match hostfile {
        Some(hostfile) => {
            command.arg("--hostfile").arg(hostfile);
            // OpenMPI hands a remote rank only the variables `-x` names:
            // the threads, the data cache and the log level set here
            // would otherwise stop at this node.
            for var in passed_on(|var| std::env::var_os(var).is_some()) {
                command.args(["-x", var]);
            }
        }
        None => {
            command
                .args(["--oversubscribe", "-x", "RAYON_NUM_THREADS"])
                .env("RAYON_NUM_THREADS", threads_per_rank(ranks).to_string());
        }
    }
    command.arg(executable).args(args);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn args(command: &Command) -> Vec<String> {
        command
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn a_hostfile_goes_to_mpirun_and_this_machines_thread_split_does_not() {
        let exe = Path::new("/x/terse");
        let here = command_on(4, None, exe, &["pretrain".into()]);
        let here_args = args(&here);
        assert!(
            here_args.contains(&"--oversubscribe".to_string()),
            "{here_args:?}"
        );
        assert!(
            here.get_envs().any(|(k, _)| k == "RAYON_NUM_THREADS"),
            "{here_args:?}"
        );
        let nodes = command_on(16, Some(Path::new("hosts.txt")), exe, &["pretrain".into()]);
        let node_args = args(&nodes);
        let at = node_args.iter().position(|a| a == "--hostfile").unwrap();
        assert_eq!(node_args[at + 1], "hosts.txt");
        assert!(
            !node_args.contains(&"--oversubscribe".to_string()),
            "{node_args:?}"
        );
        assert!(!nodes.get_envs().any(|(k, _)| k == "RAYON_NUM_THREADS"));
        assert_eq!(node_args[node_args.len() - 2..], ["/x/terse", "pretrain"]);
    }

    /// A data cache set for the job reaches the other nodes' ranks
    /// (OpenMPI passes on only what `-x` names).
    #[test]
    fn the_data_cache_and_log_level_set_here_reach_the_other_nodes() {
        assert_eq!(
            passed_on(|var| var != "RAYON_NUM_THREADS"),
            ["TERSE_CACHE", "TERSE_LOG"]
        );
        assert!(passed_on(|_| false).is_empty());
    }
}
