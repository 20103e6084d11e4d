//! BERT's hyper-parameters, the presets (tiny to the SLAMB xlarge), and the
//! HuggingFace `config.json` they map to.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::ModelError;

/// Where each residual block's LayerNorm sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LayerNormPlacement {
    /// After the residual sum (the original BERT, HuggingFace's).
    #[default]
    Post,
    /// Before each sub-layer, with a final LayerNorm after the last layer
    /// (the Pre-LN BERT 1-bit LAMB trains).
    Pre,
}

/// The published BERT sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BertPreset {
    /// L2 H128 A2.
    Tiny,
    /// L4 H256 A4.
    Mini,
    /// L4 H512 A8.
    Small,
    /// L8 H512 A8.
    Medium,
    /// L12 H768 A12.
    Base,
    /// L24 H1024 A16.
    Large,
    /// L24 H3072 A16, intermediate 12288 (SLAMB's Table 8).
    Xlarge,
}

impl BertPreset {
    /// Every preset, smallest first.
    pub const ALL: [BertPreset; 7] = [
        BertPreset::Tiny,
        BertPreset::Mini,
        BertPreset::Small,
        BertPreset::Medium,
        BertPreset::Base,
        BertPreset::Large,
        BertPreset::Xlarge,
    ];

    /// The preset's name in configs (`tiny`, …, `xlarge`).
    pub fn name(self) -> &'static str {
        match self {
            BertPreset::Tiny => "tiny",
            BertPreset::Mini => "mini",
            BertPreset::Small => "small",
            BertPreset::Medium => "medium",
            BertPreset::Base => "base",
            BertPreset::Large => "large",
            BertPreset::Xlarge => "xlarge",
        }
    }

    /// The full config (uncased vocabulary, 512 positions, dropout 0.1).
    pub fn config(self) -> BertConfig {
        let (layers, hidden, heads, intermediate) = match self {
            BertPreset::Tiny => (2, 128, 2, 512),
            BertPreset::Mini => (4, 256, 4, 1024),
            BertPreset::Small => (4, 512, 8, 2048),
            BertPreset::Medium => (8, 512, 8, 2048),
            BertPreset::Base => (12, 768, 12, 3072),
            BertPreset::Large => (24, 1024, 16, 4096),
            BertPreset::Xlarge => (24, 3072, 16, 12288),
        };
        BertConfig {
            num_hidden_layers: layers,
            hidden_size: hidden,
            num_attention_heads: heads,
            intermediate_size: intermediate,
            ..BertConfig::base()
        }
    }
}

/// BERT's hyper-parameters, named as in HuggingFace's `config.json`.
///
/// In a TOML config, `preset = "large"` starts from a preset and any field
/// given next to it overrides it; without a preset, the base sizes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(from = "BertSpec")]
pub struct BertConfig {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Width of every layer.
    pub hidden_size: usize,
    /// Transformer layers.
    pub num_hidden_layers: usize,
    /// Attention heads (must divide `hidden_size`).
    pub num_attention_heads: usize,
    /// Width of the feed-forward block.
    pub intermediate_size: usize,
    /// Longest sequence.
    pub max_position_embeddings: usize,
    /// Segment types.
    pub type_vocab_size: usize,
    /// Dropout after embeddings and every sub-layer.
    pub hidden_dropout_prob: f64,
    /// Dropout on the attention probabilities.
    pub attention_probs_dropout_prob: f64,
    /// LayerNorm ε.
    pub layer_norm_eps: f64,
    /// Standard deviation of the initial weights.
    pub initializer_range: f64,
    /// Post-LN (HuggingFace) or Pre-LN.
    pub layer_norm: LayerNormPlacement,
    /// Whether the model has the `[CLS]` pooler (tanh dense layer).
    pub pooler: bool,
}

impl Default for BertConfig {
    fn default() -> Self {
        Self::base()
    }
}

/// The TOML form: an optional preset and optional overrides.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct BertSpec {
    preset: Option<BertPreset>,
    vocab_size: Option<usize>,
    hidden_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    num_attention_heads: Option<usize>,
    intermediate_size: Option<usize>,
    max_position_embeddings: Option<usize>,
    type_vocab_size: Option<usize>,
    hidden_dropout_prob: Option<f64>,
    attention_probs_dropout_prob: Option<f64>,
    layer_norm_eps: Option<f64>,
    initializer_range: Option<f64>,
    layer_norm: Option<LayerNormPlacement>,
    pooler: Option<bool>,
}

impl From<BertSpec> for BertConfig {
    fn from(s: BertSpec) -> Self {
        let d = s.preset.unwrap_or(BertPreset::Base).config();
        BertConfig {
            vocab_size: s.vocab_size.unwrap_or(d.vocab_size),
            hidden_size: s.hidden_size.unwrap_or(d.hidden_size),
            num_hidden_layers: s.num_hidden_layers.unwrap_or(d.num_hidden_layers),
            num_attention_heads: s.num_attention_heads.unwrap_or(d.num_attention_heads),
            intermediate_size: s.intermediate_size.unwrap_or(d.intermediate_size),
            max_position_embeddings: s
                .max_position_embeddings
                .unwrap_or(d.max_position_embeddings),
            type_vocab_size: s.type_vocab_size.unwrap_or(d.type_vocab_size),
            hidden_dropout_prob: s.hidden_dropout_prob.unwrap_or(d.hidden_dropout_prob),
            attention_probs_dropout_prob: s
                .attention_probs_dropout_prob
                .unwrap_or(d.attention_probs_dropout_prob),
            layer_norm_eps: s.layer_norm_eps.unwrap_or(d.layer_norm_eps),
            initializer_range: s.initializer_range.unwrap_or(d.initializer_range),
            layer_norm: s.layer_norm.unwrap_or(d.layer_norm),
            pooler: s.pooler.unwrap_or(d.pooler),
        }
    }
}

/// The fields of HuggingFace's `config.json` terse reads; the rest is ignored.
#[derive(Debug, Deserialize)]
struct HfConfig {
    vocab_size: usize,
    hidden_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    intermediate_size: usize,
    max_position_embeddings: usize,
    #[serde(default = "two")]
    type_vocab_size: usize,
    #[serde(default = "tenth")]
    hidden_dropout_prob: f64,
    #[serde(default = "tenth")]
    attention_probs_dropout_prob: f64,
    #[serde(default = "eps")]
    layer_norm_eps: f64,
    #[serde(default = "range")]
    initializer_range: f64,
    #[serde(default = "gelu")]
    hidden_act: String,
    #[serde(default)]
    position_embedding_type: Option<String>,
}

fn two() -> usize {
    2
}
fn tenth() -> f64 {
    0.1
}
fn eps() -> f64 {
    1e-12
}
fn range() -> f64 {
    0.02
}
fn gelu() -> String {
    "gelu".to_string()
}

impl BertConfig {
    /// BERT-base.
    pub fn base() -> Self {
        BertConfig {
            vocab_size: 30522,
            hidden_size: 768,
            num_hidden_layers: 12,
            num_attention_heads: 12,
            intermediate_size: 3072,
            max_position_embeddings: 512,
            type_vocab_size: 2,
            hidden_dropout_prob: 0.1,
            attention_probs_dropout_prob: 0.1,
            layer_norm_eps: 1e-12,
            initializer_range: 0.02,
            layer_norm: LayerNormPlacement::Post,
            pooler: true,
        }
    }

    /// Size of one attention head.
    pub fn head_size(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }

    /// Checks that the sizes fit together, naming the field that does not.
    pub fn validate(&self) -> Result<(), ModelError> {
        let bad = |field: &'static str, reason: String| ModelError::Config { field, reason };
        for (field, value) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("intermediate_size", self.intermediate_size),
            ("max_position_embeddings", self.max_position_embeddings),
            ("type_vocab_size", self.type_vocab_size),
        ] {
            if value == 0 {
                return Err(bad(field, "must be at least 1".into()));
            }
        }
        if !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return Err(bad(
                "num_attention_heads",
                format!(
                    "{} heads do not divide hidden_size {}",
                    self.num_attention_heads, self.hidden_size
                ),
            ));
        }
        for (field, p) in [
            ("hidden_dropout_prob", self.hidden_dropout_prob),
            (
                "attention_probs_dropout_prob",
                self.attention_probs_dropout_prob,
            ),
        ] {
            if !(0.0..1.0).contains(&p) {
                return Err(bad(field, format!("{p} is not in [0, 1)")));
            }
        }
        Ok(())
    }

    /// Reads a HuggingFace `config.json` (a Post-LN BERT with exact GELU and
    /// absolute positions; anything else is refused, naming the field).
    pub fn from_hf_json(path: &Path) -> Result<Self, ModelError> {
        let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let hf: HfConfig = serde_json::from_str(&text).map_err(|e| ModelError::Format {
            path: path.to_path_buf(),
            detail: e.to_string(),
        })?;
        let unsupported = |field: &str, value: &str| ModelError::Format {
            path: path.to_path_buf(),
            detail: format!(
                "{field} = {value:?} is not supported (terse's BERT has exact GELU and absolute positions)"
            ),
        };
        if hf.hidden_act != "gelu" {
            return Err(unsupported("hidden_act", &hf.hidden_act));
        }
        if let Some(kind) = hf.position_embedding_type.as_deref()
            && kind != "absolute"
        {
            return Err(unsupported("position_embedding_type", kind));
        }
        let config = BertConfig {
            vocab_size: hf.vocab_size,
            hidden_size: hf.hidden_size,
            num_hidden_layers: hf.num_hidden_layers,
            num_attention_heads: hf.num_attention_heads,
            intermediate_size: hf.intermediate_size,
            max_position_embeddings: hf.max_position_embeddings,
            type_vocab_size: hf.type_vocab_size,
            hidden_dropout_prob: hf.hidden_dropout_prob,
            attention_probs_dropout_prob: hf.attention_probs_dropout_prob,
            layer_norm_eps: hf.layer_norm_eps,
            initializer_range: hf.initializer_range,
            layer_norm: LayerNormPlacement::Post,
            pooler: true,
        };
        config.validate().map_err(|e| ModelError::Format {
            path: path.to_path_buf(),
            detail: e.to_string(),
        })?;
        Ok(config)
    }

    /// HuggingFace's `config.json` for this config (`architectures` names
    /// the class the weights were saved as).
    pub fn to_hf_json(&self, architecture: &str) -> serde_json::Value {
        serde_json::json!({
            "architectures": [architecture],
            "model_type": "bert",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "intermediate_size": self.intermediate_size,
            "hidden_act": "gelu",
            "hidden_dropout_prob": self.hidden_dropout_prob,
            "attention_probs_dropout_prob": self.attention_probs_dropout_prob,
            "max_position_embeddings": self.max_position_embeddings,
            "type_vocab_size": self.type_vocab_size,
            "initializer_range": self.initializer_range,
            "layer_norm_eps": self.layer_norm_eps,
            "pad_token_id": 0,
            "position_embedding_type": "absolute",
        })
    }
}
