//! Tokenized features kept between runs: tokenizing a dataset takes a core
//! for seconds to minutes (SQuAD's 87,599 training questions ~20 s, a GLUE
//! task of 400k pairs longer), and every run, resume and rank did it again.
//! A dataset's features are written once into the cache, as safetensors
//! of flat little-endian arrays with a CRC-32C and the example count in the
//! header, and read back by every later run, under a name whose hash covers
//! everything they depend on: the examples (or their file's content), the
//! tokenizer as it encodes ([`tokenizer_key`]), the settings, and the code
//! that makes and stores them (the callers' `include_bytes!` of it).
//!
//! Runs started at once (a job's ranks, parallel tests) read under a
//! shared lock beside the file; the first to find it missing makes it
//! under the exclusive lock and the others then read what it wrote. A file
//! that fails its checks is made again; a cache that cannot be written
//! (read-only, full) costs the time, not the run, and one that can only be
//! read is still read. A file's time is its last read; files of the same
//! dataset and settings (another terse or tokenizer) unread for 30 days are
//! removed when a new one is made.

use std::collections::HashMap;
use std::fs;
use std::path::Path;
use std::time::{Duration, SystemTime};

use safetensors::{Dtype, SafeTensors, tensor::TensorView};

use crate::fetch::{io, sha256_bytes};
use crate::{DataError, WordPiece};

/// Where a run's features came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FeatureSource {
    /// Read from the cache.
    Cache,
    /// Made by this call; `kept`: written to the cache (a warning says why
    /// not otherwise).
    Featurized {
        /// Whether the cache holds them now.
        kept: bool,
    },
}

/// A text whose encoding covers what a change in `tokenizers` would move:
/// accents, CJK, punctuation, digits, a long word split into pieces.
const PROBE: &str = "Zoë's café — 東京, naïve 1.5×! ¿Qué? Antidisestablishmentarianism.";

/// What of `tokenizer` the features depend on: its serialised form
/// ([`WordPiece::fingerprint`]), its special tokens' ids, a probe text's
/// ids and offsets (which also change with the `tokenizers` crate's
/// behaviour) and the source of terse's wrapper around it.
pub(crate) fn tokenizer_key(tokenizer: &WordPiece) -> Result<String, DataError> {
    let probe = tokenizer.encode_plain(PROBE)?;
    Ok(format!(
        "{} {:?} {:?} {:?} {}",
        tokenizer.fingerprint()?,
        tokenizer.special(),
        probe.ids,
        probe.offsets,
        sha256_bytes(include_bytes!("tokenizer.rs")),
    ))
}

/// `PREFIX-HASH.safetensors`, the hash (16 hex digits) over `key`.
pub(crate) fn file_name(prefix: &str, key: &str) -> String {
    let prefix = prefix.replace(|c: char| !c.is_ascii_alphanumeric() && c != '-', "_");
    format!(
        "{prefix}-{}.safetensors",
        &sha256_bytes(key.as_bytes())[..16]
    )
}

/// The features in `path` (`read` decodes them from its arrays), or made
/// by `make` and kept there by `write`, with where they came from.
pub(crate) fn cached<T>(
    path: &Path,
    read: impl Fn(&Path) -> Result<T, DataError>,
    make: impl FnOnce() -> Result<T, DataError>,
    write: impl FnOnce(&Path, &T) -> Result<(), String>,
) -> Result<(T, FeatureSource), DataError> {
    let lock = open_lock(path);
    let read = |again: bool| -> Option<T> {
        if !path.exists() {
            return None;
        }
        let action = if again {
            "making them again"
        } else {
            "making them"
        };
        let features = read(path)
            .inspect_err(|e| tracing::warn!("{e}; {action}"))
            .ok()?;
        // Its time is its last use (`remove_unused`); a cache this user
        // cannot write keeps the time it had.
        let _ = fs::File::options()
            .write(true)
            .open(path)
            .and_then(|file| file.set_modified(SystemTime::now()));
        Some(features)
    };
    if let Some(lock) = &lock {
        let _ = lock.lock_shared();
    }
    if let Some(features) = read(lock.is_some()) {
        return Ok((features, FeatureSource::Cache));
    }
    let Some(lock) = lock else {
        return Ok((make()?, FeatureSource::Featurized { kept: false }));
    };
    // Another run may have written them between the two locks.
    let _ = lock.unlock();
    if let Err(e) = lock.lock() {
        // A lock file opened only to read, on NFS (where flock is a POSIX
        // lock), or a filesystem without locks: made here, not kept.
        tracing::warn!(
            "cannot lock {} to write ({e}); making the features without keeping them",
            path.with_extension("lock").display()
        );
        return Ok((make()?, FeatureSource::Featurized { kept: false }));
    }
    if let Some(features) = read(true) {
        return Ok((features, FeatureSource::Cache));
    }
    let features = make()?;
    let tmp = path.with_extension("tmp");
    let kept = write(&tmp, &features).and_then(|()| {
        fs::rename(&tmp, path).map_err(|e| format!("renaming {}: {e}", tmp.display()))
    });
    if let Err(e) = &kept {
        let _ = fs::remove_file(&tmp);
        tracing::warn!(
            "could not keep the features in {}: {e}; the next run makes them again",
            path.display()
        );
    } else {
        remove_unused(path);
    }
    let source = FeatureSource::Featurized { kept: kept.is_ok() };
    Ok((features, source))
}

/// How long a features file may go unused before the next file of the same
/// dataset and settings made replaces it: files of an older terse or
/// tokenizer would otherwise stay forever (SQuAD's training windows at seq
/// 256 are 228 MB).
const UNUSED: Duration = Duration::from_secs(30 * 24 * 3600);

/// Removes the files beside `path` of the same dataset and settings (its
/// name but for the hash) that no run has read for [`UNUSED`], and their
/// locks.
fn remove_unused(path: &Path) {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        return;
    };
    // `PREFIX-` then 16 hex digits and `.safetensors` (`file_name`).
    let Some(prefix) = name.get(..name.len().saturating_sub(16 + ".safetensors".len())) else {
        return;
    };
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let other = entry.file_name();
        let Some(other) = other.to_str() else {
            continue;
        };
        let same_kind = other.strip_prefix(prefix).is_some_and(|rest| {
            rest.strip_suffix(".safetensors")
                .is_some_and(|hash| hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()))
        });
        let unused = entry
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|time| time.elapsed().is_ok_and(|age| age > UNUSED));
        if same_kind && other != name && unused {
            let stale = entry.path();
            if fs::remove_file(&stale).is_ok() {
                let _ = fs::remove_file(stale.with_extension("lock"));
                tracing::info!("removed {}, unused for 30 days", stale.display());
            }
        }
    }
}

/// The lock file beside `path`, made where it can be, else opened for
/// reading (a cache another user made, or on a read-only disk: `flock`
/// takes either lock on a file opened to read); `None`, with a warning,
/// where neither works.
fn open_lock(path: &Path) -> Option<fs::File> {
    let lock_path = path.with_extension("lock");
    let dir = path.parent().unwrap_or(Path::new("."));
    let writable = fs::create_dir_all(dir).and_then(|()| {
        fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)
    });
    writable
        .or_else(|_| fs::File::open(&lock_path))
        .inspect_err(|e| {
            tracing::warn!(
                "no lock for the cached features ({}: {e}); reading them unlocked",
                lock_path.display()
            )
        })
        .ok()
}

/// One array of a features file: name, dtype, shape, little-endian bytes.
pub(crate) type Array<'a> = (&'static str, Dtype, Vec<usize>, &'a [u8]);

/// CRC-32C over the arrays' bytes in name order.
fn checksum<'a>(arrays: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> String {
    let mut arrays: Vec<_> = arrays.into_iter().collect();
    arrays.sort_by_key(|&(name, _)| name);
    let crc = arrays
        .iter()
        .fold(0, |crc, (_, bytes)| crc32c::crc32c_append(crc, bytes));
    format!("{crc:08x}")
}

/// Writes `arrays`, the features of `examples` examples in format
/// `format`, to `path`: synced, readable by every user (a shared
/// `TERSE_CACHE`).
pub(crate) fn write_arrays(
    path: &Path,
    format: &str,
    examples: usize,
    arrays: &[Array<'_>],
) -> Result<(), String> {
    let crc = checksum(arrays.iter().map(|(name, _, _, bytes)| (*name, *bytes)));
    let views = arrays
        .iter()
        .map(|(name, dtype, shape, bytes)| {
            TensorView::new(*dtype, shape.clone(), bytes)
                .map(|view| (*name, view))
                .map_err(|e| format!("array `{name}`: {e}"))
        })
        .collect::<Result<Vec<_>, String>>()?;
    let metadata = HashMap::from([
        ("format".to_string(), format.to_string()),
        ("examples".to_string(), examples.to_string()),
        ("crc32c".to_string(), crc),
    ]);
    safetensors::serialize_to_file(views, Some(metadata), path).map_err(|e| e.to_string())?;
    // safetensors writes through a temporary file of mode 0600.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(path, fs::Permissions::from_mode(0o644)).map_err(|e| e.to_string())?;
    }
    fs::File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| e.to_string())
}

/// The arrays of a features file, by name.
pub(crate) struct Arrays<'a> {
    tensors: SafeTensors<'a>,
    path: &'a Path,
}

impl<'a> Arrays<'a> {
    /// The bytes of array `name`, checked to be of `dtype`.
    pub(crate) fn get(&self, name: &str, dtype: Dtype) -> Result<&'a [u8], DataError> {
        let view = self
            .tensors
            .tensor(name)
            .map_err(|_| bad(self.path, format!("no array `{name}`")))?;
        if view.dtype() != dtype {
            return Err(bad(
                self.path,
                format!("array `{name}` is {:?}, not {dtype:?}", view.dtype()),
            ));
        }
        Ok(view.data())
    }

    /// A format error naming the file.
    pub(crate) fn bad(&self, detail: String) -> DataError {
        bad(self.path, detail)
    }
}

fn bad(path: &Path, detail: String) -> DataError {
    DataError::Format {
        path: path.to_path_buf(),
        detail,
    }
}

/// The arrays of the features file at `path`, checked against its CRC-32C,
/// its format and its example count, handed to `decode`.
pub(crate) fn read_arrays<T>(
    path: &Path,
    format: &str,
    examples: usize,
    decode: impl FnOnce(&Arrays<'_>) -> Result<T, DataError>,
) -> Result<T, DataError> {
    let bytes = fs::read(path).map_err(io(path))?;
    let tensors = SafeTensors::deserialize(&bytes).map_err(|e| bad(path, e.to_string()))?;
    let (_, header) = SafeTensors::read_metadata(&bytes).map_err(|e| bad(path, e.to_string()))?;
    let field = |name: &str| {
        header
            .metadata()
            .as_ref()
            .and_then(|m| m.get(name).cloned())
            .ok_or_else(|| bad(path, format!("no {name} in the header")))
    };
    let views = tensors
        .names()
        .into_iter()
        .map(|name| {
            let view = tensors.tensor(name).map_err(|e| bad(path, e.to_string()))?;
            Ok((name, view))
        })
        .collect::<Result<Vec<_>, DataError>>()?;
    let (stored, actual) = (
        field("crc32c")?,
        checksum(views.iter().map(|(name, view)| (*name, view.data()))),
    );
    if stored != actual {
        return Err(bad(
            path,
            format!("CRC-32C {actual}, the header says {stored}"),
        ));
    }
    if field("format")? != format {
        return Err(bad(path, format!("not a file of {format}")));
    }
    let stored = field("examples")?;
    if stored != examples.to_string() {
        return Err(bad(
            path,
            format!("the features of {stored} examples, not of the {examples} read"),
        ));
    }
    decode(&Arrays { tensors, path })
}

/// Tokens as the features files store them, the per-position arrays both
/// kinds share: ids as little-endian u32, token types as u8.
#[derive(Default)]
pub(crate) struct Tokens {
    /// `input_ids`' bytes.
    pub(crate) input_ids: Vec<u8>,
    /// `token_type_ids`' bytes.
    pub(crate) token_type_ids: Vec<u8>,
}

impl Tokens {
    /// Appends one feature's ids and token types.
    pub(crate) fn push(&mut self, ids: &[u32], types: &[u32]) -> Result<(), String> {
        self.input_ids
            .extend(ids.iter().flat_map(|id| id.to_le_bytes()));
        for &t in types {
            self.token_type_ids
                .push(u8::try_from(t).map_err(|_| format!("token type {t} does not fit 8 bits"))?);
        }
        Ok(())
    }

    /// Positions stored.
    pub(crate) fn positions(&self) -> usize {
        self.token_type_ids.len()
    }

    /// The two arrays, for [`write_arrays`].
    pub(crate) fn arrays(&self) -> [Array<'_>; 2] {
        let positions = self.positions();
        [
            ("input_ids", Dtype::U32, vec![positions], &self.input_ids),
            (
                "token_type_ids",
                Dtype::U8,
                vec![positions],
                &self.token_type_ids,
            ),
        ]
    }
}

/// The ids and token types of positions `span` of a file's `input_ids`
/// and `token_type_ids` arrays (their lengths checked by the caller).
pub(crate) fn tokens_at(
    input_ids: &[u8],
    token_type_ids: &[u8],
    span: std::ops::Range<usize>,
) -> (Vec<u32>, Vec<u32>) {
    (
        words(&input_ids[4 * span.start..4 * span.end]),
        token_type_ids[span].iter().map(|&t| u32::from(t)).collect(),
    )
}

/// Little-endian u32s.
pub(crate) fn words(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// `value` as a file's 32 bits, `reserved` excluded.
pub(crate) fn narrow(value: usize, what: &str, reserved: Option<u32>) -> Result<[u8; 4], String> {
    u32::try_from(value)
        .ok()
        .filter(|&v| Some(v) != reserved)
        .map(u32::to_le_bytes)
        .ok_or_else(|| format!("{what} {value} does not fit the file's 32 bits"))
}
