//! What an image model offers the image task: built from its `[model]`
//! config, it maps `[batch, C, H, W]` images to class logits. The models
//! that implement it are listed once, in [`ModelConfig::with_image_model`].
//!
//! [`ModelConfig::with_image_model`]: crate::ModelConfig::with_image_model

use burn::module::Module;
use burn::store::ModuleSnapshot;
use burn::tensor::{Device, Tensor};

/// A model that classifies images.
pub trait ImageClassifier: Module + ModuleSnapshot {
    /// Its fields under `[model]`.
    type Config: Clone + Send + Sync + 'static;

    /// The name users call it by (`resnet20`, `vgg16`, `mlp`), as in
    /// `terse train <name>` and `configs/train-<name>-<dataset>.toml`.
    fn name(config: &Self::Config) -> String;

    /// A new model with freshly initialised weights.
    fn build(config: &Self::Config, device: &Device) -> Self;

    /// # Shapes
    /// `[batch, channels, height, width]` → `[batch, classes]` logits.
    fn logits(&self, images: Tensor<4>) -> Tensor<2>;
}

/// What to do with the image model a config names: called with its type
/// and its config (see [`ModelConfig::with_image_model`]).
///
/// [`ModelConfig::with_image_model`]: crate::ModelConfig::with_image_model
pub trait ImageModelVisitor {
    /// What the visit returns.
    type Output;
    /// Called with the model type `M` and its config.
    fn visit<M: ImageClassifier>(self, config: &M::Config) -> Self::Output;
}

/// The name serde gives a unit variant (`ResnetDepth::Resnet20` →
/// `resnet20`): the name a config file writes.
pub(crate) fn serde_name<T: serde::Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(name)) => name,
        other => unreachable!("a unit variant serialises to a string, not {other:?}"),
    }
}
