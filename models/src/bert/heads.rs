//! BERT with a task head: pre-training (MLM with the decoder tied to the
//! word embeddings, evaluated only at the masked positions, + NSP), span
//! question answering (SQuAD), and sequence classification or regression
//! (GLUE). Field names follow HuggingFace's classes.

use burn::module::{Module, Param};
use burn::nn::loss::{MseLoss, Reduction};
use burn::nn::{Dropout, DropoutConfig, LayerNorm, Linear};
use burn::tensor::{Device, Int, Tensor};
use terse_fused as fused;

use super::layer::{dense, layer_norm};
use super::{BertConfig, BertInput, BertModel};

/// The MLM transform before the tied decoder (HuggingFace
/// `cls.predictions.transform`).
#[derive(Module, Debug)]
pub struct BertPredictionTransform {
    /// hidden → hidden, then GELU.
    pub dense: Linear,
    /// HuggingFace `LayerNorm`.
    pub layer_norm: LayerNorm,
    layer_norm_eps: f64,
}

/// The MLM head (HuggingFace `cls.predictions`): the decoder weight is the
/// word-embedding table, only the output bias is its own.
#[derive(Module, Debug)]
pub struct BertLmPredictionHead {
    /// The transform.
    pub transform: BertPredictionTransform,
    /// Per-token output bias `[vocab]`.
    pub bias: Param<Tensor<1>>,
}

/// HuggingFace `cls`.
#[derive(Module, Debug)]
pub struct BertPreTrainingHeads {
    /// MLM.
    pub predictions: BertLmPredictionHead,
    /// NSP: pooled → 2 logits (is-next, random).
    pub seq_relationship: Linear,
}

/// BERT with the MLM and NSP heads (HuggingFace `BertForPreTraining`).
#[derive(Module, Debug)]
pub struct BertForPreTraining {
    /// The encoder (with its pooler, which NSP reads).
    pub bert: BertModel,
    /// The heads.
    pub cls: BertPreTrainingHeads,
}

/// Pre-training logits.
#[derive(Debug, Clone)]
pub struct PreTrainingOutput {
    /// Vocabulary logits at the masked positions `[masked, vocab]`.
    pub mlm_logits: Tensor<2>,
    /// NSP logits `[batch, 2]`.
    pub nsp_logits: Tensor<2>,
}

impl BertForPreTraining {
    /// A fresh model (the config's pooler is forced on: NSP needs it).
    pub fn new(config: &BertConfig, device: &Device) -> Self {
        let config = BertConfig {
            pooler: true,
            ..config.clone()
        };
        let h = config.hidden_size;
        BertForPreTraining {
            bert: config.init(device),
            cls: BertPreTrainingHeads {
                predictions: BertLmPredictionHead {
                    transform: BertPredictionTransform {
                        dense: dense(&config, h, h, device),
                        layer_norm: layer_norm(&config, device),
                        layer_norm_eps: config.layer_norm_eps,
                    },
                    bias: Param::from_tensor(Tensor::zeros([config.vocab_size], device)),
                },
                seq_relationship: dense(&config, h, 2, device),
            },
        }
    }

    /// `masked` holds flat positions `b·seq + t` `[masked]`; the MLM logits
    /// are computed only there (the decoder is the costliest matmul).
    pub fn forward(&self, input: BertInput, masked: Tensor<1, Int>) -> PreTrainingOutput {
        let out = self.bert.forward(input);
        let [batch, seq, hidden] = out.hidden.dims();
        let at_masks = out.hidden.reshape([batch * seq, hidden]).select(0, masked);
        let p = &self.cls.predictions;
        let t = &p.transform;
        let h = fused::layer_norm(
            fused::dense_gelu(at_masks, &t.dense),
            &t.layer_norm,
            t.layer_norm_eps,
        );
        let decoder = self.bert.embeddings.word_embeddings.weight.val();
        // Logits in fp32 under mixed precision too (autocast's losses).
        let mlm_logits = fused::widen(fused::linear_transposed(h, decoder, p.bias.val()));
        let pooled = out.pooled.expect("BertForPreTraining always has a pooler");
        PreTrainingOutput {
            mlm_logits,
            nsp_logits: fused::widen(fused::linear(pooled, &self.cls.seq_relationship)),
        }
    }

    /// Mean MLM cross-entropy plus mean NSP cross-entropy.
    pub fn loss(
        &self,
        out: &PreTrainingOutput,
        mlm_labels: Tensor<1, Int>,
        nsp_labels: Tensor<1, Int>,
    ) -> Tensor<1> {
        fused::cross_entropy(out.mlm_logits.clone(), mlm_labels)
            + fused::cross_entropy(out.nsp_logits.clone(), nsp_labels)
    }
}

/// BERT with a start/end span head (HuggingFace `BertForQuestionAnswering`,
/// which has no pooler).
#[derive(Module, Debug)]
pub struct BertForQuestionAnswering {
    /// The encoder.
    pub bert: BertModel,
    /// hidden → (start, end) logits.
    pub qa_outputs: Linear,
}

impl BertForQuestionAnswering {
    /// A fresh model without the pooler.
    pub fn new(config: &BertConfig, device: &Device) -> Self {
        let config = BertConfig {
            pooler: false,
            ..config.clone()
        };
        BertForQuestionAnswering {
            bert: config.init(device),
            qa_outputs: dense(&config, config.hidden_size, 2, device),
        }
    }

    /// Start and end logits, each `[batch, seq]`.
    pub fn forward(&self, input: BertInput) -> (Tensor<2>, Tensor<2>) {
        let hidden = self.bert.forward(input).hidden;
        let [batch, seq, _] = hidden.dims();
        let logits = fused::widen(fused::linear(hidden, &self.qa_outputs));
        let start = logits
            .clone()
            .slice([0..batch, 0..seq, 0..1])
            .reshape([batch, seq]);
        let end = logits.slice([0..batch, 0..seq, 1..2]).reshape([batch, seq]);
        (start, end)
    }

    /// Mean of the start and end cross-entropies (positions `[batch]`).
    pub fn loss(
        &self,
        start: Tensor<2>,
        end: Tensor<2>,
        start_positions: Tensor<1, Int>,
        end_positions: Tensor<1, Int>,
    ) -> Tensor<1> {
        (fused::cross_entropy(start, start_positions) + fused::cross_entropy(end, end_positions))
            .div_scalar(2.0)
    }
}

/// BERT with a classifier on the pooled `[CLS]` state (HuggingFace
/// `BertForSequenceClassification`); one label means regression.
#[derive(Module, Debug)]
pub struct BertForSequenceClassification {
    /// The encoder (with its pooler).
    pub bert: BertModel,
    dropout: Dropout,
    /// pooled → labels.
    pub classifier: Linear,
}

impl BertForSequenceClassification {
    /// A fresh model with `labels` outputs (1: regression, as STS-B).
    pub fn new(config: &BertConfig, labels: usize, device: &Device) -> Self {
        let config = BertConfig {
            pooler: true,
            ..config.clone()
        };
        BertForSequenceClassification {
            bert: config.init(device),
            dropout: DropoutConfig::new(config.hidden_dropout_prob).init(),
            classifier: dense(&config, config.hidden_size, labels, device),
        }
    }

    /// Logits `[batch, labels]` (scores `[batch, 1]` for regression).
    pub fn forward(&self, input: BertInput) -> Tensor<2> {
        let pooled = self.bert.forward(input).pooled.expect("a pooler");
        fused::widen(fused::linear(
            fused::dropout(pooled, &self.dropout),
            &self.classifier,
        ))
    }

    /// Cross-entropy over class labels `[batch]`.
    pub fn classification_loss(&self, logits: Tensor<2>, labels: Tensor<1, Int>) -> Tensor<1> {
        fused::cross_entropy(logits, labels)
    }

    /// Mean squared error against targets `[batch]` (regression).
    pub fn regression_loss(&self, scores: Tensor<2>, targets: Tensor<1>) -> Tensor<1> {
        let [batch, _] = scores.dims();
        MseLoss::new().forward(scores.reshape([batch]), targets, Reduction::Mean)
    }
}
