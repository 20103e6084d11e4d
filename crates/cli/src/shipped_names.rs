//! The configs terse ships, `configs/<prefix><name><suffix>`: the one a
//! name on the command line picks, and the names an error lists when it
//! picks none.
//! std only, with no tests or crate paths: xtask (which links no workspace
//! crate) compiles this same file by path for the errors it gives before
//! any process starts, so both list the same names the same way.

use std::path::{Path, PathBuf};

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

/// The config `<dir>/<prefix><name><suffix>`, or an error naming it and
/// listing the names shipped (`what`: "models shipped") to pick instead.
pub fn config(
    dir: &Path,
    prefix: &str,
    name: &str,
    suffix: &str,
    what: &str,
) -> Result<PathBuf, String> {
    let path = dir.join(format!("{prefix}{name}{suffix}"));
    if path.exists() {
        return Ok(path);
    }
    let mut shipped = names(dir, prefix, suffix).join(", ");
    if shipped.is_empty() {
        shipped = "none".into();
    }
    Err(format!(
        "{}: no such config; {what}: {shipped}",
        path.display()
    ))
}
