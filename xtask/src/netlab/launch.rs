//! Starting MPI ranks one per lab host.
//!
//! `mpirun` itself runs in host 0's namespace and is given the hosts by
//! their lab addresses. OpenMPI starts its daemon on every other host through
//! its rsh launch agent, here `xtask netlab agent <address> <command>`, which
//! runs the command inside that address's namespace (and refuses any address
//! that is not the lab's). OpenMPI's own wiring (`oob`) and the MPI traffic
//! (`btl tcp`, no shared memory) are restricted to the lab's subnet, so every
//! byte between two ranks leaves one namespace through its shaped `lab0` and
//! enters another through the bridge. Collectives use the bandwidth-optimal
//! algorithms (ring allreduce), as NCCL would on the papers' clusters.

use std::path::Path;
use std::process::{Command, ExitStatus};

use anyhow::{Context as _, Result, bail};

use super::lab::{self, SUBNET};
use crate::mpi;

/// Set in the environment, it leaves the choice of collective algorithms to
/// the user (`OMPI_MCA_coll_tuned_*_algorithm`).
const DYNAMIC_RULES: &str = "OMPI_MCA_coll_tuned_use_dynamic_rules";

/// The bandwidth-optimal algorithms for the lab's large messages: ring
/// allreduce (what NCCL, and so the papers' baselines, use), pairwise
/// all-to-all and ring allgather. OpenMPI's defaults for 4 ranks are
/// tuned for latency; on the shaped links they reached 58% of the link
/// rate for an fp32 allreduce (Rabenseifner) against 85% for the ring, and
/// 1-bit Adam's all-to-all + allgather 48% against 71% (measured at
/// 100 Mbit/s, 4M and 32M elements).
const BANDWIDTH_COLLECTIVES: [(&str, &str); 4] = [
    ("coll_tuned_use_dynamic_rules", "1"),
    ("coll_tuned_allreduce_algorithm", "4"),
    ("coll_tuned_alltoall_algorithm", "2"),
    ("coll_tuned_allgather_algorithm", "4"),
];

/// An `mpirun` of `program args…` with one rank on each of the first
/// `ranks` hosts of the lab that is up.
pub fn mpirun(ranks: usize, program: &Path, args: &[String]) -> Result<Command> {
    let hosts = lab::hosts_up()?;
    if ranks == 0 || ranks > hosts {
        bail!(
            "{ranks} rank(s) on a lab of {hosts} host(s): bring up at least {ranks} with \
             `cargo xtask netlab up --hosts {ranks} --rate …`"
        );
    }
    let agent = crate::terse_binary::xtask_exe()?;
    let agent = agent
        .to_str()
        .filter(|path| !path.contains(char::is_whitespace))
        .with_context(|| {
            format!(
                "the xtask binary's path {} has whitespace, which OpenMPI's launch agent \
                 setting cannot hold",
                agent.display()
            )
        })?;
    let host_list: Vec<String> = (0..ranks).map(lab::host_address).collect();
    let mut command = Command::new("ip");
    command.args(["netns", "exec", &lab::host_namespace(0)]);
    command.args(as_host(0, "exec \"$0\" \"$@\"")).arg("mpirun");
    if crate::system_packages::is_root() {
        command.arg("--allow-run-as-root");
    }
    command
        .args(["--bind-to", "none", "-np", &ranks.to_string()])
        .args(["--host", &host_list.join(",")])
        .args(["--mca", "plm_rsh_agent", &format!("{agent} netlab agent")])
        .args(["--mca", "oob_tcp_if_include", SUBNET])
        .args(["--mca", "btl", "tcp,self"])
        .args(["--mca", "btl_tcp_if_include", SUBNET])
        .args(["--mca", "pml", "ob1"]);
    if std::env::var_os(DYNAMIC_RULES).is_none() {
        command.args(
            BANDWIDTH_COLLECTIVES
                .iter()
                .flat_map(|(k, v)| ["--mca", k, v]),
        );
    }
    command
        .args(["-x", "RAYON_NUM_THREADS"])
        .env(
            "RAYON_NUM_THREADS",
            mpi::threads_per_rank(ranks).to_string(),
        )
        .arg(program)
        .args(args);
    Ok(command)
}

/// Runs `program args…` on `ranks` lab hosts and waits for it.
pub fn run(ranks: usize, program: &Path, args: &[String]) -> Result<ExitStatus> {
    mpirun(ranks, program, args)?
        .status()
        .with_context(|| format!("cannot start mpirun for {}", program.display()))
}

/// `unshare --uts /bin/sh -c "hostname <host i's namespace> && <script>"`:
/// `script` run as host `i`, with a hostname of its own.
/// OpenMPI names its session directory in /tmp after the hostname; on one
/// shared hostname the daemons of different hosts create and remove the
/// same directories and a launch fails now and then.
fn as_host(i: usize, script: &str) -> [String; 5] {
    [
        "unshare".into(),
        "--uts".into(),
        "/bin/sh".into(),
        "-c".into(),
        format!("hostname {} && {script}", lab::host_namespace(i)),
    ]
}

/// OpenMPI's launch agent: runs `command` (one shell line, as OpenMPI
/// passes it to `ssh host command`) inside the namespace of lab address
/// `host`.
pub fn agent(host: &str, command: &[String]) -> Result<()> {
    let Some(i) = lab::host_of_address(host) else {
        bail!("netlab agent: {host:?} is not a lab address; refusing to start anything there");
    };
    let status = Command::new("ip")
        .args(["netns", "exec", &lab::host_namespace(i)])
        .args(as_host(i, &command.join(" ")))
        .status()
        .context("netlab agent: cannot run `ip netns exec`")?;
    if !status.success() {
        std::process::exit(status.code().unwrap_or(1));
    }
    Ok(())
}
