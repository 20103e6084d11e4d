//! A model named in a config file: `kind` picks the family, the rest are
//! that family's fields (BERT takes a `preset` plus overrides).

use serde::{Deserialize, Serialize};

use crate::bert::BertConfig;
use crate::{
    ImageClassifier, ImageModelVisitor, Mlp, MlpConfig, Resnet, ResnetConfig, Vgg, VggConfig,
};

/// Any model terse builds, as written in `configs/*.toml` under `[model]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum ModelConfig {
    /// BERT (the head comes from the task: pre-training, SQuAD or GLUE).
    Bert(BertConfig),
    /// ResNet (CIFAR or ImageNet style).
    Resnet(ResnetConfig),
    /// VGG.
    Vgg(VggConfig),
    /// Multi-layer perceptron.
    Mlp(MlpConfig),
}

impl ModelConfig {
    /// The registry of image models: hands the model type this config
    /// names, and its config, to `visitor`; `None` for a model that does
    /// not classify images (BERT). A new image model is one arm here, one
    /// variant above, and its own file implementing
    /// [`ImageClassifier`](crate::ImageClassifier).
    pub fn with_image_model<V: ImageModelVisitor>(&self, visitor: V) -> Option<V::Output> {
        match self {
            Self::Resnet(config) => Some(visitor.visit::<Resnet>(config)),
            Self::Vgg(config) => Some(visitor.visit::<Vgg>(config)),
            Self::Mlp(config) => Some(visitor.visit::<Mlp>(config)),
            Self::Bert(_) => None,
        }
    }

    /// The name of the image model this config builds (`resnet20`, `vgg16`,
    /// `mlp`); `None` for BERT.
    pub fn image_model_name(&self) -> Option<String> {
        struct Name;
        impl ImageModelVisitor for Name {
            type Output = String;
            fn visit<M: ImageClassifier>(self, config: &M::Config) -> String {
                M::name(config)
            }
        }
        self.with_image_model(Name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bert::{BertPreset, LayerNormPlacement};
    use crate::{ResnetDepth, VggDepth, VggHead};

    #[test]
    fn configs_name_presets_and_override_fields() {
        let bert: ModelConfig = toml::from_str(
            "kind = \"bert\"\npreset = \"large\"\nlayer_norm = \"pre\"\nhidden_dropout_prob = 0.0\n",
        )
        .unwrap();
        let want = BertConfig {
            layer_norm: LayerNormPlacement::Pre,
            hidden_dropout_prob: 0.0,
            ..BertPreset::Large.config()
        };
        assert_eq!(bert, ModelConfig::Bert(want));
        let resnet: ModelConfig = toml::from_str(
            "kind = \"resnet\"\ndepth = \"resnet20\"\nin_channels = 1\nclasses = 10\n",
        )
        .unwrap();
        let ModelConfig::Resnet(r) = resnet else {
            panic!("{resnet:?}")
        };
        assert_eq!(
            (r.depth, r.in_channels, r.small_stem),
            (ResnetDepth::Resnet20, 1, false)
        );
        let vgg: ModelConfig =
            toml::from_str("kind = \"vgg\"\ndepth = \"vgg16\"\nbatch_norm = true\nclasses = 10\n")
                .unwrap();
        let ModelConfig::Vgg(v) = vgg else {
            panic!("{vgg:?}")
        };
        assert_eq!(
            (v.depth, v.head, v.in_channels),
            (VggDepth::Vgg16, VggHead::Cifar, 3)
        );
    }

    #[test]
    fn unknown_fields_and_presets_are_named() {
        let typo = toml::from_str::<ModelConfig>("kind = \"bert\"\nhiden_size = 3\n").unwrap_err();
        assert!(typo.to_string().contains("hiden_size"), "{typo}");
        let preset =
            toml::from_str::<ModelConfig>("kind = \"bert\"\npreset = \"huge\"\n").unwrap_err();
        assert!(preset.to_string().contains("huge"), "{preset}");
    }

    #[test]
    fn every_preset_round_trips_through_toml() {
        for preset in BertPreset::ALL {
            let config = ModelConfig::Bert(preset.config());
            let text = toml::to_string(&config).unwrap();
            assert_eq!(
                toml::from_str::<ModelConfig>(&text).unwrap(),
                config,
                "{}",
                preset.name()
            );
        }
    }
}
