//! VGG (Simonyan & Zisserman) 11/13/16/19, with or without BatchNorm, with
//! the ImageNet head (7×7 pooling, 4096-4096 classifier with dropout) or the
//! CIFAR head (one linear layer on the 512 features). Max-pooling rounds up,
//! so 28×28 inputs reach 1×1 after the five pools as 32×32 do.

use burn::module::{Module, Param};
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::pool::{AdaptiveAvgPool2d, AdaptiveAvgPool2dConfig, MaxPool2d, MaxPool2dConfig};
use burn::nn::{
    BatchNorm, BatchNormConfig, Dropout, DropoutConfig, Initializer, Linear, LinearConfig,
    PaddingConfig2d,
};
use burn::tensor::activation::relu;
use burn::tensor::{Device, Tensor};
use serde::{Deserialize, Serialize};
use terse_fused as fused;

use crate::ImageClassifier;
use crate::image_classifier::serde_name;

/// The VGG depths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VggDepth {
    /// Configuration A.
    Vgg11,
    /// Configuration B.
    Vgg13,
    /// Configuration D.
    Vgg16,
    /// Configuration E.
    Vgg19,
}

impl VggDepth {
    /// Every depth (the names `terse train` accepts for VGG).
    pub const ALL: [VggDepth; 4] = [
        VggDepth::Vgg11,
        VggDepth::Vgg13,
        VggDepth::Vgg16,
        VggDepth::Vgg19,
    ];
}

/// Which classifier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VggHead {
    /// 7×7 adaptive pooling, Linear(25088, 4096), Linear(4096, 4096), Linear(4096, classes).
    Imagenet,
    /// Linear(512, classes) on the 1×1 feature map.
    #[default]
    Cifar,
}

/// A VGG.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VggConfig {
    /// Which VGG.
    pub depth: VggDepth,
    /// BatchNorm after every convolution.
    #[serde(default)]
    pub batch_norm: bool,
    /// Which classifier.
    #[serde(default)]
    pub head: VggHead,
    /// 1 for greyscale, 3 for RGB.
    #[serde(default = "three")]
    pub in_channels: usize,
    /// Output classes.
    pub classes: usize,
}

fn three() -> usize {
    3
}

/// Convolution widths per stage; every stage ends in a max-pool.
fn plan(depth: VggDepth) -> [&'static [usize]; 5] {
    match depth {
        VggDepth::Vgg11 => [&[64], &[128], &[256, 256], &[512, 512], &[512, 512]],
        VggDepth::Vgg13 => [
            &[64, 64],
            &[128, 128],
            &[256, 256],
            &[512, 512],
            &[512, 512],
        ],
        VggDepth::Vgg16 => [
            &[64, 64],
            &[128, 128],
            &[256, 256, 256],
            &[512, 512, 512],
            &[512, 512, 512],
        ],
        VggDepth::Vgg19 => [
            &[64, 64],
            &[128, 128],
            &[256, 256, 256, 256],
            &[512, 512, 512, 512],
            &[512, 512, 512, 512],
        ],
    }
}

/// 3×3 convolution (padding 1, with bias), BatchNorm in the `_bn` variants, ReLU.
#[derive(Module, Debug)]
pub struct VggConv {
    conv: Conv2d,
    bn: Option<BatchNorm>,
}

/// A VGG classifier.
#[derive(Module, Debug)]
pub struct Vgg {
    /// Five stages of convolutions, each followed by `stage_pool`.
    stages: Vec<Vec<VggConv>>,
    /// 2×2 max-pool, stride 2, rounding up.
    stage_pool: MaxPool2d,
    pool: Option<AdaptiveAvgPool2d>,
    classifier: Vec<Linear>,
    dropout: Dropout,
}

impl VggConfig {
    /// A freshly initialised VGG.
    pub fn init(&self, device: &Device) -> Vgg {
        let mut c = self.in_channels;
        let stages = plan(self.depth)
            .iter()
            .map(|widths| {
                widths
                    .iter()
                    .map(|&width| {
                        // torchvision's VGG initialisation (He-normal on
                        // fan-out, zero bias). burn's layer default,
                        // PyTorch's Kaiming-uniform with a = √5, shrinks the
                        // activations' variance six-fold per ReLU layer: VGG-16
                        // without BatchNorm would start with an output that
                        // ignores its input and sit at loss ln 10.
                        let mut conv = Conv2dConfig::new([c, width], [3, 3])
                            .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
                            .with_initializer(Initializer::KaimingNormal {
                                gain: std::f64::consts::SQRT_2,
                                fan_out_only: true,
                            })
                            .init(device);
                        conv.bias = Some(Param::from_tensor(Tensor::zeros([width], device)));
                        c = width;
                        VggConv {
                            conv,
                            bn: self
                                .batch_norm
                                .then(|| BatchNormConfig::new(width).init(device)),
                        }
                    })
                    .collect()
            })
            .collect();
        let (pool, classifier) = match self.head {
            VggHead::Imagenet => (
                Some(AdaptiveAvgPool2dConfig::new([7, 7]).init()),
                vec![
                    classifier_linear(512 * 49, 4096, device),
                    classifier_linear(4096, 4096, device),
                    classifier_linear(4096, self.classes, device),
                ],
            ),
            VggHead::Cifar => (None, vec![classifier_linear(512, self.classes, device)]),
        };
        Vgg {
            stages,
            stage_pool: MaxPool2dConfig::new([2, 2]).with_ceil_mode(true).init(),
            pool,
            classifier,
            dropout: DropoutConfig::new(0.5).init(),
        }
    }
}

/// A classifier layer initialised as torchvision's VGG: N(0, 0.01), zero bias.
fn classifier_linear(inputs: usize, outputs: usize, device: &Device) -> Linear {
    let mut linear = LinearConfig::new(inputs, outputs)
        .with_initializer(Initializer::Normal {
            mean: 0.0,
            std: 0.01,
        })
        .init(device);
    linear.bias = Some(Param::from_tensor(Tensor::zeros([outputs], device)));
    linear
}

impl Vgg {
    /// # Shapes
    /// `[batch, channels, height, width]` → `[batch, classes]` logits.
    pub fn forward(&self, x: Tensor<4>) -> Tensor<2> {
        let mut h = x;
        for stage in &self.stages {
            for layer in stage {
                let y = fused::conv2d(h, &layer.conv);
                h = match &layer.bn {
                    Some(bn) => fused::batch_norm(y, bn, true),
                    None => relu(y),
                };
            }
            h = self.stage_pool.forward(h);
        }
        if let Some(pool) = &self.pool {
            h = pool.forward(h);
        }
        let [b, c, hh, w] = h.dims();
        let mut z = h.reshape([b, c * hh * w]);
        let last = self.classifier.len() - 1;
        for (i, linear) in self.classifier.iter().enumerate() {
            z = linear.forward(z);
            if i < last {
                z = fused::dropout(relu(z), &self.dropout);
            }
        }
        z
    }
}

impl ImageClassifier for Vgg {
    type Config = VggConfig;
    fn name(config: &VggConfig) -> String {
        serde_name(&config.depth)
    }
    fn build(config: &VggConfig, device: &Device) -> Self {
        config.init(device)
    }
    fn logits(&self, images: Tensor<4>) -> Tensor<2> {
        self.forward(images)
    }
}
