//! A multi-layer perceptron classifier: the smallest real model, for testing
//! optimizers on real images before the big models exist.

use burn::module::Module;
use burn::nn::{Linear, LinearConfig, Relu};
use burn::tensor::{Device, Tensor};
use serde::{Deserialize, Serialize};

use crate::ImageClassifier;

/// Layer sizes of an [`Mlp`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MlpConfig {
    /// Input features (784 for 28×28 images).
    pub input: usize,
    /// Hidden layer widths, in order.
    pub hidden: Vec<usize>,
    /// Number of classes.
    pub classes: usize,
}

impl MlpConfig {
    /// Builds the model on `device` with burn's default initialisation.
    pub fn init(&self, device: &Device) -> Mlp {
        let mut widths = vec![self.input];
        widths.extend(&self.hidden);
        widths.push(self.classes);
        let layers = widths
            .windows(2)
            .map(|w| LinearConfig::new(w[0], w[1]).init(device))
            .collect();
        Mlp {
            layers,
            activation: Relu::new(),
        }
    }
}

/// Linear layers with ReLU between them; the last layer outputs logits.
#[derive(Module, Debug)]
pub struct Mlp {
    /// The linear layers, input first.
    pub layers: Vec<Linear>,
    activation: Relu,
}

impl Mlp {
    /// # Shapes
    /// `[batch, input]` → `[batch, classes]` logits.
    pub fn forward(&self, mut x: Tensor<2>) -> Tensor<2> {
        let last = self.layers.len() - 1;
        for (i, layer) in self.layers.iter().enumerate() {
            x = layer.forward(x);
            if i < last {
                x = self.activation.forward(x);
            }
        }
        x
    }
}

impl ImageClassifier for Mlp {
    type Config = MlpConfig;
    fn name(_: &MlpConfig) -> String {
        "mlp".into()
    }
    fn build(config: &MlpConfig, device: &Device) -> Self {
        config.init(device)
    }
    fn logits(&self, images: Tensor<4>) -> Tensor<2> {
        let [batch, channels, height, width] = images.dims();
        self.forward(images.reshape([batch, channels * height * width]))
    }
}
