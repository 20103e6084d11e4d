//! The error type of terse-eval's file readers and metrics.

use std::path::PathBuf;

/// A file that could not be read or is malformed, or metric input that has
/// no defined value.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file does not follow its format.
    #[error("{path}: {detail}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong and where (line, JSON path or field).
        detail: String,
    },
    /// Malformed metric input (lengths differ, too few samples); a
    /// correlation of constant input is NaN, not this.
    #[error("{metric}: {detail}")]
    Undefined {
        /// The metric.
        metric: &'static str,
        /// Why.
        detail: String,
    },
}
