//! `copy_to_cache`: datasets copied out of the cache, verified, into another
//! directory laid out as a cache, for a machine that cannot fetch them (a GPU
//! node lent without network, where `TERSE_CACHE` names that directory).
//! `cargo xtask bundle` carries BERT-Tiny's pre-training data this way.

use std::path::{Path, PathBuf};

use crate::DataError;
use crate::datasets::dataset_files;
use crate::fetch::io;
use crate::manifest::manifest;

/// Copies each of `wanted` into `to/datasets/NAME/`, where the cache keeps
/// it: `NAME` (a dataset or an alias) is all of its files, `NAME:FILE` one
/// file of it (pre-training reads MiniLM's tokenizer, not its 87 MB of
/// weights). What the cache lacks is fetched and verified first, so every
/// copy is of a file whose SHA-256 matched its manifest. Returns the files
/// written.
pub fn copy_to_cache(wanted: &[String], to: &Path) -> Result<Vec<PathBuf>, DataError> {
    let mut written = Vec::new();
    for item in wanted {
        let (name, only) = match item.split_once(':') {
            Some((name, file)) => (name, Some(file)),
            None => (item.as_str(), None),
        };
        let manifest = manifest(name)?;
        let files: Vec<&str> = match only {
            Some(file) => vec![file],
            None => manifest.files.iter().map(|f| f.name.as_str()).collect(),
        };
        let from = dataset_files(name, &files)?;
        // The manifest's own name, not the alias asked for: the name a
        // reader on the other machine looks under.
        let dir = to.join("datasets").join(&manifest.name);
        for file in files {
            let target = dir.join(file);
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent).map_err(io(parent))?;
            }
            let source = from.join(file);
            // Copying a file onto itself (DIR is the cache) would truncate
            // it first: it is already where it is wanted.
            if !same_file(&source, &target) {
                std::fs::copy(&source, &target).map_err(io(&target))?;
            }
            written.push(target);
        }
    }
    Ok(written)
}

/// Whether `a` and `b` are one file (`b` may not exist yet).
fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}
