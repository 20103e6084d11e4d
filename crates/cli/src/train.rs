//! `terse train`: train an image classifier and report its test accuracy.
//!
//! `mlp` is the single-rank MLP of the optimizer tests (settings from
//! `configs/mlp-fashion-mnist-*.toml` or the tuned defaults); ResNet and VGG
//! go through the distributed trainer with a run config, by default
//! `configs/train-<model>-<dataset>.toml`.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::ValueEnum;
use terse_data::FASHION_MNIST_DEBIAN_DIR;
use terse_models::{ModelConfig, Resnet, Vgg};
use terse_train::tasks::ImageTask;
use terse_train::{ClassifierRun, Override};

use crate::launch::{RunOptions, train};

/// Arguments of `terse train`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The model to train
    #[arg(value_enum)]
    model: Model,

    /// Dataset to train and test on
    #[arg(long, value_enum, default_value = "fashion-mnist")]
    dataset: Dataset,

    /// TOML run config; default: for `mlp` the tuned settings of
    /// --optimizer, otherwise configs/train-<model>-<dataset>.toml
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,

    /// Optimizer: for `mlp` whose tuned defaults to use (adam, lamb, sgd;
    /// default adam); otherwise replaces the config's optimizer
    #[arg(long, value_name = "NAME")]
    optimizer: Option<String>,

    /// Override the number of epochs (`mlp`)
    #[arg(long, value_name = "N")]
    epochs: Option<usize>,

    /// Override train.steps (ResNet / VGG)
    #[arg(long, value_name = "N")]
    steps: Option<u64>,

    /// Set any config field (ResNet / VGG), e.g. `--set train.seed=3`
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = Override::parse)]
    overrides: Vec<Override>,

    /// Directory holding the four Fashion-MNIST `*-ubyte.gz` files (`mlp`)
    #[arg(long, value_name = "DIR", default_value = FASHION_MNIST_DEBIAN_DIR)]
    data_dir: PathBuf,

    /// Run directory (ResNet / VGG; default runs/<config>-<optimizer>)
    #[arg(long, value_name = "DIR")]
    run_dir: Option<PathBuf>,

    /// Continue from the newest checkpoint in the run directory
    #[arg(long)]
    resume: bool,

    /// Ranks as threads of this process (ignored under mpirun)
    #[arg(long, value_name = "N", default_value_t = 1)]
    ranks: usize,

    /// No progress bar
    #[arg(long)]
    no_progress: bool,

    /// Print the resolved config and exit without training (ResNet / VGG)
    #[arg(long)]
    print_config: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Model {
    /// A multi-layer perceptron (hidden widths from the config)
    Mlp,
    /// ResNet-20 (CIFAR style)
    Resnet20,
    /// ResNet-56 (CIFAR style)
    Resnet56,
    /// ResNet-110 (CIFAR style)
    Resnet110,
    /// ResNet-18 (ImageNet layout)
    Resnet18,
    /// ResNet-50 (ImageNet layout)
    Resnet50,
    /// VGG-11
    Vgg11,
    /// VGG-16
    Vgg16,
    /// VGG-19
    Vgg19,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Dataset {
    /// Fashion-MNIST: 28×28 grey, 10 classes, 60k train / 10k test
    FashionMnist,
    /// The 5,000-image MNIST sample (4,000 train / 1,000 test)
    Mnist,
    /// CIFAR-10 (needs the config's dir)
    Cifar10,
    /// CIFAR-100 (needs the config's dir)
    Cifar100,
}

fn image(args: &Args) -> Result<()> {
    let model = args.model.to_possible_value().expect("no skipped variants");
    let dataset = args
        .dataset
        .to_possible_value()
        .expect("no skipped variants");
    let config = args.config.clone().unwrap_or_else(|| {
        PathBuf::from(format!(
            "configs/train-{}-{}.toml",
            model.get_name(),
            dataset.get_name()
        ))
    });
    if !config.exists() {
        bail!(
            "{}: no such config; write one (see configs/train-resnet20-fashion-mnist.toml) \
             and pass it with --config",
            config.display()
        );
    }
    let options = RunOptions {
        config,
        steps: args.steps,
        overrides: args.overrides.clone(),
        optimizer: args.optimizer.clone(),
        from: None,
        run_dir: args.run_dir.clone(),
        resume: args.resume,
        ranks: args.ranks,
        no_progress: args.no_progress,
        print_config: args.print_config,
    };
    let config = options.resolve()?;
    if options.printed(&config) {
        return Ok(());
    }
    match &config.model {
        Some(ModelConfig::Resnet(_)) => {
            let task = ImageTask::<Resnet>::prepare(&config)?;
            let (train_n, test_n) = task.sizes();
            tracing::info!("{train_n} training and {test_n} test images");
            train(&options, &config, |_| Ok(&task))
        }
        Some(ModelConfig::Vgg(_)) => {
            let task = ImageTask::<Vgg>::prepare(&config)?;
            let (train_n, test_n) = task.sizes();
            tracing::info!("{train_n} training and {test_n} test images");
            train(&options, &config, |_| Ok(&task))
        }
        _ => bail!(
            "{}: [model] must be kind = \"resnet\" or \"vgg\"",
            options.config.display()
        ),
    }
}

pub fn run(args: &Args) -> Result<()> {
    if args.model != Model::Mlp {
        return image(args);
    }
    let Dataset::FashionMnist = args.dataset else {
        bail!("the MLP trains on fashion-mnist only");
    };
    if args.config.is_some() && args.optimizer.is_some() {
        bail!("`mlp` takes --config or --optimizer (whose tuned defaults to use), not both");
    }
    if args.steps.is_some()
        || !args.overrides.is_empty()
        || args.run_dir.is_some()
        || args.resume
        || args.ranks != 1
        || args.print_config
    {
        bail!(
            "--steps, --set, --run-dir, --resume, --ranks and --print-config are for ResNet / \
             VGG; \
             `mlp` takes --epochs"
        );
    }
    let mut run = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read config {}", path.display()))?;
            toml::from_str::<ClassifierRun>(&text)
                .with_context(|| format!("invalid config {}", path.display()))?
        }
        None => ClassifierRun::fashion_mnist_default(args.optimizer.as_deref().unwrap_or("adam"))?,
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
