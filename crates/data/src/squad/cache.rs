//! SQuAD's features kept between runs (`feature_cache.rs`): the windows of
//! a whole SQuAD file, under a name that fingerprints the file's content
//! and question count, the tokenizer, the window settings and the code
//! that reads, featurizes and stores them.

use std::path::{Path, PathBuf};

use super::feature_file::{read_features, write_features};
use super::{SquadExample, SquadFeature, SquadFeaturizer};
use crate::DataError;
use crate::feature_cache::{FeatureSource, cached, file_name, tokenizer_key};
use crate::fetch::{sha256_bytes, sha256_file};

/// The code the features depend on besides their inputs: a change to any
/// of these files makes new names, so no earlier file is read.
const CODE: [&[u8]; 4] = [
    include_bytes!("reader.rs"),
    include_bytes!("features.rs"),
    include_bytes!("feature_file.rs"),
    include_bytes!("../feature_cache.rs"),
];

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
    let config = featurizer.config();
    let key = format!(
        "{}\n{}\n{}\n{}\n",
        sha256_file(file)?,
        examples.len(),
        tokenizer_key(featurizer.tokenizer())?,
        sha256_bytes(&CODE.concat()),
    );
    let stem = file.file_stem().unwrap_or_default().to_string_lossy();
    let prefix = format!(
        "squad-{stem}-seq{}-stride{}-query{}",
        config.max_seq, config.doc_stride, config.max_query
    );
    let path = cache_dir.join(file_name(&prefix, &key));
    let questions = examples.len();
    let (features, source) = cached(
        &path,
        |path| read_features(path, questions),
        || featurizer.featurize(examples),
        |path, features| write_features(path, features, questions),
    )?;
    Ok((features, path, source))
}
