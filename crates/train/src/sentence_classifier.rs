//! A single-rank fine-tuning run of a pretrained BERT on sentence(-pair)
//! classification (GLUE or a stand-in): the HuggingFace weights loaded into
//! `BertForSequenceClassification`, AdamW with linear warmup and decay as
//! in BERT's fine-tuning recipe (Devlin et al. 2019, §A.3), accuracy on the
//! held-out split after every epoch. The distributed trainer of issue 8 will
//! take the same pieces across ranks.

use std::path::Path;
use std::time::Instant;

use burn::module::Module;
use burn::tensor::Device;
use serde::{Deserialize, Serialize};
use terse_comm::SingleRank;
use terse_data::glue::ClassificationFeature;
use terse_models::bert::{BertConfig, BertForSequenceClassification, load_hf};
use terse_optim::{AdamConfig, LrSchedule, Optimizer, OptimizerConfig, ParamLayout};

use crate::batch::classification_batch;
use crate::progress::step_bar;
use crate::step::descend;
use crate::{EpochReport, TrainError, shuffled_indices};

/// How to fine-tune.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SentenceClassifierRun {
    /// The optimizer.
    pub optimizer: OptimizerConfig,
    /// Peak learning rate of the linear warmup / linear decay schedule.
    pub peak_lr: f64,
    /// Share of the steps spent warming up.
    pub warmup_fraction: f64,
    /// Passes over the training split.
    pub epochs: usize,
    /// Examples per step.
    pub batch_size: usize,
    /// Seeds the classifier's initialisation and the shuffles.
    pub seed: u64,
}

impl Default for SentenceClassifierRun {
    /// BERT's recipe at the small end of its grid: AdamW (weight decay 0.01),
    /// peak 5e-5 with 10% warmup, batch 32, 2 epochs.
    fn default() -> Self {
        Self {
            optimizer: OptimizerConfig::Adam(AdamConfig {
                weight_decay: 0.01,
                ..Default::default()
            }),
            peak_lr: 5e-5,
            warmup_fraction: 0.1,
            epochs: 2,
            batch_size: 32,
            seed: 1,
        }
    }
}

/// The task a run fine-tunes on.
#[derive(Debug, Clone, Copy)]
pub struct ClassificationTask<'a> {
    /// Number of classes.
    pub labels: usize,
    /// The `[PAD]` id of the tokenizer the features were made with.
    pub pad_id: u32,
    /// Training inputs, with class labels.
    pub train: &'a [ClassificationFeature],
    /// Held-out inputs, with class labels.
    pub dev: &'a [ClassificationFeature],
}

impl SentenceClassifierRun {
    /// Fine-tunes the BERT of `config` with the weights in `weights`
    /// (HuggingFace safetensors) on `task.train`, reporting accuracy on
    /// `task.dev` after every epoch.
    pub fn train(
        &self,
        config: &BertConfig,
        weights: &Path,
        task: ClassificationTask<'_>,
        progress: bool,
        mut on_epoch: impl FnMut(&EpochReport),
    ) -> Result<Vec<EpochReport>, TrainError> {
        let ClassificationTask {
            labels,
            pad_id,
            train,
            dev,
        } = task;
        if self.batch_size == 0 || self.epochs == 0 || train.len() < self.batch_size {
            return Err(TrainError::InvalidRun {
                field: "batch_size",
                reason: format!(
                    "batch {} and {} epochs over {} examples",
                    self.batch_size,
                    self.epochs,
                    train.len()
                ),
            });
        }
        let device = Device::flex().autodiff();
        device.seed(self.seed);
        let mut model = BertForSequenceClassification::new(config, labels, &device);
        load_hf(&mut model, weights).map_err(|e| TrainError::InvalidRun {
            field: "weights",
            reason: e.to_string(),
        })?;
        let steps = train.len() / self.batch_size;
        let total = (steps * self.epochs) as u64;
        let schedule = LrSchedule::LinearWarmupLinearDecay {
            peak: self.peak_lr,
            warmup_steps: (total as f64 * self.warmup_fraction).round() as u64,
            total_steps: total,
        };
        let comm = SingleRank::new();
        let layout = ParamLayout::from_module(&model);
        let mut optimizer = Optimizer::new(self.optimizer.clone(), schedule, layout, &comm)?;
        let bar = step_bar(total, progress);
        let mut reports = Vec::with_capacity(self.epochs);
        for epoch in 1..=self.epochs {
            bar.set_prefix(format!("epoch {epoch}/{}", self.epochs));
            let start = Instant::now();
            let order = shuffled_indices(train.len(), self.seed ^ (epoch as u64) << 32);
            let mut loss_sum = 0.0f64;
            for step in 0..steps {
                let rows: Vec<ClassificationFeature> = order
                    [step * self.batch_size..(step + 1) * self.batch_size]
                    .iter()
                    .map(|&i| train[i].clone())
                    .collect();
                let batch = classification_batch(&rows, pad_id, &device)?;
                let classes = batch.classes.ok_or_else(|| TrainError::InvalidRun {
                    field: "labels",
                    reason: "training examples need class labels".into(),
                })?;
                let loss = model.classification_loss(model.forward(batch.input), classes);
                let (stepped, loss) = descend(model, loss, &mut optimizer, &comm, &bar)?;
                model = stepped;
                loss_sum += f64::from(loss);
            }
            let seconds = start.elapsed().as_secs_f64();
            let report = EpochReport {
                epoch,
                train_loss: loss_sum / steps as f64,
                test_accuracy: accuracy(&model, dev, pad_id, &device)?,
                seconds,
            };
            bar.suspend(|| on_epoch(&report));
            reports.push(report);
        }
        bar.finish_and_clear();
        Ok(reports)
    }
}

/// Accuracy on `dev`, without autodiff or dropout, in batches of 64.
fn accuracy(
    model: &BertForSequenceClassification,
    dev: &[ClassificationFeature],
    pad_id: u32,
    device: &Device,
) -> Result<f64, TrainError> {
    let model = model.valid();
    let device = device.clone().inner();
    let (mut predictions, mut labels) = (Vec::new(), Vec::new());
    for chunk in dev.chunks(64) {
        let batch = classification_batch(chunk, pad_id, &device)?;
        let logits = model.forward(batch.input);
        predictions.extend(logits.argmax(1).into_data().iter::<i64>());
        let classes = batch.classes.ok_or_else(|| TrainError::InvalidRun {
            field: "labels",
            reason: "held-out examples need class labels".into(),
        })?;
        labels.extend(classes.into_data().iter::<i64>());
    }
    Ok(terse_eval::accuracy(&predictions, &labels))
}
