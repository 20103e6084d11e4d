//! The `--backend` and `--local-ranks` options that the check binaries
//! (`terse-comm-check`, terse-optim's `terse-optim-check`) share: one rank
//! per process under `mpirun`, or ranks as threads of one process.

use clap::ValueEnum;

/// Where a check binary's ranks run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// One rank per process, launched by `mpirun`.
    Mpi,
    /// `--local-ranks` threads in this process.
    Local,
}

impl Backend {
    /// MPI when this process was started by `mpirun` (in a build with the
    /// `mpi` feature), else local.
    pub fn detect() -> Backend {
        #[cfg(feature = "mpi")]
        let under_mpirun = crate::MpiComm::launched_by_mpirun();
        #[cfg(not(feature = "mpi"))]
        let under_mpirun = false;
        if under_mpirun {
            Backend::Mpi
        } else {
            Backend::Local
        }
    }
}

/// The options, for a binary's arguments to `#[command(flatten)]`;
/// `LOCAL_RANKS` is the binary's default for `--local-ranks`.
#[derive(clap::Args, Clone, Copy, Debug)]
pub struct Launch<const LOCAL_RANKS: usize> {
    /// Backend [default: mpi under mpirun, else local].
    #[arg(long, value_enum)]
    pub backend: Option<Backend>,
    /// Ranks as threads of this process, for the local backend (mpirun's
    /// `-n` sets the number of processes).
    #[arg(long, default_value_t = LOCAL_RANKS)]
    pub local_ranks: usize,
}

impl<const LOCAL_RANKS: usize> Launch<LOCAL_RANKS> {
    /// `--backend`, or [`Backend::detect`] without it.
    pub fn backend(&self) -> Backend {
        self.backend.unwrap_or_else(Backend::detect)
    }
}
