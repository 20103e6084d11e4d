//! SQuAD features kept between runs: featurizing SQuAD's 87,599 training
//! questions takes ~20 s of one core (the tokenizer's encodings), and every
//! run, resume and rank did it again. The features of a whole file are
//! written once into the cache (`feature_file.rs`) and read back by every
//! later run, under a name that fingerprints everything they depend on: the
//! SQuAD file's content and question count, the tokenizer as it encodes
//! (its serialised form and a probe text's encoding, which also changes
//! with the `tokenizers` crate's behaviour), the window settings, and the
//! code that reads, featurizes and stores them. Runs started at once (a
//! job's ranks, parallel tests) read under a shared lock beside the file;
//! the first to find it missing featurizes under the exclusive lock and
//! the others then read what it wrote.
//!
//! A file that fails its checks is featurized again; a cache that cannot
//! be written (read-only, full) costs the time, not the run, and one that
//! can only be read is still read.

use std::fs;
use std::path::{Path, PathBuf};

use super::feature_file::{read_features, write_features};
use super::{SquadExample, SquadFeature, SquadFeaturizer};
use crate::DataError;
use crate::fetch::{sha256_bytes, sha256_file};

/// The code the features depend on besides their inputs: a change to any
/// of these files makes new names, so no earlier file is read.
const CODE: [&[u8]; 3] = [
    include_bytes!("reader.rs"),
    include_bytes!("features.rs"),
    include_bytes!("feature_file.rs"),
];

/// A text whose encoding covers what a change in `tokenizers` would move:
/// accents, CJK, punctuation, digits, a long word split into pieces.
const PROBE: &str = "Zoë's café — 東京, naïve 1.5×! ¿Qué? Antidisestablishmentarianism.";

/// Where a run's features came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FeatureSource {
    /// Read from the cache.
    Cache,
    /// Featurized by this call; `kept`: written to the cache (a warning
    /// says why not otherwise).
    Featurized {
        /// Whether the cache holds them now.
        kept: bool,
    },
}

/// The features of `examples`, all of `file`'s questions as
/// [`read_squad`](super::read_squad) reads them, as
/// [`SquadFeaturizer::featurize`] makes them: read from `cache_dir` when an
/// earlier run left them there, made and written there otherwise. Also
/// returns the cache file and which of the two happened.
pub fn cached_features(
    featurizer: &SquadFeaturizer,
    file: &Path,
    examples: &[SquadExample],
    cache_dir: &Path,
) -> Result<(Vec<SquadFeature>, PathBuf, FeatureSource), DataError> {
    let path = cache_dir.join(cache_name(featurizer, file, examples.len())?);
    let lock = open_lock(cache_dir, &path.with_extension("lock"));
    let read = |why_not: &str| -> Option<Vec<SquadFeature>> {
        if !path.exists() {
            return None;
        }
        read_features(&path, examples.len())
            .inspect_err(|e| tracing::warn!("{e}; {why_not}"))
            .ok()
    };
    if let Some(lock) = &lock {
        let _ = lock.lock_shared();
    }
    if let Some(features) = read(if lock.is_some() {
        "featurizing again"
    } else {
        "featurizing"
    }) {
        return Ok((features, path, FeatureSource::Cache));
    }
    let Some(lock) = lock else {
        let features = featurizer.featurize(examples)?;
        return Ok((features, path, FeatureSource::Featurized { kept: false }));
    };
    // Another run may have written it between the two locks.
    let _ = lock.unlock();
    lock.lock().map_err(|e| DataError::Io {
        path: path.with_extension("lock"),
        source: e,
    })?;
    if let Some(features) = read("featurizing again") {
        return Ok((features, path, FeatureSource::Cache));
    }
    let features = featurizer.featurize(examples)?;
    let tmp = path.with_extension("tmp");
    let kept = write_features(&tmp, &features, examples.len()).and_then(|()| {
        fs::rename(&tmp, &path).map_err(|e| format!("renaming {}: {e}", tmp.display()))
    });
    if let Err(e) = &kept {
        let _ = fs::remove_file(&tmp);
        tracing::warn!(
            "could not keep SQuAD's features in {}: {e}; the next run featurizes again",
            path.display()
        );
    }
    let source = FeatureSource::Featurized { kept: kept.is_ok() };
    Ok((features, path, source))
}

/// The lock file beside the features, made where it can be, else opened
/// for reading (a cache another user made, or on a read-only disk: `flock`
/// takes either lock on a file opened to read); `None`, with a warning,
/// where neither works.
fn open_lock(cache_dir: &Path, lock_path: &Path) -> Option<fs::File> {
    let writable = fs::create_dir_all(cache_dir).and_then(|()| {
        fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(lock_path)
    });
    writable
        .or_else(|_| fs::File::open(lock_path))
        .inspect_err(|e| {
            tracing::warn!(
                "no lock for SQuAD's cached features ({}: {e}); reading them unlocked",
                lock_path.display()
            )
        })
        .ok()
}

/// `squad-STEM-seqS-strideD-queryQ-HASH.safetensors`, the hash over the
/// file's content and questions, the tokenizer and the code (see the
/// module's comment).
fn cache_name(
    featurizer: &SquadFeaturizer,
    file: &Path,
    questions: usize,
) -> Result<String, DataError> {
    let config = featurizer.config();
    let tokenizer = featurizer.tokenizer();
    let probe = tokenizer.encode_plain(PROBE)?;
    let code: Vec<u8> = CODE.concat();
    let key = format!(
        "{}\n{questions}\n{}\n{:?} {:?}\n{}\n",
        sha256_file(file)?,
        tokenizer.fingerprint()?,
        probe.ids,
        probe.offsets,
        sha256_bytes(&code),
    );
    let stem = file
        .file_stem()
        .map(|s| {
            s.to_string_lossy()
                .replace(|c: char| !c.is_ascii_alphanumeric(), "_")
        })
        .unwrap_or_default();
    Ok(format!(
        "squad-{stem}-seq{}-stride{}-query{}-{}.safetensors",
        config.max_seq,
        config.doc_stride,
        config.max_query,
        &sha256_bytes(key.as_bytes())[..16]
    ))
}
