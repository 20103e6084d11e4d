//! The configs terse ships, `configs/<prefix><name><suffix>`, as xtask's
//! errors list them before any process starts (terse has the same
//! function; xtask links no workspace crate).

use std::path::Path;

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
