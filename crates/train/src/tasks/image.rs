//! Image classification: any image model of terse-models' registry
//! ([`terse_models::ModelConfig::with_image_model`]: MLP, ResNet, VGG) on Fashion-MNIST,
//! the MNIST sample or CIFAR, with the augmentation keyed by `(seed, epoch, image)` so any
//! rank and any resume sees the same crops and flips; accuracy on the whole
//! test split.

use std::path::Path;

use burn::nn::loss::CrossEntropyLossConfig;
use burn::tensor::{Device, Int, Tensor, TensorData};
use terse_data::images::{FASHION_MNIST_MEAN, FASHION_MNIST_STD, MNIST_MEAN, MNIST_STD};
use terse_data::{
    Augment, CifarKind, ImageSet, dataset, read_cifar_split, read_idx_images, read_idx_labels,
    read_mnist_csv,
};
use terse_models::{ImageClassifier, ImageModelVisitor};

use crate::dispatch::TaskAction;
use crate::task::{Task, eval_range, exact_f32};
use crate::{RunConfig, TaskConfig, TrainError};

/// An image-classification task of a run.
pub struct ImageTask<M: ImageClassifier> {
    train: ImageSet,
    test: ImageSet,
    augment: Augment,
    plain: Augment,
    config: M::Config,
    seed: u64,
}

/// The image datasets `task.dataset` names (`read_images` reads each).
pub const IMAGE_DATASETS: [&str; 4] = ["fashion-mnist", "mnist", "cifar10", "cifar100"];

/// Train and test splits of a dataset name, and its normalization.
fn read_images(
    name: &str,
    dir: Option<&Path>,
) -> Result<(ImageSet, ImageSet, Vec<f32>, Vec<f32>), TrainError> {
    let cifar = |kind| -> Result<_, TrainError> {
        let dir = dir.ok_or_else(|| TrainError::InvalidRun {
            field: "task.dir",
            reason: format!("{name} is not downloadable here: set dir to its binary files"),
        })?;
        let stats = (
            terse_data::images::CIFAR10_MEAN.to_vec(),
            terse_data::images::CIFAR10_STD.to_vec(),
        );
        Ok((
            read_cifar_split(dir, kind, true)?,
            read_cifar_split(dir, kind, false)?,
            stats.0,
            stats.1,
        ))
    };
    if !name.starts_with("cifar")
        && let Some(dir) = dir
    {
        // fashion-mnist and mnist come from terse's checksummed sources:
        // a dir set for them would be silently ignored.
        return Err(TrainError::InvalidRun {
            field: "task.dir",
            reason: format!(
                "{name} is read from terse's own checksummed copy, not from {}: remove dir \
                 (it is for cifar10 and cifar100)",
                dir.display()
            ),
        });
    }
    match name {
        "fashion-mnist" => {
            let dir = dataset("fashion-mnist")?;
            let split = |prefix: &str| -> Result<ImageSet, TrainError> {
                let images = read_idx_images(&dir.join(format!("{prefix}-images-idx3-ubyte")))?;
                let labels = read_idx_labels(&dir.join(format!("{prefix}-labels-idx1-ubyte")))?;
                Ok(ImageSet::from_idx(images, &labels)?)
            };
            Ok((
                split("train")?,
                split("t10k")?,
                FASHION_MNIST_MEAN.to_vec(),
                FASHION_MNIST_STD.to_vec(),
            ))
        }
        "mnist" => {
            let all = read_mnist_csv(&dataset("mnist-5k")?.join("mnist_5k.csv.gz"))?;
            let cut = all.len() * 4 / 5;
            let (train, test) = split_set(&all, cut)?;
            Ok((train, test, MNIST_MEAN.to_vec(), MNIST_STD.to_vec()))
        }
        "cifar10" => cifar(CifarKind::Cifar10),
        "cifar100" => cifar(CifarKind::Cifar100),
        other => Err(TrainError::InvalidRun {
            field: "task.dataset",
            reason: format!("unknown `{other}` ({})", IMAGE_DATASETS.join(", ")),
        }),
    }
}

/// The first `cut` images and the rest.
fn split_set(all: &ImageSet, cut: usize) -> Result<(ImageSet, ImageSet), TrainError> {
    let n = all.image_bytes();
    let part = |range: std::ops::Range<usize>| {
        ImageSet::new(
            all.channels,
            all.height,
            all.width,
            all.pixels[range.start * n..range.end * n].to_vec(),
            all.labels[range].to_vec(),
        )
    };
    Ok((part(0..cut)?, part(cut..all.len())?))
}

impl<M: ImageClassifier> ImageTask<M> {
    /// Reads the dataset `config` names (fetched and checked), for the model
    /// `model`.
    pub fn prepare(config: &RunConfig, model: &M::Config) -> Result<Self, TrainError> {
        let TaskConfig::Image {
            dataset,
            dir,
            augment,
        } = &config.task
        else {
            return Err(TrainError::InvalidRun {
                field: "task.kind",
                reason: "not an image task".into(),
            });
        };
        let (train, test, mean, std) = read_images(dataset, dir.as_deref())?;
        let plain = Augment::normalize_only(&mean, &std);
        let augment = if *augment {
            Augment {
                mean,
                std,
                ..Augment::cifar10()
            }
        } else {
            plain.clone()
        };
        tracing::info!(
            "{}: {} training and {} test images",
            M::name(model),
            train.len(),
            test.len()
        );
        Ok(Self {
            train,
            test,
            augment,
            plain,
            config: model.clone(),
            seed: config.train.seed,
        })
    }

    /// Training and test image counts.
    pub fn sizes(&self) -> (usize, usize) {
        (self.train.len(), self.test.len())
    }

    fn images(
        &self,
        set: &ImageSet,
        indices: &[usize],
        epoch: u64,
        train: bool,
        device: &Device,
    ) -> Result<Tensor<4>, TrainError> {
        let augment = if train { &self.augment } else { &self.plain };
        let pixels = augment.batch(set, indices, self.seed, epoch, train)?;
        let shape = [indices.len(), set.channels, set.height, set.width];
        Ok(Tensor::from_data(TensorData::new(pixels, shape), device))
    }
}

fn labels(set: &ImageSet, indices: &[usize], device: &Device) -> Tensor<1, Int> {
    let values: Vec<i64> = indices.iter().map(|&i| i64::from(set.labels[i])).collect();
    Tensor::from_data(TensorData::new(values, [indices.len()]), device)
}

/// Test images per evaluation batch.
const EVAL_BATCH: usize = 256;

impl<M: ImageClassifier> Task for ImageTask<M> {
    type Model = M;

    fn examples(&self) -> usize {
        self.train.len()
    }

    fn init(&self, device: &Device) -> Result<M, TrainError> {
        Ok(M::build(&self.config, device))
    }

    fn loss(
        &self,
        model: &M,
        examples: &[usize],
        epoch: u64,
        device: &Device,
    ) -> Result<Tensor<1>, TrainError> {
        let x = self.images(&self.train, examples, epoch, true, device)?;
        let y = labels(&self.train, examples, device);
        Ok(CrossEntropyLossConfig::new()
            .init(device)
            .forward(model.logits(x), y))
    }

    /// Batches of 256 test images.
    fn eval_batches(&self) -> usize {
        self.test.len().div_ceil(EVAL_BATCH)
    }

    /// The predicted classes of test batch `batch`.
    fn eval_batch(&self, model: &M, batch: usize, device: &Device) -> Result<Vec<f32>, TrainError> {
        let chunk: Vec<usize> = eval_range(batch, EVAL_BATCH, self.test.len()).collect();
        let x = self.images(&self.test, &chunk, 0, false, device)?;
        let predicted = model.logits(x).argmax(1).into_data();
        Ok(predicted.iter::<i64>().map(exact_f32).collect())
    }

    fn eval_metrics(&self, outputs: &[Vec<f32>]) -> Result<Vec<(String, f64)>, TrainError> {
        let predictions: Vec<i64> = outputs.iter().flatten().map(|&c| c as i64).collect();
        let gold: Vec<i64> = self.test.labels.iter().map(|&l| i64::from(l)).collect();
        Ok(vec![(
            "test_accuracy".into(),
            terse_eval::accuracy(&predictions, &gold),
        )])
    }
}

/// Prepares the image task of `config` for the model its `[model]` names
/// (the registry: [`terse_models::ModelConfig::with_image_model`]) and hands it to `action`.
pub(crate) fn with_image_task<A: TaskAction>(
    config: &RunConfig,
    action: A,
) -> Result<A::Output, TrainError> {
    struct Prepare<'a, A> {
        config: &'a RunConfig,
        action: A,
    }
    impl<A: TaskAction> ImageModelVisitor for Prepare<'_, A> {
        type Output = Result<A::Output, TrainError>;
        fn visit<M: ImageClassifier>(self, model: &M::Config) -> Self::Output {
            self.action
                .act(ImageTask::<M>::prepare(self.config, model)?)
        }
    }
    config
        .model
        .as_ref()
        .and_then(|model| model.with_image_model(Prepare { config, action }))
        .unwrap_or_else(|| {
            Err(TrainError::InvalidRun {
                field: "model.kind",
                reason: "an image task needs a [model] that classifies images (not BERT)".into(),
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dir_beside_a_fetched_dataset_is_refused_not_ignored() {
        for name in ["fashion-mnist", "mnist"] {
            let refused = read_images(name, Some(Path::new("/data/mine")))
                .err()
                .unwrap();
            let said = refused.to_string();
            assert!(
                said.contains("task.dir") && said.contains("/data/mine"),
                "{said}"
            );
        }
    }
}
