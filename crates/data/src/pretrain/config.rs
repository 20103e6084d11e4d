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

    /// The defaults for sequences of `max_seq` tokens, validated: BERT's
    /// 20 predictions for 128 and 80 for 512 (a little above 15%, so that
    /// rounding never caps a full sequence), else `⌈0.15 · max_seq⌉`.
    pub fn for_max_seq(max_seq: usize, seed: u64) -> Result<Self, DataError> {
        let max_predictions = match max_seq {
            128 => 20,
            512 => 80,
            n => (n as f64 * default_masked_lm_prob()).ceil() as usize,
        };
        let config = Self {
            max_seq,
            max_predictions,
            seed,
            ..Self::default()
        };
        config.validate()?;
        Ok(config)
    }

    /// A configuration from JSON (missing fields take their defaults,
    /// unknown ones are refused), validated.
    pub fn from_json(json: &str) -> Result<Self, DataError> {
        let config: Self = serde_json::from_str(json).map_err(|e| DataError::Config {
            config: "pretrain",
            detail: format!("line {}, column {}: {e}", e.line(), e.column()),
        })?;
        config.validate()?;
        Ok(config)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn error(config: &PretrainConfig) -> String {
        config.validate().unwrap_err().to_string()
    }

    #[test]
    fn defaults_are_google_s() {
        // create_pretraining_data.py's flags: max_seq_length 128,
        // max_predictions_per_seq 20, masked_lm_prob 0.15,
        // short_seq_prob 0.1, dupe_factor 10 upstream; 5 here, as BERT's
        // README uses for its example run.
        let c = PretrainConfig::from_json("{}").unwrap();
        assert_eq!(c, PretrainConfig::default());
        assert_eq!((c.max_seq, c.max_predictions, c.dupe_factor), (128, 20, 5));
        assert_eq!((c.masked_lm_prob, c.short_seq_prob), (0.15, 0.1));
        let long = PretrainConfig::for_max_seq(512, 3).unwrap();
        assert_eq!(
            long,
            PretrainConfig {
                seed: 3,
                ..PretrainConfig::seq512()
            }
        );
        // ⌈0.15 · 64⌉ = ⌈9.6⌉ = 10; ⌈0.15 · 8⌉ = ⌈1.2⌉ = 2.
        assert_eq!(
            PretrainConfig::for_max_seq(64, 0).unwrap().max_predictions,
            10
        );
        assert_eq!(
            PretrainConfig::for_max_seq(8, 0).unwrap().max_predictions,
            2
        );
    }

    #[test]
    fn bad_values_are_refused_with_the_rule_they_break() {
        let base = PretrainConfig::default();
        let e = PretrainConfig::for_max_seq(7, 0).unwrap_err().to_string();
        assert_eq!(e, "pretrain: max_seq = 7 must be in 8..=65535");
        let e = error(&PretrainConfig {
            max_predictions: 126,
            ..base.clone()
        });
        assert_eq!(
            e,
            "pretrain: max_predictions = 126 must be in 1..=125 (max_seq − 3)"
        );
        let e = error(&PretrainConfig {
            masked_lm_prob: 1.5,
            ..base.clone()
        });
        assert_eq!(e, "pretrain: masked_lm_prob = 1.5 must be in [0, 1]");
        let e = error(&PretrainConfig {
            short_seq_prob: f64::NAN,
            ..base.clone()
        });
        assert_eq!(e, "pretrain: short_seq_prob = NaN must be in [0, 1]");
        let e = error(&PretrainConfig {
            dupe_factor: 0,
            ..base
        });
        assert_eq!(e, "pretrain: dupe_factor must be at least 1");
        let e = PretrainConfig::from_json(r#"{"max_seq": 128, "mask_prob": 0.2}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `mask_prob`"), "{e}");
        let e = PretrainConfig::from_json(r#"{"max_seq": 4}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("max_seq = 4"), "{e}");
    }
}
