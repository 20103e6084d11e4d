//! The BERT encoder: embeddings, N layers, the optional final LayerNorm
//! (Pre-LN) and the optional `[CLS]` pooler (HuggingFace `BertModel`).

use burn::module::Module;
use burn::nn::{LayerNorm, Linear};
use burn::tensor::{Device, Int, Tensor};
use terse_fused as fused;

use super::layer::{dense, layer_norm};
use super::{BertConfig, BertEmbeddings, BertLayer, LayerNormPlacement};

/// A batch of token sequences.
#[derive(Debug, Clone)]
pub struct BertInput {
    /// Token ids `[batch, seq]`.
    pub input_ids: Tensor<2, Int>,
    /// Segment ids `[batch, seq]` (0 for the first text, 1 for the second).
    pub token_type_ids: Tensor<2, Int>,
    /// 1 on real tokens, 0 on padding `[batch, seq]`.
    pub attention_mask: Tensor<2, Int>,
}

impl BertInput {
    /// From row-major `[batch, seq]` id, type and mask values.
    pub fn from_rows(
        ids: Vec<i64>,
        types: Vec<i64>,
        mask: Vec<i64>,
        [batch, seq]: [usize; 2],
        device: &Device,
    ) -> Self {
        let t = |v: Vec<i64>| {
            Tensor::<2, Int>::from_data(burn::tensor::TensorData::new(v, [batch, seq]), device)
        };
        BertInput {
            input_ids: t(ids),
            token_type_ids: t(types),
            attention_mask: t(mask),
        }
    }
}

/// The stack of layers (HuggingFace `encoder`).
#[derive(Module, Debug)]
pub struct BertEncoder {
    /// HuggingFace `encoder.layer.N`.
    pub layer: Vec<BertLayer>,
    /// Pre-LN only: the LayerNorm after the last layer.
    pub final_layer_norm: Option<LayerNorm>,
    layer_norm_eps: f64,
}

/// `tanh(W·h_[CLS] + b)` (HuggingFace `pooler`).
#[derive(Module, Debug)]
pub struct BertPooler {
    /// The pooler's dense layer.
    pub dense: Linear,
}

/// What the encoder computes.
#[derive(Debug, Clone)]
pub struct BertOutput {
    /// Last layer's hidden states `[batch, seq, hidden]`.
    pub hidden: Tensor<3>,
    /// Pooled `[CLS]` state `[batch, hidden]` (models with a pooler).
    pub pooled: Option<Tensor<2>>,
}

/// BERT without a head (HuggingFace `BertModel`).
#[derive(Module, Debug)]
pub struct BertModel {
    /// Input embeddings.
    pub embeddings: BertEmbeddings,
    /// The layers.
    pub encoder: BertEncoder,
    /// The `[CLS]` pooler, if the config has one.
    pub pooler: Option<BertPooler>,
}

impl BertConfig {
    /// A freshly initialised encoder on `device` (weights drawn from the
    /// device's seeded generator: `device.seed(s)` first for determinism).
    pub fn init(&self, device: &Device) -> BertModel {
        BertModel {
            embeddings: BertEmbeddings::new(self, device),
            encoder: BertEncoder {
                layer: (0..self.num_hidden_layers)
                    .map(|_| BertLayer::new(self, device))
                    .collect(),
                final_layer_norm: (self.layer_norm == LayerNormPlacement::Pre)
                    .then(|| layer_norm(self, device)),
                layer_norm_eps: self.layer_norm_eps,
            },
            pooler: self.pooler.then(|| BertPooler {
                dense: dense(self, self.hidden_size, self.hidden_size, device),
            }),
        }
    }
}

impl BertModel {
    /// # Shapes
    /// `[batch, seq]` inputs → `[batch, seq, hidden]` (+ `[batch, hidden]` pooled).
    pub fn forward(&self, input: BertInput) -> BertOutput {
        let [batch, _] = input.input_ids.dims();
        // 0 where attended, the lowest float where padded (as HuggingFace).
        let mask_bias = input
            .attention_mask
            .float()
            .neg()
            .add_scalar(1.0)
            .mul_scalar(f32::MIN);
        let mut x = self
            .embeddings
            .forward(input.input_ids, input.token_type_ids);
        for layer in &self.encoder.layer {
            x = layer.forward(x, mask_bias.clone());
        }
        if let Some(norm) = &self.encoder.final_layer_norm {
            x = fused::layer_norm(x, norm, self.encoder.layer_norm_eps);
        }
        let pooled = self.pooler.as_ref().map(|pooler| {
            let [_, _, hidden] = x.dims();
            let cls = x.clone().slice([0..batch, 0..1]).reshape([batch, hidden]);
            fused::linear(cls, &pooler.dense).tanh()
        });
        BertOutput { hidden: x, pooled }
    }
}
