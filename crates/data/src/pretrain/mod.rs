//! BERT pre-training data (Devlin et al. 2019, §3.1 and A.2): a corpus of
//! documents cut into sentences ([`corpus`]), masked-LM + next-sentence
//! examples made as Google's `create_pretraining_data.py` makes them
//! ([`instances`], [`masking`], [`build`]), written as fixed-record shard
//! files ([`shard`], checksummed) that training reads ([`set`]), each rank reading
//! its own share of a seeded per-epoch order ([`order`]).

pub mod build;
pub mod config;
pub mod corpus;
pub mod instances;
pub mod masking;
pub mod order;
pub mod set;
pub mod shard;

pub use build::{
    BuildSummary, build_shards, create_examples, masking_vocab, tokenize_documents,
    tokenize_documents_with,
};
pub use config::PretrainConfig;
pub use corpus::{
    Document, corpus_files, corpus_fingerprint, read_corpus, read_imdb, read_plain_corpus,
    read_sotu, read_squad_contexts, split_paragraphs, split_sentences,
};
pub use instances::{PretrainExample, TokenizedDocument};
pub use masking::{MaskedLm, MaskingVocab};
pub use order::{RankShare, epoch_indices};
pub use set::ShardSet;
pub use shard::{Shard, ShardHeader, write_shard};

use std::path::{Path, PathBuf};

use crate::DataError;

/// The files of `dir` with extension `ext`, in name order.
fn files_with_extension(dir: &Path, ext: &str) -> Result<Vec<PathBuf>, DataError> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|source| DataError::Io {
            path: dir.to_path_buf(),
            source,
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == ext))
        .collect();
    files.sort();
    Ok(files)
}
