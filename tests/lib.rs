//! Workspace-level tests live in this package's test targets (`tidy.rs`,
//! `one_build.rs`, the end-to-end runs of the real binaries); the library
//! holds what they share.

use std::path::{Path, PathBuf};

/// The workspace's root directory (this package's parent).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests package lives inside the workspace")
        .to_path_buf()
}
