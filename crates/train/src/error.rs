//! The error type of terse-train.

/// Why a training run stopped.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The data could not be read.
    #[error(transparent)]
    Data(#[from] terse_data::DataError),
    /// The optimizer refused its config or failed a step.
    #[error(transparent)]
    Optim(#[from] terse_optim::OptimError),
    /// The run's settings are inconsistent.
    #[error("invalid run setting `{field}`: {reason}")]
    InvalidRun {
        /// The setting.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The loss stopped being a number.
    #[error("the loss became {loss} at step {step}: the run diverged")]
    Diverged {
        /// The step (from 1).
        step: u64,
        /// The loss value.
        loss: f32,
    },
    /// fp16's gradient overflowed with the loss scale already at its floor.
    #[error(
        "step {step}: the fp16 gradient overflowed (inf or NaN) with the loss scale at its floor \
         train.loss_scaling.min_scale = {scale}: the run diverged (a learning rate too high, a \
         1-bit optimizer frozen too early, or a model that needs bf16's range)"
    )]
    LossScaleFloor {
        /// The step (from 1).
        step: u64,
        /// The floor.
        scale: f64,
    },
    /// Examples that cannot form one batch.
    #[error("cannot batch: {0}")]
    Batch(String),
    /// A collective failed (another rank died or timed out).
    #[error(transparent)]
    Comm(#[from] terse_comm::CommError),
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// A config file is not a valid run.
    #[error("{}: {reason}", path.display())]
    Config {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong, naming the field.
        reason: String,
    },
    /// The run directory is another run's, or holds an earlier run.
    #[error("run directory {}: {reason}", path.display())]
    RunDir {
        /// The run directory.
        path: std::path::PathBuf,
        /// Why this run may not use it, and what to do.
        reason: String,
    },
    /// A checkpoint is damaged, incomplete or from another run.
    #[error("checkpoint {}: {reason}", path.display())]
    Checkpoint {
        /// The checkpoint directory (or file in it).
        path: std::path::PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// Weights could not be loaded or saved.
    #[error(transparent)]
    Model(#[from] terse_models::ModelError),
    /// A rank of the `local` backend failed (the lead rank reports it).
    #[error("rank {rank}: {error}")]
    Rank {
        /// The rank.
        rank: usize,
        /// Its error.
        error: Box<TrainError>,
    },
    /// A rank of the `local` backend panicked.
    #[error("rank {rank} panicked")]
    Panicked {
        /// The rank.
        rank: usize,
    },
    /// The device could not allocate what the run asked of it.
    #[error("{0}")]
    DeviceOutOfMemory(Box<crate::out_of_memory::OutOfMemory>),
    /// The run was stopped by SIGINT or SIGTERM after writing a checkpoint.
    #[error("stopped by a signal at step {step}; checkpoint written to {}", checkpoint.display())]
    Interrupted {
        /// The last step taken.
        step: u64,
        /// The checkpoint that `--resume` continues from.
        checkpoint: std::path::PathBuf,
    },
}

impl From<Box<crate::out_of_memory::OutOfMemory>> for TrainError {
    fn from(shortage: Box<crate::out_of_memory::OutOfMemory>) -> Self {
        Self::DeviceOutOfMemory(shortage)
    }
}

impl TrainError {
    /// Whether the run ended because its loss stopped being a number (on
    /// any rank).
    pub fn diverged(&self) -> bool {
        match self {
            Self::Diverged { .. } | Self::LossScaleFloor { .. } => true,
            Self::Rank { error, .. } => error.diverged(),
            _ => false,
        }
    }

    /// Whether this error only reports that another rank failed first (a
    /// collective of the `local` backend saw it leave): the failing rank's
    /// own error is the one to show.
    pub fn caused_by_another_rank(&self) -> bool {
        use terse_comm::CommError;
        match self {
            Self::Comm(CommError::PeerFailed { .. })
            | Self::Optim(terse_optim::OptimError::Comm(CommError::PeerFailed { .. })) => true,
            Self::Rank { error, .. } => error.caused_by_another_rank(),
            _ => false,
        }
    }

    /// The collective's give-up on ranks that did not arrive (its deadline
    /// passed, or a stop signal came while it waited), if this is one.
    pub fn gave_up_waiting(&self) -> Option<&terse_comm::CommError> {
        use terse_comm::CommError;
        match self {
            Self::Comm(e @ (CommError::Timeout { .. } | CommError::Stopped { .. }))
            | Self::Optim(terse_optim::OptimError::Comm(
                e @ (CommError::Timeout { .. } | CommError::Stopped { .. }),
            )) => Some(e),
            Self::Rank { error, .. } => error.gave_up_waiting(),
            _ => None,
        }
    }

    /// Whether this is (or a rank's error was) a stop by SIGINT/SIGTERM.
    pub fn interrupted(&self) -> bool {
        match self {
            Self::Interrupted { .. } => true,
            Self::Rank { error, .. } => error.interrupted(),
            _ => false,
        }
    }
}
