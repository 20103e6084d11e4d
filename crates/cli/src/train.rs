//! `terse train`: train an image classifier (any image model of
//! terse-models: `mlp`, `resnet20` … `resnet152`, `vgg11` … `vgg19`) from a
//! run config, by default `configs/train-<model>-<dataset>.toml`.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};
use terse_train::{RunConfig, TaskConfig};

use crate::launch::RunFlags;

/// The dataset of `terse train MODEL` when `--dataset` is not given.
const DEFAULT_DATASET: &str = "fashion-mnist";

/// Arguments of `terse train`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The model (mlp, resnet20…resnet152, vgg11…vgg19): picks the shipped
    /// config configs/train-<MODEL>-<DATASET>.toml (shipped: mlp and
    /// resnet20 on fashion-mnist; other pairs need --config), and must be
    /// the model of --config when both are given
    #[arg(value_name = "MODEL")]
    model: Option<String>,

    /// The dataset (fashion-mnist, mnist, cifar10, cifar100) [default:
    /// fashion-mnist]: picks the shipped config with MODEL (one ships for
    /// fashion-mnist), and must be the dataset of --config when both are
    /// given
    #[arg(long, value_name = "NAME")]
    dataset: Option<String>,

    /// TOML run config [default: configs/train-<MODEL>-<DATASET>.toml]
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,

    #[command(flatten)]
    flags: RunFlags,
}

pub fn run(args: &Args) -> Result<()> {
    let config = match (&args.config, &args.model) {
        (Some(config), _) => config.clone(),
        (None, Some(model)) => shipped_config(
            &crate::shipped::dir(),
            model,
            args.dataset.as_deref().unwrap_or(DEFAULT_DATASET),
        )?,
        (None, None) => bail!("name a MODEL (e.g. `terse train mlp`) or pass --config"),
    };
    args.flags
        .run_checked(&config, "image", |resolved| agrees(args, resolved))
}

/// The shipped config of `model` on `dataset` in `dir`, or an error saying
/// how to run another (`cargo xtask train` lists the shipped ones).
fn shipped_config(dir: &Path, model: &str, dataset: &str) -> Result<PathBuf> {
    let path = dir.join(format!("train-{model}-{dataset}.toml"));
    if !path.exists() {
        bail!(
            "{}: no such config; write one (see configs/train-resnet20-fashion-mnist.toml) \
             and pass it with --config",
            path.display()
        );
    }
    Ok(path)
}

/// Refuses a config whose model or dataset is not the one the command line
/// names.
fn agrees(args: &Args, config: &RunConfig) -> Result<()> {
    let model = config.model.as_ref().and_then(|m| m.image_model_name());
    if let (Some(wanted), Some(model)) = (&args.model, &model)
        && wanted != model
    {
        bail!("[model] builds {model}, but the command line names {wanted}");
    }
    if let (Some(wanted), TaskConfig::Image { dataset, .. }) = (&args.dataset, &config.task)
        && wanted != dataset
    {
        bail!("task.dataset is {dataset}, but --dataset names {wanted}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn configs() -> PathBuf {
        crate::shipped::for_tests()
    }

    #[test]
    fn a_model_and_dataset_name_their_shipped_config() {
        let path = shipped_config(&configs(), "mlp", "fashion-mnist").unwrap();
        assert!(path.ends_with("train-mlp-fashion-mnist.toml"), "{path:?}");
        let config = RunConfig::load(&path).unwrap();
        assert_eq!(
            config.model.unwrap().image_model_name().as_deref(),
            Some("mlp")
        );
    }

    #[test]
    fn an_unknown_model_names_the_missing_config() {
        let error = shipped_config(&configs(), "alexnet", "fashion-mnist")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("train-alexnet-fashion-mnist.toml: no such config"),
            "{error}"
        );
    }

    #[test]
    fn a_config_of_another_model_or_dataset_is_refused() {
        #[derive(clap::Parser)]
        struct Line {
            #[command(flatten)]
            args: Args,
        }
        let parse = |argv: &[&str]| {
            <Line as clap::Parser>::try_parse_from([&["train"], argv].concat())
                .unwrap()
                .args
        };
        let resnet20 =
            RunConfig::load(&configs().join("train-resnet20-fashion-mnist.toml")).unwrap();
        agrees(
            &parse(&["resnet20", "--dataset", "fashion-mnist"]),
            &resnet20,
        )
        .unwrap();
        agrees(&parse(&["--config", "x.toml"]), &resnet20).unwrap();
        let error = agrees(&parse(&["resnet50", "--config", "x.toml"]), &resnet20).unwrap_err();
        assert_eq!(
            error.to_string(),
            "[model] builds resnet20, but the command line names resnet50"
        );
        let error = agrees(&parse(&["resnet20", "--dataset", "mnist"]), &resnet20).unwrap_err();
        assert_eq!(
            error.to_string(),
            "task.dataset is fashion-mnist, but --dataset names mnist"
        );
    }
}
