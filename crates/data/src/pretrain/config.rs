//! The settings of BERT's pre-training example creation, with the defaults
//! of Google's `create_pretraining_data.py` (Devlin et al. 2019, §A.2).

use serde::{Deserialize, Serialize};

use crate::DataError;

/// How examples are made from a corpus.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PretrainConfig {
    /// Tokens per example, `[CLS]` and both `[SEP]` included (128 in phase 1,
    /// 512 in phase 2).
    #[serde(default = "default_max_seq")]
    pub max_seq: usize,
    /// Most masked positions per example (20 for 128, 80 for 512).
    #[serde(default = "default_max_predictions")]
    pub max_predictions: usize,
    /// Share of tokens masked.
    #[serde(default = "default_masked_lm_prob")]
    pub masked_lm_prob: f64,
    /// Probability of a shorter target length, so the model also sees short
    /// sequences.
    #[serde(default = "default_short_seq_prob")]
    pub short_seq_prob: f64,
    /// How many times the corpus is turned into examples, each time with
    /// other masks and pairings.
    #[serde(default = "default_dupe_factor")]
    pub dupe_factor: usize,
    /// The seed of every random choice.
    #[serde(default)]
    pub seed: u64,
}

fn default_max_seq() -> usize {
    128
}
fn default_max_predictions() -> usize {
    20
}
fn default_masked_lm_prob() -> f64 {
    0.15
}
fn default_short_seq_prob() -> f64 {
    0.1
}
fn default_dupe_factor() -> usize {
    5
}

impl Default for PretrainConfig {
    fn default() -> Self {
        Self {
            max_seq: default_max_seq(),
            max_predictions: default_max_predictions(),
            masked_lm_prob: default_masked_lm_prob(),
            short_seq_prob: default_short_seq_prob(),
            dupe_factor: default_dupe_factor(),
            seed: 0,
        }
    }
}

impl PretrainConfig {
    /// BERT's phase-2 setting: 512 tokens, 80 predictions.
    pub fn seq512() -> Self {
        Self {
            max_seq: 512,
            max_predictions: 80,
            ..Self::default()
        }
    }

    /// Checks every field and the rules between them.
    pub fn validate(&self) -> Result<(), DataError> {
        let bad = |detail: String| {
            Err(DataError::Config {
                config: "pretrain",
                detail,
            })
        };
        if !(8..=65_535).contains(&self.max_seq) {
            return bad(format!("max_seq = {} must be in 8..=65535", self.max_seq));
        }
        if self.max_predictions == 0 || self.max_predictions > self.max_seq - 3 {
            return bad(format!(
                "max_predictions = {} must be in 1..={} (max_seq − 3)",
                self.max_predictions,
                self.max_seq - 3
            ));
        }
        for (name, p) in [
            ("masked_lm_prob", self.masked_lm_prob),
            ("short_seq_prob", self.short_seq_prob),
        ] {
            if !(0.0..=1.0).contains(&p) {
                return bad(format!("{name} = {p} must be in [0, 1]"));
            }
        }
        if self.dupe_factor == 0 {
            return bad("dupe_factor must be at least 1".into());
        }
        Ok(())
    }
}
