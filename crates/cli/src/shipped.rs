//! The configs terse ships, `configs/<prefix><name><suffix>`: how a name on
//! the command line (a model, a task) finds its config, and what an error
//! lists when a name has none.

use std::path::{Path, PathBuf};

/// Where the shipped configs are, relative to the workspace root (where
/// terse runs).
pub fn dir() -> PathBuf {
    PathBuf::from("configs")
}

/// The names with a config `<prefix><name><suffix>` in `dir`, sorted.
pub fn names(dir: &Path, prefix: &str, suffix: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|file| Some(file.strip_prefix(prefix)?.strip_suffix(suffix)?.to_owned()))
        .collect();
    names.sort();
    names
}

/// The shipped configs from a unit test (which runs in the crate's
/// directory).
#[cfg(test)]
pub fn for_tests() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs")
}
