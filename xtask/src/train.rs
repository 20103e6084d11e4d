//! `cargo xtask train`: train an image classifier from scratch.
//!
//! Image models (the MLP, ResNet, VGG) on image data are the papers' second
//! workload: small enough to run the optimizers to convergence on one
//! machine. They go through the one trainer (`terse train <model>` with
//! `configs/train-<model>-<dataset>.toml` or `--config`, on `--ranks`
//! processes). Which models exist is terse's business (terse-models'
//! registry): this command checks only that the config is there.

use anyhow::{Result, anyhow};

use crate::run_args::RunArgs;

/// The dataset when `--dataset` is not given.
const DEFAULT_DATASET: &str = "fashion-mnist";

/// Arguments of `cargo xtask train`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct Args {
    /// The model (mlp, resnet20, resnet56, resnet110, resnet18, resnet50,
    /// vgg11, vgg16, …): runs configs/train-<MODEL>-<DATASET>.toml unless
    /// --config names another (shipped: mlp and resnet20 on fashion-mnist)
    #[arg(value_name = "MODEL")]
    pub model: String,

    /// Dataset to train and test on (fashion-mnist, mnist, cifar10,
    /// cifar100) [default: fashion-mnist]
    #[arg(long, value_name = "NAME")]
    pub dataset: Option<String>,

    #[command(flatten)]
    pub run: RunArgs,
}

/// Runs `train`.
pub fn run(args: &Args) -> Result<()> {
    let dataset = args.dataset.as_deref().unwrap_or(DEFAULT_DATASET);
    if args.run.terse.config.is_none() {
        crate::shipped_configs::config(
            std::path::Path::new("configs"),
            "train-",
            &args.model,
            &format!("-{dataset}.toml"),
            &format!("models shipped for {dataset}"),
        )
        .map_err(|e| anyhow!("{e} (or pass --config)"))?;
    }
    let mut terse = vec!["train".to_string(), args.model.clone()];
    if let Some(dataset) = &args.dataset {
        terse.extend(["--dataset".into(), dataset.clone()]);
    }
    terse.extend(args.run.terse_args());
    args.run.launch(&terse)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use crate::testing;

    #[test]
    fn parses_model_dataset_and_run_options() {
        let argv = &[
            "train",
            "resnet20",
            "--dataset",
            "fashion-mnist",
            "--optimizer",
            "slamb",
            "--ranks",
            "8",
            "--config",
            "configs/resnet.toml",
        ];
        let args = testing::parsed_as!(Train, argv);
        assert_eq!(args.model, "resnet20");
        assert_eq!(args.dataset.as_deref(), Some("fashion-mnist"));
        assert_eq!(args.run.terse.optimizer, Some("slamb".to_string()));
        assert_eq!(args.run.ranks, 8);
        assert_eq!(
            args.run.terse.config,
            Some(PathBuf::from("configs/resnet.toml"))
        );
    }

    #[test]
    fn a_model_is_required() {
        testing::rejection(&["train"]);
    }

    #[test]
    fn an_unknown_model_or_dataset_lists_the_shipped_configs() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs");
        let names = crate::shipped_configs::names;
        let shipped = names(&root, "train-", "-fashion-mnist.toml");
        for model in ["mlp", "resnet20"] {
            assert!(shipped.iter().any(|m| m == model), "{shipped:?}");
        }
        assert!(names(&root, "train-", "-imagenet.toml").is_empty());
    }
}
