//! Sentence-task encodings kept between runs (`feature_cache.rs`): a GLUE
//! task's pairs tokenized once (SNLI's 99,890 training pairs took ~8 s of
//! a core, MNLI's 393k take four times that), under a name that
//! fingerprints the examples' texts, the tokenizer, `max_seq` and the code
//! that encodes and stores them. The labels are not kept: they come from
//! the examples each time.

use std::path::{Path, PathBuf};

use safetensors::Dtype;
use sha2::{Digest, Sha256};

use super::encode::{ClassificationFeature, encode_classification};
use super::example::SentenceExample;
use crate::feature_cache::{
    Array, FeatureSource, Tokens, cached, file_name, tokenizer_key, tokens_at, words,
};
use crate::fetch::sha256_bytes;
use crate::{DataError, WordPiece};

/// The code the encodings depend on besides their inputs.
const CODE: [&[u8]; 3] = [
    include_bytes!("encode.rs"),
    include_bytes!("encode_cache.rs"),
    include_bytes!("../feature_cache.rs"),
];

/// The header's format name.
const FORMAT: &str = "terse classification encodings";

/// The encodings of `examples` ([`encode_classification`] at `max_seq`),
/// read from `cache_dir` when an earlier run left them there, made and
/// written there otherwise; `name` (the task and split, e.g. `snli-train`)
/// begins the file's name. Also returns the file and which of the two
/// happened.
pub fn cached_encodings(
    tokenizer: &WordPiece,
    examples: &[SentenceExample],
    max_seq: usize,
    cache_dir: &Path,
    name: &str,
) -> Result<(Vec<ClassificationFeature>, PathBuf, FeatureSource), DataError> {
    let key = format!(
        "{}\n{}\n{max_seq}\n{}\n{}\n",
        texts_digest(examples),
        examples.len(),
        tokenizer_key(tokenizer)?,
        sha256_bytes(&CODE.concat()),
    );
    let path = cache_dir.join(file_name(&format!("{name}-seq{max_seq}"), &key));
    let (features, source) = cached(
        &path,
        |path| read_encodings(path, examples),
        || {
            let progress = crate::progress::bar(examples.len(), "encoding examples");
            let features = examples
                .iter()
                .map(|example| {
                    progress.inc(1);
                    encode_classification(tokenizer, example, max_seq)
                })
                .collect();
            progress.finish_and_clear();
            features
        },
        |path, features| write_encodings(path, features),
    )?;
    Ok((features, path, source))
}

/// SHA-256 over the examples' texts, each length-prefixed (a pair's second
/// text marked present or absent).
fn texts_digest(examples: &[SentenceExample]) -> String {
    let mut hash = Sha256::new();
    let mut text = |t: &str| {
        hash.update((t.len() as u64).to_le_bytes());
        hash.update(t.as_bytes());
    };
    for example in examples {
        text(&example.text_a);
        match &example.text_b {
            Some(b) => {
                text("b");
                text(b);
            }
            None => text(""),
        }
    }
    format!("{:x}", hash.finalize())
}

fn write_encodings(path: &Path, features: &[ClassificationFeature]) -> Result<(), String> {
    let (mut length, mut tokens) = (Vec::new(), Tokens::default());
    for f in features {
        let n = u32::try_from(f.input_ids.len()).map_err(|_| "an encoding too long".to_string())?;
        length.extend(n.to_le_bytes());
        tokens.push(&f.input_ids, &f.token_type_ids)?;
    }
    let [ids, types] = tokens.arrays();
    let arrays: [Array<'_>; 3] = [
        ("length", Dtype::U32, vec![features.len()], &length),
        ids,
        types,
    ];
    crate::feature_cache::write_arrays(path, FORMAT, features.len(), &arrays)
}

/// The encodings in `path`, checked as those of `examples`, whose labels
/// they take.
fn read_encodings(
    path: &Path,
    examples: &[SentenceExample],
) -> Result<Vec<ClassificationFeature>, DataError> {
    crate::feature_cache::read_arrays(path, FORMAT, examples.len(), |arrays| {
        let length = words(arrays.get("length", Dtype::U32)?);
        let input_ids = arrays.get("input_ids", Dtype::U32)?;
        let token_type_ids = arrays.get("token_type_ids", Dtype::U8)?;
        let positions: usize = length.iter().map(|&l| l as usize).sum();
        if length.len() != examples.len()
            || input_ids.len() != 4 * positions
            || token_type_ids.len() != positions
        {
            return Err(arrays.bad("arrays of inconsistent lengths".into()));
        }
        let mut at = 0;
        Ok(examples
            .iter()
            .zip(&length)
            .map(|(example, &n)| {
                let span = at..at + n as usize;
                at = span.end;
                let (input_ids, token_type_ids) = tokens_at(input_ids, token_type_ids, span);
                ClassificationFeature {
                    input_ids,
                    token_type_ids,
                    label: example.label,
                }
            })
            .collect())
    })
}
