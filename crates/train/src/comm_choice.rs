//! `--comm`: which communicator a run's ranks use. `auto` (the default)
//! picks as terse always has: `mpi` in a process `mpirun` started, `local`
//! threads for `--local-ranks N > 1`, else one rank alone. The others name
//! it, and a choice that cannot work here is refused before anything runs.

use std::fmt;
use std::str::FromStr;

use crate::TrainError;

/// The communicator asked for on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CommChoice {
    /// `mpi` under mpirun, `local` for several thread ranks, else alone.
    #[default]
    Auto,
    /// Ranks as threads of this process (`--local-ranks`).
    Local,
    /// One rank per process through OpenMPI (started by `mpirun -np N`;
    /// alone, a world of one).
    Mpi,
    /// NCCL between the GPUs of an MPI job, bootstrapped over MPI.
    Nccl,
}

/// The communicator a run gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backend {
    /// One rank, nothing communicated.
    Single,
    /// This many ranks as threads.
    Threads(usize),
    /// This process is one MPI rank.
    Mpi,
    /// This process is one MPI rank, collectives through NCCL.
    Nccl,
}

impl FromStr for CommChoice {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        Ok(match text {
            "auto" => Self::Auto,
            "local" => Self::Local,
            "mpi" => Self::Mpi,
            "nccl" => Self::Nccl,
            other => {
                return Err(format!(
                    "unknown communicator `{other}`: one of auto, local, mpi, nccl"
                ));
            }
        })
    }
}

impl fmt::Display for CommChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Local => "local",
            Self::Mpi => "mpi",
            Self::Nccl => "nccl",
        })
    }
}

impl CommChoice {
    /// The backend for `local_ranks` thread ranks asked for, in a process
    /// `mpirun` started or not.
    pub(crate) fn backend(
        self,
        local_ranks: usize,
        under_mpirun: bool,
    ) -> Result<Backend, TrainError> {
        let refuse = |reason: String| TrainError::InvalidRun {
            field: "--comm",
            reason: format!("--comm {self}: {reason}"),
        };
        let one_per_process = |backend: Backend| {
            if local_ranks > 1 {
                Err(refuse(format!(
                    "each process is one rank (start N with `mpirun -np N`, or `cargo xtask … \
                     --ranks N`); --local-ranks {local_ranks} asks for threads"
                )))
            } else {
                Ok(backend)
            }
        };
        match self {
            Self::Auto if under_mpirun => Ok(Backend::Mpi),
            Self::Auto if local_ranks > 1 => Ok(Backend::Threads(local_ranks)),
            Self::Auto => Ok(Backend::Single),
            Self::Local if under_mpirun => Err(refuse(
                "this process was started by mpirun, which makes it one rank of an MPI job; \
                 use --comm mpi (or auto)"
                    .into(),
            )),
            Self::Local => Ok(Backend::Threads(local_ranks.max(1))),
            Self::Mpi => one_per_process(Backend::Mpi),
            Self::Nccl if !cfg!(feature = "nccl") => Err(refuse(
                "this build has no NCCL backend: build terse with `--features terse-train/nccl` \
                 on a machine with CUDA (cudarc loads libcuda and libnccl when the run starts)"
                    .into(),
            )),
            Self::Nccl => one_per_process(Backend::Nccl),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_picks_as_before_and_the_others_name_their_backend() {
        use Backend::{Single, Threads};
        use CommChoice::{Auto, Local};
        for (choice, ranks, mpirun, want) in [
            (Auto, 1, false, Single),
            (Auto, 4, false, Threads(4)),
            (Auto, 1, true, Backend::Mpi),
            (Local, 1, false, Threads(1)),
            (Local, 3, false, Threads(3)),
            (CommChoice::Mpi, 1, false, Backend::Mpi),
            (CommChoice::Mpi, 1, true, Backend::Mpi),
        ] {
            assert_eq!(
                choice.backend(ranks, mpirun).unwrap(),
                want,
                "{choice} {ranks} {mpirun}"
            );
        }
    }

    #[test]
    fn choices_that_cannot_work_are_refused_with_the_reason() {
        let error = CommChoice::Local.backend(2, true).unwrap_err().to_string();
        assert!(error.contains("started by mpirun"), "{error}");
        let error = CommChoice::Mpi.backend(2, false).unwrap_err().to_string();
        assert!(
            error.contains("--local-ranks 2 asks for threads"),
            "{error}"
        );
        if !cfg!(feature = "nccl") {
            let error = CommChoice::Nccl.backend(1, true).unwrap_err().to_string();
            assert!(error.contains("no NCCL backend"), "{error}");
        }
        assert!(
            "gloo"
                .parse::<CommChoice>()
                .unwrap_err()
                .contains("one of auto, local, mpi, nccl")
        );
    }
}
