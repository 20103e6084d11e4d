//! BERT (Devlin et al.), Post-LN and Pre-LN, every preset from tiny to the
//! SLAMB xlarge, with the pre-training, span-QA and classification heads,
//! laid out as HuggingFace lays it out so that weights map one to one.

mod config;
mod embeddings;
mod heads;
mod hf;
mod hf_labels;
mod layer;
mod model;

pub use config::{BertConfig, BertPreset, LayerNormPlacement};
pub use embeddings::BertEmbeddings;
pub use heads::{
    BertForPreTraining, BertForQuestionAnswering, BertForSequenceClassification,
    BertLmPredictionHead, BertPreTrainingHeads, BertPredictionTransform, PreTrainingOutput,
};
pub use hf::{
    HfBert, HfLoadReport, classifier_config_keys, export_in_bf16, load_hf, save_hf,
    save_hf_with_head,
};
pub use hf_labels::load_hf_labelled;
pub use layer::{BertAttention, BertIntermediate, BertLayer, BertResidual, BertSelfAttention};
pub use model::{BertEncoder, BertInput, BertModel, BertOutput, BertPooler};
