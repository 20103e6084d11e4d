//! What a launcher's environment says of the job that started this
//! process, before MPI starts: OpenMPI's `mpirun`, MPICH's (PMI), or a
//! PMIx launcher such as Slurm's `srun --mpi=pmix`.

/// What a launcher's environment says of the job (`var` reads one
/// variable).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LaunchedJob {
    /// Its processes (1 where the launcher does not say).
    pub(crate) processes: usize,
    /// This process's rank on its node (0 where the launcher does not say).
    pub(crate) node_rank: usize,
}

/// [`launcher`] of this process's environment.
pub(crate) fn from_env() -> Option<LaunchedJob> {
    launcher(&|var| std::env::var(var).ok())
}

/// The job that started this process, from the variables of OpenMPI's
/// `mpirun`, MPICH's (PMI) or a PMIx launcher; `None` when none is set.
/// Slurm's `srun --mpi=pmix` sets PMIX_RANK but neither OpenMPI's nor
/// PMI's size: its step's variables say the size and the node rank.
fn launcher(var: &dyn Fn(&str) -> Option<String>) -> Option<LaunchedJob> {
    let launched = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"]
        .iter()
        .any(|name| var(name).is_some());
    let first = |names: &[&str]| {
        names
            .iter()
            .find_map(|name| var(name)?.trim().parse::<usize>().ok())
    };
    launched.then(|| LaunchedJob {
        // Not SLURM_NTASKS: the allocation's, which another launcher
        // inside it (mpirun -n 4 in a 16-task sbatch) does not fill.
        processes: first(&["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"])
            .unwrap_or(1),
        node_rank: first(&[
            "OMPI_COMM_WORLD_LOCAL_RANK",
            "MPI_LOCALRANKID",
            "PMI_LOCAL_RANK",
            "SLURM_LOCALID",
        ])
        .unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_job_is_read_from_each_launchers_variables() {
        let job = |vars: &[(&str, &str)]| {
            let vars: Vec<(String, String)> =
                vars.iter().map(|&(k, v)| (k.into(), v.into())).collect();
            launcher(&|name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()))
        };
        let of = |processes, node_rank| {
            Some(LaunchedJob {
                processes,
                node_rank,
            })
        };
        // An sbatch script run without a launcher.
        assert_eq!(job(&[("SLURM_NTASKS", "8")]), None);
        let openmpi = [
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "3"),
        ];
        assert_eq!(job(&openmpi), of(4, 3));
        // srun --mpi=pmix: Slurm's own variables, the step's size first.
        let srun = [
            ("PMIX_RANK", "5"),
            ("SLURM_NTASKS", "16"),
            ("SLURM_STEP_NUM_TASKS", "8"),
            ("SLURM_LOCALID", "1"),
        ];
        assert_eq!(job(&srun), of(8, 1));
        // A PMIx launcher inside a 16-task allocation, no step of its own.
        assert_eq!(job(&[("PMIX_RANK", "2"), ("SLURM_NTASKS", "16")]), of(1, 0));
        assert_eq!(job(&[("PMIX_RANK", "0")]), of(1, 0));
    }
}
