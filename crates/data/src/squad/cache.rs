//! SQuAD features kept between runs: featurizing SQuAD's 87,599 training
//! questions takes ~20 s of one core (the tokenizer's encodings), and every
//! run, resume and rank did it again. The features of a whole file are
//! written once into the cache as one safetensors file (the flat arrays
//! below, with a CRC-32C of their bytes) and read back by every later run,
//! under a name that fingerprints everything they depend on: the SQuAD
//! file's content, the tokenizer as it encodes, the window settings and
//! this format's version. Runs started at once (a job's ranks, parallel
//! tests) take turns through a lock beside the file: the first featurizes,
//! the others read what it wrote.
//!
//! A file that fails its checks is featurized again; a cache that cannot
//! be written (read-only, full) costs the time, not the run.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors, tensor::TensorView};

use super::{SquadExample, SquadFeature, SquadFeaturizer};
use crate::DataError;
use crate::fetch::{io, sha256_bytes, sha256_file};

/// The layout below; a change makes new names, so old files are not read.
const VERSION: u32 = 1;

/// An offset pair of a position outside the context (`None`).
const NO_OFFSET: u32 = u32::MAX;

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

/// The features of `examples`, read from `file` (whose content keys the
/// cache), as [`SquadFeaturizer::featurize`] makes them: read from
/// `cache_dir` when an earlier run left them there, made and written there
/// otherwise. Also returns the cache file and which of the two happened.
pub fn cached_features(
    featurizer: &SquadFeaturizer,
    file: &Path,
    examples: &[SquadExample],
    cache_dir: &Path,
) -> Result<(Vec<SquadFeature>, PathBuf, FeatureSource), DataError> {
    let path = cache_dir.join(cache_name(featurizer, file)?);
    let lock_path = path.with_extension("lock");
    let locked = fs::create_dir_all(cache_dir)
        .and_then(|()| fs::File::create(&lock_path))
        .and_then(|lock| lock.lock().map(|()| lock));
    let _lock = match locked {
        Ok(lock) => lock,
        Err(e) => {
            tracing::warn!(
                "no cache for SQuAD's features ({}: {e}); featurizing",
                lock_path.display()
            );
            let features = featurizer.featurize(examples)?;
            return Ok((features, path, FeatureSource::Featurized { kept: false }));
        }
    };
    if path.exists() {
        match read_features(&path, examples.len()) {
            Ok(features) => return Ok((features, path, FeatureSource::Cache)),
            Err(e) => tracing::warn!("{e}; featurizing again"),
        }
    }
    let features = featurizer.featurize(examples)?;
    let tmp = path.with_extension("tmp");
    let kept = write_features(&tmp, &features).and_then(|()| {
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

/// `squad-STEM-seqS-strideD-queryQ-HASH.safetensors`, the hash over the
/// SQuAD file's content, the tokenizer and this format's version.
fn cache_name(featurizer: &SquadFeaturizer, file: &Path) -> Result<String, DataError> {
    let config = featurizer.config();
    let key = format!(
        "{VERSION}\n{}\n{}\n",
        sha256_file(file)?,
        featurizer.tokenizer().fingerprint()?
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

/// The features as flat arrays: per feature its question, length and
/// labels; per position its id, token type, offsets and max-context flag.
#[derive(Default)]
struct Columns {
    example: Vec<u32>,
    length: Vec<u32>,
    start_position: Vec<u32>,
    end_position: Vec<u32>,
    input_ids: Vec<u32>,
    token_type_ids: Vec<u8>,
    offsets: Vec<u32>,
    max_context: Vec<u8>,
}

fn narrow(value: usize, what: &str) -> Result<u32, String> {
    u32::try_from(value)
        .ok()
        .filter(|&v| v != NO_OFFSET)
        .ok_or_else(|| format!("{what} {value} does not fit the cache's 32 bits"))
}

impl Columns {
    fn of(features: &[SquadFeature]) -> Result<Self, String> {
        let mut c = Columns::default();
        for f in features {
            c.example.push(narrow(f.example, "question index")?);
            c.length.push(narrow(f.len(), "length")?);
            c.start_position
                .push(narrow(f.start_position, "start position")?);
            c.end_position.push(narrow(f.end_position, "end position")?);
            c.input_ids.extend_from_slice(&f.input_ids);
            for &t in &f.token_type_ids {
                c.token_type_ids.push(
                    u8::try_from(t).map_err(|_| format!("token type {t} does not fit 8 bits"))?,
                );
            }
            for offset in &f.offsets {
                let (start, end) = match *offset {
                    Some((s, e)) => (narrow(s, "offset")?, narrow(e, "offset")?),
                    None => (NO_OFFSET, NO_OFFSET),
                };
                c.offsets.extend([start, end]);
            }
            c.max_context
                .extend(f.max_context.iter().map(|&m| u8::from(m)));
        }
        Ok(c)
    }

    /// Name, dtype, shape and little-endian bytes of each array.
    fn tensors(&self) -> Vec<(&'static str, Dtype, Vec<usize>, Vec<u8>)> {
        let words = |v: &[u32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let n = self.example.len();
        let positions = self.input_ids.len();
        vec![
            ("example", Dtype::U32, vec![n], words(&self.example)),
            ("length", Dtype::U32, vec![n], words(&self.length)),
            (
                "start_position",
                Dtype::U32,
                vec![n],
                words(&self.start_position),
            ),
            (
                "end_position",
                Dtype::U32,
                vec![n],
                words(&self.end_position),
            ),
            (
                "input_ids",
                Dtype::U32,
                vec![positions],
                words(&self.input_ids),
            ),
            (
                "token_type_ids",
                Dtype::U8,
                vec![positions],
                self.token_type_ids.clone(),
            ),
            (
                "offsets",
                Dtype::U32,
                vec![positions, 2],
                words(&self.offsets),
            ),
            (
                "max_context",
                Dtype::U8,
                vec![positions],
                self.max_context.clone(),
            ),
        ]
    }
}

/// CRC-32C over the arrays' bytes in name order.
fn checksum<'a>(arrays: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> String {
    let mut arrays: Vec<_> = arrays.into_iter().collect();
    arrays.sort_by_key(|&(name, _)| name);
    let crc = arrays
        .iter()
        .fold(0, |crc, (_, bytes)| crc32c::crc32c_append(crc, bytes));
    format!("{crc:08x}")
}

fn write_features(path: &Path, features: &[SquadFeature]) -> Result<(), String> {
    let tensors = Columns::of(features)?.tensors();
    let crc = checksum(
        tensors
            .iter()
            .map(|(name, _, _, bytes)| (*name, bytes.as_slice())),
    );
    let views = tensors
        .iter()
        .map(|(name, dtype, shape, bytes)| {
            TensorView::new(*dtype, shape.clone(), bytes)
                .map(|view| (*name, view))
                .map_err(|e| format!("array `{name}`: {e}"))
        })
        .collect::<Result<Vec<_>, String>>()?;
    let metadata = HashMap::from([
        ("format".to_string(), "terse SQuAD features".to_string()),
        ("version".to_string(), VERSION.to_string()),
        ("crc32c".to_string(), crc),
    ]);
    safetensors::serialize_to_file(views, Some(metadata), path).map_err(|e| e.to_string())?;
    fs::File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| e.to_string())
}

/// The features in `path`, checked against its checksum and for
/// `questions` questions.
fn read_features(path: &Path, questions: usize) -> Result<Vec<SquadFeature>, DataError> {
    let bad = |detail: String| DataError::Format {
        path: path.to_path_buf(),
        detail,
    };
    let bytes = fs::read(path).map_err(io(path))?;
    let (_, header) = SafeTensors::read_metadata(&bytes).map_err(|e| bad(e.to_string()))?;
    let tensors = SafeTensors::deserialize(&bytes).map_err(|e| bad(e.to_string()))?;
    let stored = header
        .metadata()
        .as_ref()
        .and_then(|m| m.get("crc32c"))
        .ok_or_else(|| bad("no crc32c in the header".into()))?;
    let views = tensors
        .names()
        .into_iter()
        .map(|name| Ok((name, tensors.tensor(name).map_err(|e| bad(e.to_string()))?)))
        .collect::<Result<Vec<_>, DataError>>()?;
    let actual = checksum(views.iter().map(|(name, view)| (*name, view.data())));
    if *stored != actual {
        return Err(bad(format!("CRC-32C {actual}, the header says {stored}")));
    }
    let array = |name: &str, dtype: Dtype| -> Result<&[u8], DataError> {
        let view = tensors
            .tensor(name)
            .map_err(|_| bad(format!("no array `{name}`")))?;
        if view.dtype() != dtype {
            return Err(bad(format!(
                "array `{name}` is {:?}, not {dtype:?}",
                view.dtype()
            )));
        }
        Ok(view.data())
    };
    let words = |name: &str| -> Result<Vec<u32>, DataError> {
        Ok(array(name, Dtype::U32)?
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    };
    let example = words("example")?;
    let length = words("length")?;
    let start_position = words("start_position")?;
    let end_position = words("end_position")?;
    let input_ids = words("input_ids")?;
    let offsets = words("offsets")?;
    let token_type_ids = array("token_type_ids", Dtype::U8)?;
    let max_context = array("max_context", Dtype::U8)?;
    let n = example.len();
    let positions: usize = length.iter().map(|&l| l as usize).sum();
    if [length.len(), start_position.len(), end_position.len()] != [n; 3]
        || [input_ids.len(), token_type_ids.len(), max_context.len()] != [positions; 3]
        || offsets.len() != 2 * positions
    {
        return Err(bad("arrays of inconsistent lengths".into()));
    }
    if example.iter().any(|&e| e as usize >= questions) {
        return Err(bad(format!(
            "a feature of a question beyond the {questions} read"
        )));
    }
    let mut features = Vec::with_capacity(n);
    let mut at = 0;
    for i in 0..n {
        let span = at..at + length[i] as usize;
        at = span.end;
        features.push(SquadFeature {
            example: example[i] as usize,
            input_ids: input_ids[span.clone()].to_vec(),
            token_type_ids: token_type_ids[span.clone()]
                .iter()
                .map(|&t| u32::from(t))
                .collect(),
            offsets: offsets[2 * span.start..2 * span.end]
                .chunks_exact(2)
                .map(|pair| (pair[0] != NO_OFFSET).then(|| (pair[0] as usize, pair[1] as usize)))
                .collect(),
            max_context: max_context[span].iter().map(|&m| m != 0).collect(),
            start_position: start_position[i] as usize,
            end_position: end_position[i] as usize,
        });
    }
    Ok(features)
}
