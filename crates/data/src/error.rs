//! The error type of terse-data.

use std::path::PathBuf;

/// A data file that could not be read or is malformed.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The file could not be opened or read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file's content does not follow its format.
    #[error("{path}: {detail}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong, and where (byte offset or header field).
        detail: String,
    },
    /// A dataset that is not installed where it is looked for.
    #[error("{name} not found at {path}: {hint}")]
    Missing {
        /// The dataset.
        name: &'static str,
        /// Where it was looked for.
        path: PathBuf,
        /// How to get it.
        hint: &'static str,
    },
    /// A file whose SHA-256 is not the one its manifest gives.
    #[error(
        "{path}: SHA-256 {actual}, expected {expected} (partial or corrupted; delete it to fetch again)"
    )]
    Checksum {
        /// The file.
        path: PathBuf,
        /// The checksum the manifest gives.
        expected: String,
        /// The checksum of the file.
        actual: String,
    },
    /// A download that failed.
    #[error("downloading {url}: {detail}")]
    Network {
        /// What was being downloaded.
        url: String,
        /// Why it failed.
        detail: String,
    },
    /// A dataset name no manifest gives.
    #[error("no dataset named {name:?}; known: {known}")]
    UnknownDataset {
        /// The name asked for.
        name: String,
        /// The names (and aliases) of the manifests.
        known: String,
    },
    /// Every source of a dataset failed.
    #[error("{name}: no source could provide {missing}:\n{attempts}")]
    Unavailable {
        /// The dataset.
        name: String,
        /// The files still missing.
        missing: String,
        /// One line per source tried, with why it failed.
        attempts: String,
    },
    /// A configuration whose values contradict each other.
    #[error("{config}: {detail}")]
    Config {
        /// The configuration type.
        config: &'static str,
        /// Which rule the values break.
        detail: String,
    },
}
