//! Where a fine-tuning run's BERT comes from: the pretrained MiniLM of
//! DATA.md, a HuggingFace-layout directory (a terse pre-training run's
//! `export/`, or any `BertModel` checkpoint), or random weights of the
//! config's `[model]`. A directory's tokenizer travels with its weights:
//! its `tokenizer.json`, else its `vocab.txt` (what `save_pretrained` of a
//! BERT tokenizer writes, casing in `tokenizer_config.json`); one with
//! neither is refused, since its token ids mean nothing under another
//! vocabulary. MiniLM and random weights use MiniLM's tokenizer (the
//! vocabulary terse pre-trains with).

use std::path::{Path, PathBuf};

use terse_data::{DataError, WordPiece, minilm, minilm_tokenizer};
use terse_models::ModelConfig;
use terse_models::bert::{BertConfig, HfBert, load_hf_labelled};

use super::export::{copy_as, copy_tokenizer};
use crate::{Init, TrainError};

/// Resolved weights: the architecture, the file (none: random) and the
/// tokenizer.
pub(crate) struct Weights {
    pub config: BertConfig,
    pub file: Option<PathBuf>,
    pub tokenizer: TokenizerFile,
}

/// The file a run's tokenizer is made from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TokenizerFile {
    /// A HuggingFace `tokenizer.json` (its normaliser settings inside).
    Json(PathBuf),
    /// A BERT `vocab.txt`, lowercased (and accents stripped) or cased.
    Vocab { path: PathBuf, lowercase: bool },
}

impl TokenizerFile {
    /// The tokenizer of the weights directory `dir`: `tokenizer.json`, else
    /// `vocab.txt` with `do_lower_case` of `tokenizer_config.json` (true
    /// when it is not given, as in HuggingFace's `BertTokenizer`), logged.
    fn of_dir(dir: &Path) -> Result<Self, TrainError> {
        let json = dir.join("tokenizer.json");
        if json.exists() {
            tracing::info!("tokenizer {}", json.display());
            return Ok(Self::Json(json));
        }
        let vocab = dir.join("vocab.txt");
        if !vocab.exists() {
            return Err(TrainError::InvalidRun {
                field: "task.init",
                reason: format!(
                    "{} has neither tokenizer.json nor vocab.txt: its weights need the \
                     vocabulary they were trained with",
                    dir.display()
                ),
            });
        }
        let (lowercase, from) = match do_lower_case(&dir.join("tokenizer_config.json"))? {
            Some(lowercase) => (lowercase, "do_lower_case of tokenizer_config.json"),
            None => (true, "BertTokenizer's default"),
        };
        let casing = if lowercase { "lowercased" } else { "cased" };
        tracing::info!("tokenizer {} ({casing}: {from})", vocab.display());
        Ok(Self::Vocab {
            path: vocab,
            lowercase,
        })
    }

    /// The file, for messages.
    pub fn path(&self) -> &Path {
        match self {
            Self::Json(path) | Self::Vocab { path, .. } => path.as_path(),
        }
    }

    /// The tokenizer.
    pub fn load(&self) -> Result<WordPiece, TrainError> {
        Ok(match self {
            Self::Json(path) => WordPiece::from_tokenizer_json(path)?,
            Self::Vocab { path, lowercase } => WordPiece::from_vocab(path, *lowercase)?,
        })
    }

    /// Copies the tokenizer into the export directory `dir`, so that `--from
    /// DIR` and `AutoTokenizer.from_pretrained(DIR)` tokenize as training
    /// did: a `tokenizer.json` as one, a `vocab.txt` as one with the
    /// `tokenizer_config.json` beside it (its `do_lower_case` chose the
    /// casing) when there is one.
    pub fn export(&self, dir: &Path) -> Result<(), TrainError> {
        match self {
            Self::Json(path) => copy_tokenizer(path, dir),
            Self::Vocab { path, .. } => {
                copy_as(path, dir, "vocab.txt")?;
                let config = path.with_file_name("tokenizer_config.json");
                if config.exists() {
                    copy_as(&config, dir, "tokenizer_config.json")?;
                }
                Ok(())
            }
        }
    }
}

/// `do_lower_case` of a `tokenizer_config.json`: none when the file does
/// not exist or does not set it.
fn do_lower_case(path: &Path) -> Result<Option<bool>, TrainError> {
    if !path.exists() {
        return Ok(None);
    }
    let bad = |detail: String| DataError::Format {
        path: path.to_path_buf(),
        detail,
    };
    let text = std::fs::read_to_string(path).map_err(|source| DataError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    match json.get("do_lower_case") {
        None => Ok(None),
        Some(serde_json::Value::Bool(lowercase)) => Ok(Some(*lowercase)),
        Some(other) => Err(bad(format!("do_lower_case is {other}, not true or false")).into()),
    }
}

impl Weights {
    pub fn resolve(init: &Init, model: Option<&ModelConfig>) -> Result<Self, TrainError> {
        let architecture_from_weights = |field: &'static str| {
            if model.is_some() {
                Err(TrainError::InvalidRun {
                    field,
                    reason: "pretrained weights bring their own architecture \
                             (config.json): remove [model]"
                        .into(),
                })
            } else {
                Ok(())
            }
        };
        match init {
            Init::Minilm => {
                architecture_from_weights("model")?;
                let files = minilm()?;
                Ok(Self {
                    config: BertConfig::from_hf_json(&files.config)?,
                    file: Some(files.model),
                    tokenizer: TokenizerFile::Json(files.tokenizer),
                })
            }
            Init::Path(dir) => {
                architecture_from_weights("model")?;
                Ok(Self {
                    config: BertConfig::from_hf_json(&dir.join("config.json"))?,
                    file: Some(dir.join("model.safetensors")),
                    tokenizer: TokenizerFile::of_dir(dir)?,
                })
            }
            Init::Random => match model {
                Some(ModelConfig::Bert(config)) => Ok(Self {
                    config: config.clone(),
                    file: None,
                    tokenizer: TokenizerFile::Json(minilm_tokenizer()?),
                }),
                _ => Err(TrainError::InvalidRun {
                    field: "model",
                    reason: "init = \"random\" needs a [model] with kind = \"bert\"".into(),
                }),
            },
        }
    }

    /// Refuses, before any example is encoded, a `tokenizer` with ids the
    /// model has no embedding row for and sequences of `max_seq` tokens
    /// longer than its position embeddings: either would fail only in the
    /// first forward pass, after the data was read and encoded.
    pub fn check_fits(&self, tokenizer: &WordPiece, max_seq: usize) -> Result<(), TrainError> {
        let (vocab, entries) = (self.config.vocab_size, tokenizer.vocab_size());
        if entries > vocab {
            return Err(TrainError::InvalidRun {
                // Random weights take vocab_size from [model], others from
                // their config.json.
                field: if self.file.is_some() {
                    "task.init"
                } else {
                    "model.vocab_size"
                },
                reason: format!(
                    "the model's vocab_size is {vocab} but the WordPiece vocabulary {} has \
                     {entries} entries",
                    self.tokenizer.path().display()
                ),
            });
        }
        let positions = self.config.max_position_embeddings;
        if max_seq > positions {
            return Err(TrainError::InvalidRun {
                field: "task.max_seq",
                reason: format!("{max_seq} exceeds the model's {positions} positions"),
            });
        }
        Ok(())
    }

    /// `model` with the encoder (and any matching head) loaded into it; an
    /// encoder tensor the file lacks is an error, a head it lacks starts
    /// fresh. `labels` are the task's class names by index (none for
    /// regression or a head without classes): a classifier's head is put in
    /// their order by the names its `config.json` gives it, since another
    /// framework's order is not terse's.
    pub fn loaded<M: HfBert>(&self, mut model: M, labels: &[&str]) -> Result<M, TrainError> {
        let Some(file) = &self.file else {
            return Ok(model);
        };
        let report = load_hf_labelled(&mut model, file, labels)?;
        let missing: Vec<&str> = report
            .missing_encoder(M::ENCODER_PREFIX)
            .into_iter()
            .filter(|m| !m.contains("pooler."))
            .collect();
        if !missing.is_empty() {
            return Err(TrainError::InvalidRun {
                field: "task.init",
                reason: format!("{} lacks encoder tensors {missing:?}", file.display()),
            });
        }
        Ok(model)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BERT vocabulary with a cased and an uncased `hello`: which one
    /// `Hello` becomes tells the casing.
    const VOCAB: &str = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nHello\nhello\nworld\n";

    fn write(dir: &Path, name: &str, content: &str) {
        std::fs::write(dir.join(name), content).unwrap();
    }

    fn tokens(file: &TokenizerFile, text: &str) -> Vec<String> {
        file.load().unwrap().encode(text).unwrap().tokens
    }

    #[test]
    fn a_directory_without_tokenizer_json_uses_its_vocab_txt() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "vocab.txt", VOCAB);
        write(
            dir.path(),
            "tokenizer_config.json",
            r#"{"do_lower_case": false, "model_max_length": 512}"#,
        );
        let cased = TokenizerFile::of_dir(dir.path()).unwrap();
        assert_eq!(
            cased,
            TokenizerFile::Vocab {
                path: dir.path().join("vocab.txt"),
                lowercase: false
            }
        );
        assert_eq!(cased.load().unwrap().vocab_size(), 8);
        assert_eq!(
            tokens(&cased, "Hello world"),
            ["[CLS]", "Hello", "world", "[SEP]"]
        );
        // Without do_lower_case: lowercased, as HuggingFace's BertTokenizer.
        write(dir.path(), "tokenizer_config.json", "{}");
        let uncased = TokenizerFile::of_dir(dir.path()).unwrap();
        assert_eq!(
            tokens(&uncased, "Hello world"),
            ["[CLS]", "hello", "world", "[SEP]"]
        );
        std::fs::remove_file(dir.path().join("tokenizer_config.json")).unwrap();
        assert_eq!(TokenizerFile::of_dir(dir.path()).unwrap(), uncased);
        // A tokenizer.json beside it is the one used.
        write(dir.path(), "tokenizer.json", "{}");
        assert_eq!(
            TokenizerFile::of_dir(dir.path()).unwrap(),
            TokenizerFile::Json(dir.path().join("tokenizer.json"))
        );
    }

    #[test]
    fn a_directory_without_a_tokenizer_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let e = TokenizerFile::of_dir(dir.path()).unwrap_err().to_string();
        assert!(
            e.contains(&format!(
                "{} has neither tokenizer.json nor vocab.txt",
                dir.path().display()
            )),
            "{e}"
        );
        write(dir.path(), "vocab.txt", VOCAB);
        write(
            dir.path(),
            "tokenizer_config.json",
            r#"{"do_lower_case": "no"}"#,
        );
        let e = TokenizerFile::of_dir(dir.path()).unwrap_err().to_string();
        assert!(
            e.ends_with("tokenizer_config.json: do_lower_case is \"no\", not true or false"),
            "{e}"
        );
    }

    #[test]
    fn a_tokenizer_or_max_seq_past_the_model_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "vocab.txt", VOCAB);
        let file = TokenizerFile::of_dir(dir.path()).unwrap();
        let tokenizer = file.load().unwrap();
        let weights = |vocab_size: usize, random: bool| Weights {
            config: BertConfig {
                vocab_size,
                max_position_embeddings: 16,
                ..BertConfig::default()
            },
            file: (!random).then(|| dir.path().join("model.safetensors")),
            tokenizer: file.clone(),
        };
        let e = weights(7, false)
            .check_fits(&tokenizer, 16)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            format!(
                "invalid run setting `task.init`: the model's vocab_size is 7 but the WordPiece \
                 vocabulary {} has 8 entries",
                dir.path().join("vocab.txt").display()
            )
        );
        let e = weights(7, true).check_fits(&tokenizer, 16).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("invalid run setting `model.vocab_size`: "),
            "{e}"
        );
        // A vocabulary smaller than the embedding is fine.
        weights(9, false).check_fits(&tokenizer, 16).unwrap();
        let e = weights(8, false)
            .check_fits(&tokenizer, 17)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "invalid run setting `task.max_seq`: 17 exceeds the model's 16 positions"
        );
    }
}
