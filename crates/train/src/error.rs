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
    /// Examples that cannot form one batch.
    #[error("cannot batch: {0}")]
    Batch(String),
}
