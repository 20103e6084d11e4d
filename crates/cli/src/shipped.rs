//! The configs terse ships, `configs/<prefix><name><suffix>`: how a name on
//! the command line (a model, a task) finds its config, and what an error
//! lists when a name has none.

use std::path::PathBuf;

/// The shipped configs and their names, in the file xtask shares (see its
/// module doc).
pub use crate::shipped_names::{config, names};

/// Where the shipped configs are, relative to the workspace root (where
/// terse runs).
pub fn dir() -> PathBuf {
    PathBuf::from("configs")
}

/// The shipped configs from a unit test (which runs in the crate's
/// directory).
#[cfg(test)]
pub fn for_tests() -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs")
}
