//! ResNet (He et al. 2016) in both styles: CIFAR (three stages of 16/32/64
//! channels, 6n+2 layers, identity shortcuts zero-padded where the shape
//! changes — option A) and ImageNet (18/34 with basic blocks, 50/101/152
//! with bottlenecks, projection shortcuts, stride on the 3×3 as torchvision).
//! Every variant ends in global average pooling, so any input size works
//! (28×28 greyscale and 32×32 RGB included).

use burn::module::Module;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::pool::{AdaptiveAvgPool2d, AdaptiveAvgPool2dConfig, MaxPool2d, MaxPool2dConfig};
use burn::nn::{BatchNorm, BatchNormConfig, Initializer, Linear, LinearConfig, PaddingConfig2d};
use burn::tensor::{Device, Tensor, s};
use serde::{Deserialize, Serialize};
use terse_fused as fused;

use crate::ImageClassifier;
use crate::image_classifier::serde_name;

use crate::ModelError;

/// The depths terse builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ResnetDepth {
    /// CIFAR style, n = 3.
    Resnet20,
    /// CIFAR style, n = 9.
    Resnet56,
    /// CIFAR style, n = 18.
    Resnet110,
    /// ImageNet style, basic blocks [2, 2, 2, 2].
    Resnet18,
    /// ImageNet style, basic blocks [3, 4, 6, 3].
    Resnet34,
    /// ImageNet style, bottlenecks [3, 4, 6, 3].
    Resnet50,
    /// ImageNet style, bottlenecks [3, 4, 23, 3].
    Resnet101,
    /// ImageNet style, bottlenecks [3, 8, 36, 3].
    Resnet152,
}

impl ResnetDepth {
    /// Every depth (the names `terse train` accepts for ResNet).
    pub const ALL: [ResnetDepth; 8] = [
        ResnetDepth::Resnet20,
        ResnetDepth::Resnet56,
        ResnetDepth::Resnet110,
        ResnetDepth::Resnet18,
        ResnetDepth::Resnet34,
        ResnetDepth::Resnet50,
        ResnetDepth::Resnet101,
        ResnetDepth::Resnet152,
    ];

    fn plan(self) -> (&'static [usize], bool, bool) {
        // (blocks per stage, bottleneck, cifar style)
        match self {
            ResnetDepth::Resnet20 => (&[3, 3, 3], false, true),
            ResnetDepth::Resnet56 => (&[9, 9, 9], false, true),
            ResnetDepth::Resnet110 => (&[18, 18, 18], false, true),
            ResnetDepth::Resnet18 => (&[2, 2, 2, 2], false, false),
            ResnetDepth::Resnet34 => (&[3, 4, 6, 3], false, false),
            ResnetDepth::Resnet50 => (&[3, 4, 6, 3], true, false),
            ResnetDepth::Resnet101 => (&[3, 4, 23, 3], true, false),
            ResnetDepth::Resnet152 => (&[3, 8, 36, 3], true, false),
        }
    }
}

/// A ResNet: depth, input channels and classes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResnetConfig {
    /// Which ResNet.
    pub depth: ResnetDepth,
    /// 1 for greyscale, 3 for RGB.
    #[serde(default = "three")]
    pub in_channels: usize,
    /// Output classes.
    pub classes: usize,
    /// ImageNet style only: a 3×3 stride-1 stem without max-pooling, for
    /// 32×32 inputs (as the CIFAR ResNet-18 of the 1-bit Adam paper).
    #[serde(default)]
    pub small_stem: bool,
}

fn three() -> usize {
    3
}

fn conv(c_in: usize, c_out: usize, kernel: usize, stride: usize, device: &Device) -> Conv2d {
    let pad = kernel / 2;
    Conv2dConfig::new([c_in, c_out], [kernel, kernel])
        .with_stride([stride, stride])
        .with_padding(PaddingConfig2d::Explicit(pad, pad, pad, pad))
        .with_bias(false)
        .with_initializer(Initializer::KaimingNormal {
            gain: 2f64.sqrt(),
            fan_out_only: true,
        })
        .init(device)
}

fn bn(c: usize, device: &Device) -> BatchNorm {
    BatchNormConfig::new(c).init(device)
}

/// Option B's projection shortcut: 1×1 convolution with the stride, then BatchNorm.
#[derive(Module, Debug)]
pub struct Projection {
    conv: Conv2d,
    bn: BatchNorm,
}

/// A residual block: two 3×3 convolutions (basic) or 1×1, 3×3, 1×1 with
/// 4× expansion (bottleneck).
#[derive(Module, Debug)]
pub struct Block {
    convs: Vec<Conv2d>,
    bns: Vec<BatchNorm>,
    /// Option B (ImageNet style) where the shape changes.
    projection: Option<Projection>,
    /// Option A (CIFAR style) where the shape changes: subsample by this
    /// stride and zero-pad `pad_channels` new channels (0: identity).
    pad_stride: usize,
    pad_channels: usize,
}

impl Block {
    fn basic(c_in: usize, c_out: usize, stride: usize, cifar: bool, device: &Device) -> Self {
        let reshape = stride != 1 || c_in != c_out;
        Block {
            convs: vec![
                conv(c_in, c_out, 3, stride, device),
                conv(c_out, c_out, 3, 1, device),
            ],
            bns: vec![bn(c_out, device), bn(c_out, device)],
            projection: (reshape && !cifar).then(|| Projection {
                conv: conv(c_in, c_out, 1, stride, device),
                bn: bn(c_out, device),
            }),
            pad_stride: if reshape && cifar { stride } else { 0 },
            pad_channels: if reshape && cifar { c_out - c_in } else { 0 },
        }
    }

    fn bottleneck(c_in: usize, width: usize, stride: usize, device: &Device) -> Self {
        let c_out = 4 * width;
        let reshape = stride != 1 || c_in != c_out;
        Block {
            convs: vec![
                conv(c_in, width, 1, 1, device),
                conv(width, width, 3, stride, device),
                conv(width, c_out, 1, 1, device),
            ],
            bns: vec![bn(width, device), bn(width, device), bn(c_out, device)],
            projection: reshape.then(|| Projection {
                conv: conv(c_in, c_out, 1, stride, device),
                bn: bn(c_out, device),
            }),
            pad_stride: 0,
            pad_channels: 0,
        }
    }

    fn shortcut(&self, x: Tensor<4>) -> Tensor<4> {
        if let Some(p) = &self.projection {
            return fused::batch_norm(fused::conv2d(x, &p.conv), &p.bn, false);
        }
        if self.pad_stride == 0 {
            return x;
        }
        let step = self.pad_stride as isize;
        let x = x.slice(s![.., .., ..;step, ..;step]);
        let [b, _, h, w] = x.dims();
        let zeros = Tensor::zeros([b, self.pad_channels, h, w], &x.device());
        Tensor::cat(vec![x, zeros], 1)
    }

    fn forward(&self, x: Tensor<4>) -> Tensor<4> {
        let residual = self.shortcut(x.clone());
        let last = self.convs.len() - 1;
        let mut h = x;
        for (i, (conv, bn)) in self.convs.iter().zip(&self.bns).enumerate() {
            h = fused::batch_norm(fused::conv2d(h, conv), bn, i < last);
        }
        fused::add_relu(h, residual)
    }
}

/// A ResNet classifier.
#[derive(Module, Debug)]
pub struct Resnet {
    stem: Conv2d,
    stem_bn: BatchNorm,
    stem_pool: Option<MaxPool2d>,
    blocks: Vec<Block>,
    pool: AdaptiveAvgPool2d,
    fc: Linear,
}

impl ResnetConfig {
    /// Checks the sizes.
    pub fn validate(&self) -> Result<(), ModelError> {
        for (field, v) in [("in_channels", self.in_channels), ("classes", self.classes)] {
            if v == 0 {
                return Err(ModelError::Config {
                    field,
                    reason: "must be at least 1".into(),
                });
            }
        }
        Ok(())
    }

    /// A freshly initialised ResNet (Kaiming-normal convolutions, BatchNorm at (1, 0)).
    pub fn init(&self, device: &Device) -> Resnet {
        let (stages, bottleneck, cifar) = self.depth.plan();
        let (stem_width, widths): (usize, &[usize]) = if cifar {
            (16, &[16, 32, 64])
        } else {
            (64, &[64, 128, 256, 512])
        };
        let big_stem = !cifar && !self.small_stem;
        let stem = if big_stem {
            conv(self.in_channels, stem_width, 7, 2, device)
        } else {
            conv(self.in_channels, stem_width, 3, 1, device)
        };
        let mut blocks = Vec::new();
        let mut c = stem_width;
        for (s, (&n, &width)) in stages.iter().zip(widths).enumerate() {
            for b in 0..n {
                let stride = if s > 0 && b == 0 { 2 } else { 1 };
                let block = if bottleneck {
                    Block::bottleneck(c, width, stride, device)
                } else {
                    Block::basic(c, width, stride, cifar, device)
                };
                c = if bottleneck { 4 * width } else { width };
                blocks.push(block);
            }
        }
        Resnet {
            stem,
            stem_bn: bn(stem_width, device),
            stem_pool: big_stem.then(|| {
                MaxPool2dConfig::new([3, 3])
                    .with_strides([2, 2])
                    .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
                    .init()
            }),
            blocks,
            pool: AdaptiveAvgPool2dConfig::new([1, 1]).init(),
            fc: LinearConfig::new(c, self.classes).init(device),
        }
    }
}

impl Resnet {
    /// # Shapes
    /// `[batch, channels, height, width]` → `[batch, classes]` logits.
    pub fn forward(&self, x: Tensor<4>) -> Tensor<2> {
        let mut h = fused::batch_norm(fused::conv2d(x, &self.stem), &self.stem_bn, true);
        if let Some(pool) = &self.stem_pool {
            h = pool.forward(h);
        }
        for block in &self.blocks {
            h = block.forward(h);
        }
        let [b, c, _, _] = h.dims();
        self.fc.forward(self.pool.forward(h).reshape([b, c]))
    }
}

impl ImageClassifier for Resnet {
    type Config = ResnetConfig;
    fn name(config: &ResnetConfig) -> String {
        serde_name(&config.depth)
    }
    fn build(config: &ResnetConfig, device: &Device) -> Self {
        config.init(device)
    }
    fn logits(&self, images: Tensor<4>) -> Tensor<2> {
        self.forward(images)
    }
}
