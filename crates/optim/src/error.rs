//! The error type of terse-optim.

use std::path::PathBuf;

/// What went wrong in building, stepping, saving or loading an optimizer.
#[derive(Debug, thiserror::Error)]
pub enum OptimError {
    /// A configuration value outside its valid range.
    #[error("invalid optimizer config: `{field}` = {value}: {reason}")]
    InvalidConfig {
        /// The config field, dotted (`lamb.c_min`).
        field: String,
        /// The offending value, printed.
        value: String,
        /// Which rule it breaks.
        reason: &'static str,
    },
    /// A flat buffer whose length is not the layout's.
    #[error("{what}: expected {expected} elements (the parameter layout), got {actual}")]
    LengthMismatch {
        /// Which buffer.
        what: &'static str,
        /// The layout's total length.
        expected: usize,
        /// The buffer's length.
        actual: usize,
    },
    /// A module whose parameters do not match the layout it is written back with.
    #[error("module does not match the parameter layout at segment {index}: {detail}")]
    LayoutMismatch {
        /// The segment index where they first differ.
        index: usize,
        /// What differs (path and shape of both sides).
        detail: String,
    },
    /// A tensor that could not be read back to the host as f32.
    #[error("cannot read tensor `{path}` as f32: {detail}")]
    TensorData {
        /// The parameter path (or `flat`).
        path: String,
        /// burn's message.
        detail: String,
    },
    /// A communicator of another world than the optimizer was built for.
    #[error("optimizer built for rank {} of {}, stepped on rank {} of {}", expected.0, expected.1, actual.0, actual.1)]
    WorldMismatch {
        /// (rank, world size) at construction.
        expected: (usize, usize),
        /// (rank, world size) of the communicator given.
        actual: (usize, usize),
    },
    /// A collective failed.
    #[error("communication failed during the optimizer step: {0}")]
    Comm(#[from] terse_comm::CommError),
    /// A state file could not be written or read.
    #[error("optimizer state file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A state file that is not what this optimizer can resume from.
    #[error("optimizer state file {path}: {detail}")]
    BadState {
        /// The file.
        path: PathBuf,
        /// What is wrong with it (missing tensor, other optimizer, other layout...).
        detail: String,
    },
}
