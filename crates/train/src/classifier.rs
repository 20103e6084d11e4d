//! A single-rank image-classifier run: an MLP on Fashion-MNIST, trained with
//! any terse-optim optimizer through burn autodiff on the flex CPU backend,
//! tested on the full test split after every epoch.

use std::path::Path;
use std::time::Instant;
use terse_optim::WithMoments;

use burn::module::Module;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::tensor::{Device, Int, Tensor, TensorData};
use serde::{Deserialize, Serialize};
use terse_comm::SingleRank;
use terse_data::FashionMnist;
use terse_models::{Mlp, MlpConfig};
use terse_optim::{
    AdamConfig, LambConfig, LrSchedule, Optimizer, OptimizerConfig, ParamLayout, SgdConfig,
};

use crate::progress::step_bar;
use crate::step::descend;
use crate::{TrainError, shuffled_indices};

/// What to train and how: the `[run]`-less TOML of `configs/mlp-*.toml`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassifierRun {
    /// The optimizer.
    pub optimizer: OptimizerConfig,
    /// Its learning-rate schedule, over optimizer steps.
    pub schedule: LrSchedule,
    /// Hidden layer widths of the MLP.
    pub hidden: Vec<usize>,
    /// Passes over the training split.
    pub epochs: usize,
    /// Examples per step.
    pub batch_size: usize,
    /// Seeds model initialisation and shuffling.
    pub seed: u64,
}

/// What one epoch achieved.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EpochReport {
    /// The epoch, from 1.
    pub epoch: usize,
    /// Mean training loss over the epoch's steps.
    pub train_loss: f64,
    /// Accuracy on the whole test split after the epoch.
    pub test_accuracy: f64,
    /// Wall time of the epoch's training (testing excluded).
    pub seconds: f64,
}

impl ClassifierRun {
    /// The tuned default for `optimizer` (`adam`, `lamb` or `sgd`): a
    /// 784-128-10 MLP, 5 epochs of batch 128 at a constant rate picked from a
    /// small sweep (LAMB: 0.01 of {0.01, 0.02, 0.05, 0.1}; SGD: 0.05 of {0.05,
    /// 0.1}); `configs/mlp-fashion-mnist-*.toml` hold the same values.
    pub fn fashion_mnist_default(optimizer: &str) -> Result<Self, TrainError> {
        let (optimizer, lr) = match optimizer {
            "adam" => (OptimizerConfig::Adam(AdamConfig::default()), 1e-3),
            "lamb" => (
                OptimizerConfig::Lamb(LambConfig::default().with_weight_decay(0.01)),
                0.01,
            ),
            "sgd" => (OptimizerConfig::Sgd(SgdConfig::default()), 0.05),
            other => {
                return Err(TrainError::InvalidRun {
                    field: "optimizer",
                    reason: format!("`{other}` has no MLP default (adam, lamb, sgd)"),
                });
            }
        };
        Ok(Self {
            optimizer,
            schedule: LrSchedule::Constant { lr },
            hidden: vec![128],
            epochs: 5,
            batch_size: 128,
            seed: 17,
        })
    }

    /// Steps per epoch on a training split of `n` examples (the last partial
    /// batch is dropped so every step sees `batch_size` examples).
    pub fn steps_per_epoch(&self, n: usize) -> usize {
        n / self.batch_size
    }

    /// Trains on Fashion-MNIST from `data_dir`, calling `on_epoch` after each
    /// epoch; shows a progress bar with ETA and live loss when `progress`.
    pub fn train_fashion_mnist(
        &self,
        data_dir: &Path,
        progress: bool,
        mut on_epoch: impl FnMut(&EpochReport),
    ) -> Result<Vec<EpochReport>, TrainError> {
        if self.batch_size == 0 || self.epochs == 0 {
            return Err(TrainError::InvalidRun {
                field: if self.batch_size == 0 {
                    "batch_size"
                } else {
                    "epochs"
                },
                reason: "must be at least 1".into(),
            });
        }
        let train = FashionMnist::load(data_dir, true)?;
        let test = FashionMnist::load(data_dir, false)?;
        let features = train.images.rows * train.images.cols;

        let device = Device::flex().autodiff();
        device.seed(self.seed);
        let mut model = MlpConfig {
            input: features,
            hidden: self.hidden.clone(),
            classes: FashionMnist::CLASSES.len(),
        }
        .init(&device);
        let layout = ParamLayout::from_module(&model);
        let comm = SingleRank::new();
        let mut optimizer =
            Optimizer::new(self.optimizer.clone(), self.schedule.clone(), layout, &comm)?;
        let loss_fn = CrossEntropyLossConfig::new().init(&device);

        let steps = self.steps_per_epoch(train.len());
        let bar = step_bar((steps * self.epochs) as u64, progress);

        let mut reports = Vec::with_capacity(self.epochs);
        for epoch in 1..=self.epochs {
            bar.set_prefix(format!("epoch {epoch}/{}", self.epochs));
            let start = Instant::now();
            let order = shuffled_indices(train.len(), self.seed ^ (epoch as u64) << 32);
            let mut loss_sum = 0.0f64;
            for step in 0..steps {
                let batch = &order[step * self.batch_size..(step + 1) * self.batch_size];
                let (x, y) = train.gather(batch.iter().copied());
                let x =
                    Tensor::<2>::from_data(TensorData::new(x, [batch.len(), features]), &device);
                let y = Tensor::<1, Int>::from_data(TensorData::new(y, [batch.len()]), &device);
                let loss = loss_fn.forward(model.forward(x), y);
                let (stepped, loss) = descend(model, loss, &mut optimizer, &comm, &bar)?;
                model = stepped;
                loss_sum += f64::from(loss);
            }
            let seconds = start.elapsed().as_secs_f64();
            let report = EpochReport {
                epoch,
                train_loss: loss_sum / steps.max(1) as f64,
                test_accuracy: test_accuracy(&model, &test, &device),
                seconds,
            };
            bar.suspend(|| on_epoch(&report));
            reports.push(report);
        }
        bar.finish_and_clear();
        Ok(reports)
    }
}

/// Accuracy over the whole split, evaluated without autodiff.
fn test_accuracy(model: &Mlp, test: &FashionMnist, device: &Device) -> f64 {
    let (features, labels) = test.batch(0..test.len());
    let shape = [test.len(), test.images.rows * test.images.cols];
    let x = Tensor::<2>::from_data(TensorData::new(features, shape), &device.clone().inner());
    let logits = model.valid().forward(x);
    let predictions: Vec<i64> = logits.argmax(1).into_data().iter::<i64>().collect();
    terse_eval::accuracy(&predictions, &labels)
}
