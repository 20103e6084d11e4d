//! `--comm`: which communicator a run's ranks use. `auto` (the default)
//! picks `nccl` in a process of a several-process `mpirun` job training on
//! CUDA (as PyTorch and DeepSpeed do on NVIDIA GPUs), `mpi` in any other
//! process `mpirun` started, `local` threads for `--local-ranks N > 1`,
//! else one rank alone. The others name it, and a choice that cannot work
//! here is refused before anything runs.

use std::fmt;
use std::str::FromStr;

use crate::TrainError;

/// The communicator asked for on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CommChoice {
    /// `nccl` for several mpirun processes on CUDA, `mpi` under mpirun
    /// otherwise, `local` for several thread ranks, else alone.
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

/// Where a run's ranks are: what `auto` picks from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Placement {
    /// Thread ranks asked for (`--local-ranks`).
    pub local_ranks: usize,
    /// The processes of the `mpirun` job that started this one (`None`:
    /// not started by mpirun).
    pub mpirun_processes: Option<usize>,
    /// Whether the model trains on a CUDA GPU.
    pub on_cuda: bool,
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
    /// The backend for the ranks of `placement`.
    pub(crate) fn backend(self, placement: Placement) -> Result<Backend, TrainError> {
        let Placement {
            local_ranks,
            mpirun_processes,
            on_cuda,
        } = placement;
        let under_mpirun = mpirun_processes.is_some();
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
            // Thread ranks asked for inside an MPI job would be dropped
            // without a word: refused, as with --comm mpi and nccl.
            Self::Auto if on_cuda && mpirun_processes.is_some_and(|n| n > 1) => {
                one_per_process(Backend::Nccl)
            }
            Self::Auto if under_mpirun => one_per_process(Backend::Mpi),
            Self::Auto if local_ranks > 1 => Ok(Backend::Threads(local_ranks)),
            Self::Auto => Ok(Backend::Single),
            Self::Local if under_mpirun => Err(refuse(
                "this process was started by mpirun, which makes it one rank of an MPI job; \
                 use --comm mpi (or auto)"
                    .into(),
            )),
            Self::Local => Ok(Backend::Threads(local_ranks.max(1))),
            Self::Mpi => one_per_process(Backend::Mpi),
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
        for (choice, ranks, mpirun, on_cuda, want) in [
            (Auto, 1, None, false, Single),
            (Auto, 4, None, false, Threads(4)),
            (Auto, 1, Some(2), false, Backend::Mpi),
            (Local, 1, None, false, Threads(1)),
            (Local, 3, None, false, Threads(3)),
            (CommChoice::Mpi, 1, None, false, Backend::Mpi),
            (CommChoice::Mpi, 1, Some(2), false, Backend::Mpi),
            // On CUDA: NCCL for several mpirun processes, as PyTorch and
            // DeepSpeed; one process or thread ranks as before.
            (Auto, 1, Some(2), true, Backend::Nccl),
            (Auto, 1, Some(1), true, Backend::Mpi),
            (Auto, 1, None, true, Single),
            (Auto, 4, None, true, Threads(4)),
            (CommChoice::Mpi, 1, Some(2), true, Backend::Mpi),
            (CommChoice::Nccl, 1, Some(1), false, Backend::Nccl),
        ] {
            let placement = Placement {
                local_ranks: ranks,
                mpirun_processes: mpirun,
                on_cuda,
            };
            assert_eq!(
                choice.backend(placement).unwrap(),
                want,
                "{choice} {placement:?}"
            );
        }
    }

    #[test]
    fn choices_that_cannot_work_are_refused_with_the_reason() {
        let placement = |local_ranks, mpirun_processes| Placement {
            local_ranks,
            mpirun_processes,
            on_cuda: false,
        };
        let error = CommChoice::Local
            .backend(placement(2, Some(2)))
            .unwrap_err()
            .to_string();
        assert!(error.contains("started by mpirun"), "{error}");
        let error = CommChoice::Mpi
            .backend(placement(2, None))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("--local-ranks 2 asks for threads"),
            "{error}"
        );
        // `cargo xtask … --ranks 2 --local-ranks 4` once trained on 2.
        for on_cuda in [false, true] {
            let placement = Placement {
                on_cuda,
                ..placement(4, Some(2))
            };
            let error = CommChoice::Auto.backend(placement).unwrap_err().to_string();
            assert!(error.contains("each process is one rank"), "{error}");
        }
        assert!(
            "gloo"
                .parse::<CommChoice>()
                .unwrap_err()
                .contains("one of auto, local, mpi, nccl")
        );
    }
}
