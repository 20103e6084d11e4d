//! Where a fine-tuning run's BERT comes from: the pretrained MiniLM of
//! DATA.md, a HuggingFace-layout directory (a terse pre-training run's
//! `export/`, or any `BertModel` checkpoint), or random weights of the
//! config's `[model]`. The tokenizer travels with the weights when the
//! directory has one, else it is MiniLM's (the vocabulary terse pre-trains
//! with).

use std::path::PathBuf;

use terse_data::{minilm, minilm_tokenizer};
use terse_models::ModelConfig;
use terse_models::bert::{BertConfig, HfBert, load_hf};

use crate::{Init, TrainError};

/// Resolved weights: the architecture, the file (none: random) and the
/// tokenizer.
pub(crate) struct Weights {
    pub config: BertConfig,
    pub file: Option<PathBuf>,
    pub tokenizer: PathBuf,
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
                    tokenizer: files.tokenizer,
                })
            }
            Init::Path(dir) => {
                architecture_from_weights("model")?;
                let own = dir.join("tokenizer.json");
                Ok(Self {
                    config: BertConfig::from_hf_json(&dir.join("config.json"))?,
                    file: Some(dir.join("model.safetensors")),
                    tokenizer: if own.exists() {
                        own
                    } else {
                        minilm_tokenizer()?
                    },
                })
            }
            Init::Random => match model {
                Some(ModelConfig::Bert(config)) => Ok(Self {
                    config: config.clone(),
                    file: None,
                    tokenizer: minilm_tokenizer()?,
                }),
                _ => Err(TrainError::InvalidRun {
                    field: "model",
                    reason: "init = \"random\" needs a [model] with kind = \"bert\"".into(),
                }),
            },
        }
    }

    /// `model` with the encoder (and any matching head) loaded into it; an
    /// encoder tensor the file lacks is an error, a head it lacks starts
    /// fresh.
    pub fn loaded<M: HfBert>(&self, mut model: M) -> Result<M, TrainError> {
        let Some(file) = &self.file else {
            return Ok(model);
        };
        let report = load_hf(&mut model, file)?;
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
