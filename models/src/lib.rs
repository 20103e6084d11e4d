//! Models for terse: BERT (Post-LN and Pre-LN, every preset from tiny to the
//! SLAMB xlarge, with pre-training, span-QA and classification heads and
//! HuggingFace weight import/export), ResNet (CIFAR and ImageNet styles) and
//! VGG. The models issue fills this crate; today it holds the small
//! multi-layer perceptron the optimizer tests train on Fashion-MNIST.
#![warn(missing_docs)]

mod mlp;

pub use mlp::{Mlp, MlpConfig};
