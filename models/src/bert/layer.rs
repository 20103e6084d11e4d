//! One transformer layer of BERT (self-attention and feed-forward, each
//! with its residual and LayerNorm, Post-LN or Pre-LN), named as
//! HuggingFace names it so that weights map one to one.

use burn::module::Module;
use burn::nn::{
    Dropout, DropoutConfig, Initializer, LayerNorm, LayerNormConfig, Linear, LinearConfig,
};
use burn::tensor::{Device, Tensor};
use terse_fused as fused;

use super::{BertConfig, LayerNormPlacement};

pub(crate) fn dense(config: &BertConfig, d_in: usize, d_out: usize, device: &Device) -> Linear {
    LinearConfig::new(d_in, d_out)
        .with_initializer(Initializer::Normal {
            mean: 0.0,
            std: config.initializer_range,
        })
        .init(device)
}

pub(crate) fn layer_norm(config: &BertConfig, device: &Device) -> LayerNorm {
    LayerNormConfig::new(config.hidden_size)
        .with_epsilon(config.layer_norm_eps)
        .init(device)
}

/// Multi-head scaled dot-product self-attention (HuggingFace `attention.self`).
#[derive(Module, Debug)]
pub struct BertSelfAttention {
    /// Query projection.
    pub query: Linear,
    /// Key projection.
    pub key: Linear,
    /// Value projection.
    pub value: Linear,
    dropout: Dropout,
    heads: usize,
}

impl BertSelfAttention {
    fn new(config: &BertConfig, device: &Device) -> Self {
        let h = config.hidden_size;
        BertSelfAttention {
            query: dense(config, h, h, device),
            key: dense(config, h, h, device),
            value: dense(config, h, h, device),
            dropout: DropoutConfig::new(config.attention_probs_dropout_prob).init(),
            heads: config.num_attention_heads,
        }
    }

    /// `mask_bias` `[batch, seq]` is 0 on real tokens and the lowest float
    /// on padding, added to the scores before the softmax.
    fn forward(&self, x: Tensor<3>, mask_bias: Tensor<2>) -> Tensor<3> {
        let hidden = x.dims()[2];
        let scale = 1.0 / ((hidden / self.heads) as f64).sqrt();
        let q = fused::linear(x.clone(), &self.query);
        let k = fused::linear(x.clone(), &self.key);
        let v = fused::linear(x, &self.value);
        fused::attention(q, k, v, mask_bias, self.heads, scale, &self.dropout)
    }
}

/// A dense layer, dropout and the residual's LayerNorm (HuggingFace
/// `attention.output` and `output`). With Pre-LN the LayerNorm normalises
/// the block's input instead, and the residual sum is left unnormalised.
#[derive(Module, Debug)]
pub struct BertResidual {
    /// The projection back to the hidden size.
    pub dense: Linear,
    /// HuggingFace `LayerNorm`.
    pub layer_norm: LayerNorm,
    dropout: Dropout,
    layer_norm_eps: f64,
}

impl BertResidual {
    fn new(config: &BertConfig, d_in: usize, device: &Device) -> Self {
        BertResidual {
            dense: dense(config, d_in, config.hidden_size, device),
            layer_norm: layer_norm(config, device),
            dropout: DropoutConfig::new(config.hidden_dropout_prob).init(),
            layer_norm_eps: config.layer_norm_eps,
        }
    }

    /// Dropout of the projection of `h`, in fp32, plus the residual
    /// stream `residual` (under mixed precision the projection and its
    /// dropout run in the half type; the residual stream stays fp32, as
    /// autocast's type promotion keeps it). One step on a cubecl device
    /// in fp32 (`fused::dropout_add`).
    fn project_add(&self, h: Tensor<3>, residual: Tensor<3>) -> Tensor<3> {
        fused::dropout_add(fused::linear(h, &self.dense), residual, &self.dropout)
    }

    /// LayerNorm of [`Self::project_add`]: a post-LN block's end, one
    /// step on a cubecl device in fp32 (`fused::dropout_add_layer_norm`).
    fn project_add_norm(&self, h: Tensor<3>, residual: Tensor<3>) -> Tensor<3> {
        let projected = fused::linear(h, &self.dense);
        fused::dropout_add_layer_norm(
            projected,
            residual,
            &self.dropout,
            &self.layer_norm,
            self.layer_norm_eps,
        )
    }

    fn norm(&self, x: Tensor<3>) -> Tensor<3> {
        fused::layer_norm(x, &self.layer_norm, self.layer_norm_eps)
    }
}

/// Self-attention and its output block (HuggingFace `attention`).
#[derive(Module, Debug)]
pub struct BertAttention {
    /// HuggingFace `attention.self`.
    pub self_attention: BertSelfAttention,
    /// HuggingFace `attention.output`.
    pub output: BertResidual,
}

/// The feed-forward block's expansion (HuggingFace `intermediate`).
#[derive(Module, Debug)]
pub struct BertIntermediate {
    /// hidden → intermediate, followed by exact GELU (fused with the bias).
    pub dense: Linear,
}

/// One transformer layer (HuggingFace `encoder.layer.N`).
#[derive(Module, Debug)]
pub struct BertLayer {
    /// Self-attention with its residual.
    pub attention: BertAttention,
    /// Feed-forward expansion.
    pub intermediate: BertIntermediate,
    /// Feed-forward projection with its residual.
    pub output: BertResidual,
    pre_ln: bool,
}

impl BertLayer {
    /// A freshly initialised layer.
    pub fn new(config: &BertConfig, device: &Device) -> Self {
        BertLayer {
            attention: BertAttention {
                self_attention: BertSelfAttention::new(config, device),
                output: BertResidual::new(config, config.hidden_size, device),
            },
            intermediate: BertIntermediate {
                dense: dense(config, config.hidden_size, config.intermediate_size, device),
            },
            output: BertResidual::new(config, config.intermediate_size, device),
            pre_ln: config.layer_norm == LayerNormPlacement::Pre,
        }
    }

    /// # Shapes
    /// `[batch, seq, hidden]` → `[batch, seq, hidden]`.
    pub fn forward(&self, x: Tensor<3>, mask_bias: Tensor<2>) -> Tensor<3> {
        let attn = &self.attention.output;
        let ffn = &self.output;
        let expand = |h: Tensor<3>| fused::dense_gelu(h, &self.intermediate.dense);
        if self.pre_ln {
            let h = self
                .attention
                .self_attention
                .forward(attn.norm(x.clone()), mask_bias);
            let x = attn.project_add(h, x);
            ffn.project_add(expand(ffn.norm(x.clone())), x)
        } else {
            let h = self.attention.self_attention.forward(x.clone(), mask_bias);
            let x = attn.project_add_norm(h, x);
            ffn.project_add_norm(expand(x.clone()), x)
        }
    }
}
