//! Models for terse: BERT (Post-LN and Pre-LN, every preset from tiny to the
//! SLAMB xlarge, with pre-training, span-QA and classification heads and
//! HuggingFace weight import/export), ResNet (CIFAR and ImageNet styles) and
//! VGG, and the small multi-layer perceptron the optimizer tests train on
//! Fashion-MNIST.
#![warn(missing_docs)]

pub mod bert;
mod config;
mod count;
mod error;
mod image_classifier;
mod mlp;
mod resnet;
mod vgg;

pub use config::ModelConfig;
pub use count::trainable_parameters;
pub use error::ModelError;
pub use image_classifier::{ImageClassifier, ImageModelVisitor};
pub use mlp::{Mlp, MlpConfig};
pub use resnet::{Resnet, ResnetConfig, ResnetDepth};
pub use vgg::{Vgg, VggConfig, VggDepth, VggHead};
