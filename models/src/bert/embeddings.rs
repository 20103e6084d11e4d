//! Word + position + token-type embeddings, LayerNorm, dropout.

use burn::module::Module;
use burn::nn::{
    Dropout, DropoutConfig, Embedding, EmbeddingConfig, Initializer, LayerNorm, LayerNormConfig,
};
use burn::tensor::{Device, Int, Tensor};
use terse_fused as fused;

use super::BertConfig;

/// BERT's input embeddings (HuggingFace `embeddings.*`).
#[derive(Module, Debug)]
pub struct BertEmbeddings {
    /// Token embeddings `[vocab, hidden]`; the MLM decoder shares them.
    pub word_embeddings: Embedding,
    /// Absolute position embeddings `[max_positions, hidden]`.
    pub position_embeddings: Embedding,
    /// Segment embeddings `[type_vocab, hidden]`.
    pub token_type_embeddings: Embedding,
    /// HuggingFace `embeddings.LayerNorm`.
    pub layer_norm: LayerNorm,
    dropout: Dropout,
    layer_norm_eps: f64,
}

impl BertEmbeddings {
    /// Normal(0, initializer_range) embeddings, LayerNorm at (1, 0).
    pub fn new(config: &BertConfig, device: &Device) -> Self {
        let init = Initializer::Normal {
            mean: 0.0,
            std: config.initializer_range,
        };
        let table = |n: usize| {
            EmbeddingConfig::new(n, config.hidden_size)
                .with_initializer(init.clone())
                .init(device)
        };
        BertEmbeddings {
            word_embeddings: table(config.vocab_size),
            position_embeddings: table(config.max_position_embeddings),
            token_type_embeddings: table(config.type_vocab_size),
            layer_norm: LayerNormConfig::new(config.hidden_size)
                .with_epsilon(config.layer_norm_eps)
                .init(device),
            dropout: DropoutConfig::new(config.hidden_dropout_prob).init(),
            layer_norm_eps: config.layer_norm_eps,
        }
    }

    /// # Shapes
    /// ids and token types `[batch, seq]` → `[batch, seq, hidden]`.
    pub fn forward(&self, input_ids: Tensor<2, Int>, token_type_ids: Tensor<2, Int>) -> Tensor<3> {
        let [_, seq] = input_ids.dims();
        let positions = self
            .position_embeddings
            .weight
            .val()
            .slice(0..seq)
            .unsqueeze_dim::<3>(0);
        let x = fused::embedding(input_ids, &self.word_embeddings)
            + fused::embedding(token_type_ids, &self.token_type_embeddings)
            + positions;
        let x = fused::layer_norm(x, &self.layer_norm, self.layer_norm_eps);
        fused::dropout(x, &self.dropout)
    }
}
