//! The error type of terse-models.

use std::path::PathBuf;

/// A model config or weight file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A config field out of range.
    #[error("model config: {field}: {reason}")]
    Config {
        /// The field.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// A file that could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file whose content is not what the model needs.
    #[error("{path}: {detail}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
}
