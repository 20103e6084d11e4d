//! `cargo xtask train`: train an image classifier from scratch.
//!
//! ResNet and VGG on image data are the papers' second workload: small enough
//! to run the optimizers to convergence on one machine. They go through the
//! distributed trainer (`terse train <model>` with
//! `configs/train-<model>-<dataset>.toml` or `--config`, on `--ranks`
//! processes). `mlp` is the single-rank MLP of the optimizer tests, on
//! Fashion-MNIST (checked, and installed when running as root).

use anyhow::{Result, bail};
use clap::ValueEnum;

use crate::fashion_mnist;
use crate::not_implemented::{ISSUE_5, NotImplemented, Tracking, cli_name};
use crate::run_args::{Optimizer, RunArgs};
use crate::terse_binary;

/// Arguments of `cargo xtask train`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct Args {
    /// Model architecture
    #[arg(value_enum)]
    pub model: Model,

    /// Dataset to train and test on; defaults to the config's
    #[arg(long, value_enum, value_name = "NAME")]
    pub dataset: Option<Dataset>,

    /// Number of passes over the training data; defaults to the config's
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub epochs: Option<u32>,

    #[command(flatten)]
    pub run: RunArgs,
}

/// An image classifier architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Model {
    /// A 784-128-10 multi-layer perceptron (runs today, on Fashion-MNIST)
    Mlp,
    /// ResNet-18 (1-bit Adam's CIFAR-10 experiment)
    Resnet18,
    /// ResNet-20, the small CIFAR ResNet
    Resnet20,
    /// ResNet-50 (1-bit LAMB's CIFAR-100 experiment)
    Resnet50,
    /// ResNet-110 (SLAMB's CIFAR-10 experiment)
    Resnet110,
    /// VGG-16
    Vgg16,
}

/// An image classification dataset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Dataset {
    /// Fashion-MNIST: 28×28 grey, 10 classes, 60k train / 10k test
    FashionMnist,
    /// MNIST digits: 28×28 grey, 10 classes
    Mnist,
    /// CIFAR-10: 32×32 RGB, 10 classes
    Cifar10,
}

/// Runs `train` for a ResNet or VGG through the trainer.
fn image(args: &Args) -> Result<()> {
    if args.epochs.is_some() {
        bail!(
            "--epochs is for `mlp`; ResNet and VGG runs count optimizer steps \
             (the config's train.steps)"
        );
    }
    let model = cli_name(&args.model);
    let dataset = cli_name(&args.dataset.unwrap_or(Dataset::FashionMnist));
    let config = args
        .run
        .config_or(&format!("configs/train-{model}-{dataset}.toml"))?;
    let mut terse = vec!["train".to_string(), model, "--dataset".into(), dataset];
    terse.extend(args.run.terse_args(&config));
    terse_binary::train(args.run.ranks as usize, &terse)
}

/// Runs `train`.
pub fn run(args: &Args) -> Result<()> {
    if args.model != Model::Mlp {
        return image(args);
    }
    if args.run.ranks > 1
        || !matches!(args.dataset, None | Some(Dataset::FashionMnist))
        || args.run.resume
        || args.run.run_dir.is_some()
    {
        bail!(
            "`mlp` is the single-rank Fashion-MNIST MLP (--epochs, --optimizer, --config); \
             --ranks, --resume and --run-dir are for the ResNet and VGG runs"
        );
    }
    let optimizer = match args.run.optimizer {
        None | Some(Optimizer::Adam) => "adam",
        Some(Optimizer::Lamb) => "lamb",
        Some(Optimizer::Sgd) => "sgd",
        Some(other) => {
            let what = format!("train mlp --optimizer {}", cli_name(&other));
            return Err(NotImplemented::new(what, Tracking::In(ISSUE_5)).into());
        }
    };
    let data_dir = fashion_mnist::ensure()?;
    let mut terse_args = vec!["train".to_string(), "mlp".to_string()];
    match &args.run.config {
        Some(config) => terse_args.extend(["--config".into(), config.display().to_string()]),
        None => terse_args.extend(["--optimizer".into(), optimizer.into()]),
    }
    if let Some(epochs) = args.epochs {
        terse_args.extend(["--epochs".into(), epochs.to_string()]);
    }
    terse_args.extend(["--data-dir".into(), data_dir.display().to_string()]);
    terse_binary::run(&terse_args)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::Command;
    use crate::run_args::Optimizer;
    use crate::testing;

    fn args(argv: &[&str]) -> Args {
        match testing::command(argv) {
            Command::Train(args) => args,
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn parses_model_dataset_and_run_options() {
        let args = args(&[
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
        ]);
        assert_eq!(args.model, Model::Resnet20);
        assert_eq!(args.dataset, Some(Dataset::FashionMnist));
        assert_eq!(args.run.optimizer, Some(Optimizer::Slamb));
        assert_eq!(args.run.ranks, 8);
        assert_eq!(args.run.config, Some(PathBuf::from("configs/resnet.toml")));
    }

    #[test]
    fn model_and_dataset_names() {
        for (name, model) in [
            ("resnet18", Model::Resnet18),
            ("resnet20", Model::Resnet20),
            ("resnet50", Model::Resnet50),
            ("resnet110", Model::Resnet110),
            ("vgg16", Model::Vgg16),
        ] {
            assert_eq!(args(&["train", name]).model, model);
        }
        for (name, dataset) in [
            ("fashion-mnist", Dataset::FashionMnist),
            ("mnist", Dataset::Mnist),
            ("cifar10", Dataset::Cifar10),
        ] {
            assert_eq!(
                args(&["train", "vgg16", "--dataset", name]).dataset,
                Some(dataset)
            );
        }
    }

    #[test]
    fn rejects_missing_or_unknown_model_and_dataset() {
        testing::rejection(&["train"]);
        let model = testing::rejection(&["train", "alexnet"]);
        assert!(
            model.contains("resnet20") && model.contains("vgg16"),
            "{model}"
        );
        let dataset = testing::rejection(&["train", "resnet18", "--dataset", "imagenet"]);
        for valid in ["fashion-mnist", "mnist", "cifar10"] {
            assert!(dataset.contains(valid), "{valid} not listed:\n{dataset}");
        }
    }

    #[test]
    fn mlp_options_that_belong_to_the_trainer_are_refused() {
        let err = run(&args(&["train", "mlp", "--ranks", "2"])).unwrap_err();
        assert!(err.to_string().contains("--ranks"), "{err}");
        let err = testing::not_implemented(&["train", "mlp", "--optimizer", "onebit-adam"]);
        assert_eq!(err.command, "train mlp --optimizer onebit-adam");
        assert_eq!(err.tracking.issue().number, 5);
    }

    #[test]
    fn mlp_takes_epochs() {
        let args = args(&["train", "mlp", "--epochs", "3", "--optimizer", "lamb"]);
        assert_eq!((args.model, args.epochs), (Model::Mlp, Some(3)));
        testing::rejection(&["train", "mlp", "--epochs", "0"]);
    }
}
