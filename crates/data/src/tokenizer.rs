//! BERT's WordPiece tokenizer through the `tokenizers` crate, with terse in
//! control of truncation and padding (the shipped `tokenizer.json` of the
//! MiniLM has both built in: they are turned off here, because SQuAD's
//! sliding window and the pre-training packer decide lengths themselves).
//! Offsets are character offsets into the input text, as SQuAD's answer
//! starts are.

use std::path::Path;

use tokenizers::models::wordpiece::WordPiece as WordPieceModel;
use tokenizers::normalizers::BertNormalizer;
use tokenizers::pre_tokenizers::bert::BertPreTokenizer;
use tokenizers::processors::bert::BertProcessing;
use tokenizers::{EncodeInput, Tokenizer};

use crate::DataError;

/// One encoded text or text pair.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Encoding {
    /// Token ids.
    pub ids: Vec<u32>,
    /// Segment of each token: 0 for the first text (and `[CLS]`), 1 for the second.
    pub type_ids: Vec<u32>,
    /// The tokens as strings (`##` marks a continuation piece).
    pub tokens: Vec<String>,
    /// `(start, end)` character offsets of each token in its own text;
    /// `(0, 0)` for special tokens.
    pub offsets: Vec<(usize, usize)>,
    /// Which text each token came from (`None` for special tokens).
    pub sequence: Vec<Option<usize>>,
}

impl Encoding {
    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether there are no tokens.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    fn from_tokenizers(e: tokenizers::Encoding) -> Self {
        Encoding {
            ids: e.get_ids().to_vec(),
            type_ids: e.get_type_ids().to_vec(),
            tokens: e.get_tokens().to_vec(),
            offsets: e.get_offsets().to_vec(),
            sequence: e.get_sequence_ids(),
        }
    }
}

/// The ids of BERT's special tokens in a vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecialIds {
    /// `[PAD]`.
    pub pad: u32,
    /// `[UNK]`.
    pub unk: u32,
    /// `[CLS]`.
    pub cls: u32,
    /// `[SEP]`.
    pub sep: u32,
    /// `[MASK]`.
    pub mask: u32,
}

/// A BERT WordPiece tokenizer.
pub struct WordPiece {
    inner: Tokenizer,
    special: SpecialIds,
    path: std::path::PathBuf,
}

impl std::fmt::Debug for WordPiece {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WordPiece")
            .field("path", &self.path)
            .field("vocab_size", &self.vocab_size())
            .field("special", &self.special)
            .finish()
    }
}

impl WordPiece {
    /// From a HuggingFace `tokenizer.json`, with its truncation and padding
    /// turned off.
    pub fn from_tokenizer_json(path: &Path) -> Result<Self, DataError> {
        let mut inner = Tokenizer::from_file(path).map_err(|e| DataError::Format {
            path: path.to_path_buf(),
            detail: e.to_string(),
        })?;
        inner.with_truncation(None).map_err(|e| DataError::Format {
            path: path.to_path_buf(),
            detail: e.to_string(),
        })?;
        inner.with_padding(None);
        Self::new(inner, path)
    }

    /// From a `vocab.txt` (one token per line), with BERT's normaliser
    /// (`lowercase`, which also strips accents, as the uncased models do),
    /// pre-tokeniser and `[CLS] a [SEP] b [SEP]` template.
    pub fn from_vocab(path: &Path, lowercase: bool) -> Result<Self, DataError> {
        let vocab = path.to_str().ok_or_else(|| DataError::Format {
            path: path.to_path_buf(),
            detail: "the path is not UTF-8".to_string(),
        })?;
        let model = WordPieceModel::from_file(vocab)
            .unk_token("[UNK]".to_string())
            .build()
            .map_err(|e| DataError::Format {
                path: path.to_path_buf(),
                detail: e.to_string(),
            })?;
        let mut inner = Tokenizer::new(model);
        inner.with_normalizer(Some(BertNormalizer::new(true, true, None, lowercase)));
        inner.with_pre_tokenizer(Some(BertPreTokenizer));
        let id = |token: &str| {
            inner.token_to_id(token).ok_or_else(|| DataError::Format {
                path: path.to_path_buf(),
                detail: format!("no {token} in the vocabulary"),
            })
        };
        let (sep, cls) = (id("[SEP]")?, id("[CLS]")?);
        inner.with_post_processor(Some(BertProcessing::new(
            ("[SEP]".to_string(), sep),
            ("[CLS]".to_string(), cls),
        )));
        Self::new(inner, path)
    }

    fn new(inner: Tokenizer, path: &Path) -> Result<Self, DataError> {
        let id = |token: &str| {
            inner.token_to_id(token).ok_or_else(|| DataError::Format {
                path: path.to_path_buf(),
                detail: format!("no {token} in the vocabulary"),
            })
        };
        let special = SpecialIds {
            pad: id("[PAD]")?,
            unk: id("[UNK]")?,
            cls: id("[CLS]")?,
            sep: id("[SEP]")?,
            mask: id("[MASK]")?,
        };
        Ok(WordPiece {
            inner,
            special,
            path: path.to_path_buf(),
        })
    }

    /// SHA-256 of the whole tokenizer as `tokenizers` serialises it
    /// (vocabulary, normaliser and its settings, pre-tokeniser, template):
    /// what decides every encoding, whichever file it was made from.
    pub fn fingerprint(&self) -> Result<String, DataError> {
        let json = self.inner.to_string(false).map_err(|e| DataError::Format {
            path: self.path.clone(),
            detail: format!("serialising the tokenizer: {e}"),
        })?;
        Ok(crate::fetch::sha256_bytes(json.as_bytes()))
    }

    /// The special tokens' ids.
    pub fn special(&self) -> SpecialIds {
        self.special
    }

    /// Vocabulary size (including added tokens).
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// A token's id.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// An id's token.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    fn run(&self, input: EncodeInput<'_>, special: bool) -> Result<Encoding, DataError> {
        self.inner
            .encode_char_offsets(input, special)
            .map(Encoding::from_tokenizers)
            .map_err(|e| DataError::Format {
                path: self.path.clone(),
                detail: format!("encoding failed: {e}"),
            })
    }

    /// `[CLS] text [SEP]`, never truncated or padded.
    pub fn encode(&self, text: &str) -> Result<Encoding, DataError> {
        self.run(text.into(), true)
    }

    /// `[CLS] first [SEP] second [SEP]` with token types 0 then 1.
    pub fn encode_pair(&self, first: &str, second: &str) -> Result<Encoding, DataError> {
        self.run((first, second).into(), true)
    }

    /// The WordPiece tokens of `text` alone, without special tokens (for
    /// callers that assemble their own windows, like SQuAD's doc stride).
    pub fn encode_plain(&self, text: &str) -> Result<Encoding, DataError> {
        self.run(text.into(), false)
    }
}
