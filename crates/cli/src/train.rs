//! `terse train`: train an image classifier on one rank.
//!
//! Only the MLP on Fashion-MNIST exists so far (the ResNet and VGG models and
//! multi-rank training come with the models and trainer issues); the command
//! already takes its settings from a config file or the tuned defaults.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::ValueEnum;
use terse_data::FASHION_MNIST_DEBIAN_DIR;
use terse_train::ClassifierRun;

/// Arguments of `terse train`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The model to train
    #[arg(value_enum)]
    model: Model,

    /// Dataset to train and test on
    #[arg(long, value_enum, default_value = "fashion-mnist")]
    dataset: Dataset,

    /// TOML run config (see configs/mlp-fashion-mnist-*.toml); default: the
    /// tuned settings of --optimizer
    #[arg(long, value_name = "PATH", conflicts_with = "optimizer")]
    config: Option<PathBuf>,

    /// Optimizer whose tuned defaults to use when no --config is given
    #[arg(long, value_name = "NAME", default_value = "adam",
          value_parser = ["adam", "lamb", "sgd"])]
    optimizer: String,

    /// Override the number of epochs
    #[arg(long, value_name = "N")]
    epochs: Option<usize>,

    /// Directory holding the four Fashion-MNIST `*-ubyte.gz` files
    #[arg(long, value_name = "DIR", default_value = FASHION_MNIST_DEBIAN_DIR)]
    data_dir: PathBuf,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Model {
    /// A multi-layer perceptron (hidden widths from the config)
    Mlp,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Dataset {
    /// Fashion-MNIST: 28×28 grey, 10 classes, 60k train / 10k test
    FashionMnist,
}

pub fn run(args: &Args) -> Result<()> {
    let Model::Mlp = args.model;
    let Dataset::FashionMnist = args.dataset;
    let mut run = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read config {}", path.display()))?;
            toml::from_str::<ClassifierRun>(&text)
                .with_context(|| format!("invalid config {}", path.display()))?
        }
        None => ClassifierRun::fashion_mnist_default(&args.optimizer)?,
    };
    if let Some(epochs) = args.epochs {
        run.epochs = epochs;
    }
    if run.epochs == 0 {
        bail!("--epochs must be at least 1");
    }
    println!(
        "terse train mlp: Fashion-MNIST, hidden {:?}, optimizer {}, {} epochs of batch {}, seed {}",
        run.hidden,
        run.optimizer.name(),
        run.epochs,
        run.batch_size,
        run.seed
    );
    let reports = run.train_fashion_mnist(&args.data_dir, true, |r| {
        println!(
            "epoch {}: train loss {:.4}, test accuracy {:.2}% ({:.1} s)",
            r.epoch,
            r.train_loss,
            100.0 * r.test_accuracy,
            r.seconds
        );
    })?;
    let last = reports.last().expect("at least one epoch ran");
    let seconds: f64 = reports.iter().map(|r| r.seconds).sum();
    println!(
        "done: test accuracy {:.2}% after {} epochs, {:.1} s of training",
        100.0 * last.test_accuracy,
        reports.len(),
        seconds
    );
    Ok(())
}
