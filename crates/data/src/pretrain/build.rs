//! From documents to shard files: tokenize every sentence, make
//! `dupe_factor` passes of example creation over the shuffled documents
//! (each pass other pairings and masks), shuffle the examples and deal them
//! round-robin into shards. One random stream seeded by the config drives
//! it all, so the files are byte-identical for the same corpus, tokenizer
//! and config.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde::Serialize;

use super::config::PretrainConfig;
use super::corpus::Document;
use super::instances::{
    InstanceSettings, PretrainExample, TokenizedDocument, instances_from_document,
};
use super::masking::MaskingVocab;
use super::shard::write_shard;
use crate::progress::bar;
use crate::{DataError, WordPiece};
use terse_rng::SplitMix64;

/// What `build_shards` wrote (also saved as `pretrain.json` beside the shards).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BuildSummary {
    /// The settings used.
    pub config: PretrainConfig,
    /// Documents and sentences read.
    pub documents: usize,
    /// Sentences read.
    pub sentences: usize,
    /// Word pieces of the corpus (one pass).
    pub tokens: usize,
    /// Examples written.
    pub examples: usize,
    /// Shard file names and their example counts.
    pub shards: Vec<(String, usize)>,
    /// Vocabulary size of the tokenizer.
    pub vocab_size: u32,
}

/// The word pieces of every sentence, documents without any dropped, on
/// all available cores (see [`tokenize_documents_with`]).
pub fn tokenize_documents(
    documents: &[Document],
    tokenizer: &WordPiece,
) -> Result<Vec<TokenizedDocument>, DataError> {
    let threads = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    tokenize_documents_with(documents, tokenizer, threads)
}

/// Documents per unit of work: small enough to balance addresses of very
/// different lengths across threads, large enough to make the hand-out cheap.
const BLOCK: usize = 8;

/// [`tokenize_documents`] on `threads` threads. Tokenization is the slow
/// step (~0.25M word pieces/s per core, against ~100k examples/s for
/// creation), and it draws nothing at random: threads take blocks of
/// documents as they come free and the blocks are put back in document
/// order, so the result is the same for every thread count.
pub fn tokenize_documents_with(
    documents: &[Document],
    tokenizer: &WordPiece,
    threads: usize,
) -> Result<Vec<TokenizedDocument>, DataError> {
    let progress = bar(documents.len(), "tokenizing documents");
    let blocks: Vec<&[Document]> = documents.chunks(BLOCK).collect();
    let next = AtomicUsize::new(0);
    let work = || -> Result<Vec<(usize, Vec<TokenizedDocument>)>, DataError> {
        let mut done = Vec::new();
        loop {
            let b = next.fetch_add(1, Ordering::Relaxed);
            let Some(block) = blocks.get(b) else {
                return Ok(done);
            };
            done.push((b, tokenize_block(block, tokenizer)?));
            progress.inc(block.len() as u64);
        }
    };
    let mut done: Vec<(usize, Vec<TokenizedDocument>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads.clamp(1, blocks.len().max(1)))
            .map(|_| scope.spawn(work))
            .collect();
        let mut all = Vec::with_capacity(blocks.len());
        for handle in handles {
            match handle.join() {
                Ok(part) => all.extend(part?),
                // A panic in the tokenizer is a bug there: pass it on.
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        Ok::<_, DataError>(all)
    })?;
    progress.finish_and_clear();
    done.sort_unstable_by_key(|&(b, _)| b);
    Ok(done.into_iter().flat_map(|(_, block)| block).collect())
}

fn tokenize_block(
    documents: &[Document],
    tokenizer: &WordPiece,
) -> Result<Vec<TokenizedDocument>, DataError> {
    let mut out = Vec::with_capacity(documents.len());
    for document in documents {
        let mut sentences = Vec::with_capacity(document.sentences.len());
        for sentence in &document.sentences {
            let ids = tokenizer.encode_plain(sentence)?.ids;
            if !ids.is_empty() {
                sentences.push(ids);
            }
        }
        if !sentences.is_empty() {
            out.push(sentences);
        }
    }
    Ok(out)
}

/// The special ids and vocabulary size `tokenizer` gives the masking.
pub fn masking_vocab(tokenizer: &WordPiece) -> MaskingVocab {
    let special = tokenizer.special();
    MaskingVocab {
        cls: special.cls,
        sep: special.sep,
        mask: special.mask,
        size: tokenizer.vocab_size() as u32,
    }
}

/// All examples of a tokenized corpus, in their final (shuffled) order.
pub fn create_examples(
    documents: &[TokenizedDocument],
    config: &PretrainConfig,
    vocab: MaskingVocab,
) -> Result<Vec<PretrainExample>, DataError> {
    config.validate()?;
    let mut rng = SplitMix64::new(config.seed);
    let mut order: Vec<usize> = (0..documents.len()).collect();
    rng.shuffle(&mut order);
    let shuffled: Vec<TokenizedDocument> = order.iter().map(|&i| documents[i].clone()).collect();
    let settings = InstanceSettings {
        max_seq: config.max_seq,
        max_predictions: config.max_predictions,
        masked_lm_prob: config.masked_lm_prob,
        short_seq_prob: config.short_seq_prob,
        vocab,
    };
    let progress = bar(config.dupe_factor * shuffled.len(), "creating examples");
    let mut examples = Vec::new();
    for _ in 0..config.dupe_factor {
        for index in 0..shuffled.len() {
            examples.extend(instances_from_document(
                &shuffled, index, &settings, &mut rng,
            ));
            progress.inc(1);
        }
    }
    progress.finish_and_clear();
    rng.shuffle(&mut examples);
    Ok(examples)
}

/// Makes the examples of `documents` and writes them as `num_shards` shard
/// files `pretrain-NNNNN-of-MMMMM.shard` plus `pretrain.json` into `out_dir`.
pub fn build_shards(
    documents: &[Document],
    tokenizer: &WordPiece,
    config: &PretrainConfig,
    out_dir: &Path,
    num_shards: usize,
) -> Result<BuildSummary, DataError> {
    config.validate()?;
    if num_shards == 0 {
        return Err(DataError::Config {
            config: "pretrain",
            detail: "num_shards must be at least 1".into(),
        });
    }
    let tokenized = tokenize_documents(documents, tokenizer)?;
    let vocab = masking_vocab(tokenizer);
    let examples = create_examples(&tokenized, config, vocab)?;
    std::fs::create_dir_all(out_dir).map_err(|source| DataError::Io {
        path: out_dir.to_path_buf(),
        source,
    })?;
    let mut shards = Vec::with_capacity(num_shards);
    for s in 0..num_shards {
        let part: Vec<PretrainExample> = examples
            .iter()
            .skip(s)
            .step_by(num_shards)
            .cloned()
            .collect();
        let name = format!("pretrain-{s:05}-of-{num_shards:05}.shard");
        write_shard(
            &out_dir.join(&name),
            &part,
            config.max_seq,
            config.max_predictions,
            vocab.size,
        )?;
        shards.push((name, part.len()));
    }
    let summary = BuildSummary {
        config: config.clone(),
        documents: tokenized.len(),
        sentences: tokenized.iter().map(Vec::len).sum(),
        tokens: tokenized.iter().flatten().map(Vec::len).sum(),
        examples: examples.len(),
        shards,
        vocab_size: vocab.size,
    };
    let json = serde_json::to_string_pretty(&summary).expect("serializable");
    let path = out_dir.join("pretrain.json");
    std::fs::write(&path, json).map_err(|source| DataError::Io { path, source })?;
    Ok(summary)
}
