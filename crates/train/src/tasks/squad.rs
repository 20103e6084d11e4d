//! SQuAD v1.1 fine-tuning: BERT with a span head on the training windows
//! (run_squad.py's featurization), evaluated as the official script does on
//! the dev questions: n-best spans over every window of a question, the
//! answer cut from the original context, `predictions.json` written, EM and
//! F1 from `evaluate-v1.1.py`'s rules.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::tensor::{Device, Tensor};
use terse_data::squad::{
    SquadExample, SquadFeature, SquadFeatureConfig, SquadFeaturizer, cached_features,
};
use terse_data::{dataset, read_squad};
use terse_eval::{
    AnswerConfig, FeatureLogits, QuestionContext, SquadGold, evaluate, predict_answers,
    write_predictions,
};
use terse_models::bert::{BertForQuestionAnswering, save_hf};

use super::cached_features::log_source;
use super::pick;
use super::weights::Weights;
use crate::batch::squad_batch;
use crate::eval_progress::EvalProgress;
use crate::task::{Task, eval_range};
use crate::{RunConfig, TaskConfig, TrainError};

/// The SQuAD task of a run.
pub struct SquadTask {
    train: Vec<SquadFeature>,
    dev_questions: Vec<SquadExample>,
    dev: Vec<SquadFeature>,
    weights: Weights,
    pad_id: u32,
    predictions: PathBuf,
}

impl SquadTask {
    /// Reads and featurizes SQuAD v1.1 (fetched and checked), the training
    /// windows only when the task will be `trained`; evaluation writes
    /// `predictions`.
    pub fn prepare(
        config: &RunConfig,
        predictions: PathBuf,
        trained: bool,
    ) -> Result<Self, TrainError> {
        let TaskConfig::Squad {
            max_seq,
            doc_stride,
            max_query,
            init,
            dev_questions: dev_limit,
        } = &config.task
        else {
            return Err(TrainError::InvalidRun {
                field: "task.kind",
                reason: "not a SQuAD task".into(),
            });
        };
        let weights = Weights::resolve(init, config.model.as_ref())?;
        let tokenizer = weights.tokenizer.load()?;
        // Before featurizing: a vocabulary or window the model cannot embed
        // would otherwise fail only at the first step.
        weights.check_fits(&tokenizer, *max_seq)?;
        let featurizer = SquadFeaturizer::new(
            &tokenizer,
            SquadFeatureConfig {
                max_seq: *max_seq,
                doc_stride: *doc_stride,
                max_query: *max_query,
            },
        )?;
        let dir = dataset("squad-v1.1")?;
        let train = if trained {
            let file = dir.join("train-v1.1.json");
            features(&featurizer, &file, &read_squad(&file)?)?
        } else {
            Vec::new()
        };
        let file = dir.join("dev-v1.1.json");
        let mut dev_questions = read_squad(&file)?;
        // The whole file's features are the ones cached; a question's
        // windows depend on it alone, and come in question order.
        let mut dev = features(&featurizer, &file, &dev_questions)?;
        if let Some(n) = *dev_limit {
            dev_questions.truncate(n);
            dev.truncate(dev.partition_point(|f| f.example < n));
        }
        let task = Self {
            train,
            dev_questions,
            dev,
            weights,
            pad_id: tokenizer.special().pad,
            predictions,
        };
        let (train, questions, dev) = task.sizes();
        if trained {
            tracing::info!("{train} training windows; {questions} dev questions in {dev} windows");
        } else {
            tracing::info!("{questions} dev questions in {dev} windows");
        }
        Ok(task)
    }

    /// Training windows, dev questions and dev windows.
    pub fn sizes(&self) -> (usize, usize, usize) {
        (self.train.len(), self.dev_questions.len(), self.dev.len())
    }
}

/// The features of `examples`, read from `file`: from the cache where an
/// earlier run left them (`terse_data::squad::cached_features`).
fn features(
    featurizer: &SquadFeaturizer,
    file: &Path,
    examples: &[SquadExample],
) -> Result<Vec<SquadFeature>, TrainError> {
    let started = std::time::Instant::now();
    let cache = terse_data::fetch::cache_dir().join("features");
    let (features, path, source) = cached_features(featurizer, file, examples, &cache)?;
    log_source(
        &file.file_name().unwrap_or_default().to_string_lossy(),
        source,
        &path,
        format!("{} windows", features.len()),
        (format!("{} questions", examples.len()), "featurized"),
        started,
    );
    Ok(features)
}

/// Dev features per evaluation batch.
const EVAL_BATCH: usize = 32;

impl Task for SquadTask {
    type Model = BertForQuestionAnswering;

    fn examples(&self) -> usize {
        self.train.len()
    }

    fn init(&self, device: &Device) -> Result<Self::Model, TrainError> {
        self.weights.loaded(
            BertForQuestionAnswering::new(&self.weights.config, device),
            &[],
        )
    }

    fn loss(
        &self,
        model: &Self::Model,
        examples: &[usize],
        _epoch: u64,
        device: &Device,
    ) -> Result<Tensor<1>, TrainError> {
        let batch = squad_batch(&pick(&self.train, examples), self.pad_id, device)?;
        let (start, end) = model.forward(batch.input);
        Ok(model.loss(start, end, batch.start_positions, batch.end_positions))
    }

    /// Batches of 32 dev features.
    fn eval_batches(&self) -> usize {
        self.dev.len().div_ceil(EVAL_BATCH)
    }

    /// Dev batch `batch`'s start logits, row after row, then its end
    /// logits.
    fn eval_batch(
        &self,
        model: &Self::Model,
        batch: usize,
        device: &Device,
    ) -> Result<Vec<f32>, TrainError> {
        let chunk = &self.dev[eval_range(batch, EVAL_BATCH, self.dev.len())];
        let batch = squad_batch(chunk, self.pad_id, device)?;
        let (start, end) = model.forward(batch.input);
        let mut logits: Vec<f32> = start.into_data().iter::<f32>().collect();
        logits.extend(end.into_data().iter::<f32>());
        Ok(logits)
    }

    /// Exact match and F1 (percent) on the dev questions; writes
    /// `predictions.json`.
    fn eval_metrics(&self, outputs: &[Vec<f32>]) -> Result<Vec<(String, f64)>, TrainError> {
        self.answer(outputs, &self.predictions)
    }

    /// `predictions.json` (question id → answer) at `path`.
    fn predict(
        &self,
        model: &Self::Model,
        device: &Device,
        path: &Path,
        progress: &EvalProgress,
    ) -> Result<usize, TrainError> {
        let outputs = self.eval_outputs(model, device, progress)?;
        self.answer(&outputs, path)?;
        Ok(self.dev_questions.len())
    }

    fn export(&self, model: &Self::Model, dir: &Path) -> Result<(), TrainError> {
        save_hf(&model.clone().valid(), &self.weights.config, dir)?;
        self.weights.tokenizer.export(dir)
    }
}

impl SquadTask {
    /// Answers every dev question from the dev batches' logits
    /// ([`Task::eval_batch`]), writes them to `path` and scores them.
    fn answer(&self, outputs: &[Vec<f32>], path: &Path) -> Result<Vec<(String, f64)>, TrainError> {
        if outputs.len() != self.eval_batches() {
            return Err(TrainError::Batch(format!(
                "logits of {} dev batches for {}",
                outputs.len(),
                self.eval_batches()
            )));
        }
        let mut logits: Vec<(&[f32], &[f32])> = Vec::with_capacity(self.dev.len());
        for (batch, output) in outputs.iter().enumerate() {
            let rows = eval_range(batch, EVAL_BATCH, self.dev.len()).len();
            let (start, end) = output.split_at(output.len() / 2);
            let seq = (start.len() / rows).max(1);
            logits.extend(start.chunks_exact(seq).zip(end.chunks_exact(seq)));
        }
        if logits.len() != self.dev.len() {
            return Err(TrainError::Batch(format!(
                "logits of {} dev features for {}",
                logits.len(),
                self.dev.len()
            )));
        }
        let questions: Vec<QuestionContext<'_>> = self
            .dev_questions
            .iter()
            .map(|q| QuestionContext {
                id: &q.id,
                context: &q.context,
            })
            .collect();
        let features: Vec<FeatureLogits<'_>> = self
            .dev
            .iter()
            .zip(&logits)
            .map(|(f, (start, end))| FeatureLogits {
                example: f.example,
                offsets: &f.offsets,
                max_context: &f.max_context,
                start_logits: start,
                end_logits: end,
            })
            .collect();
        let answers = predict_answers(&questions, &features, &AnswerConfig::default())
            .map_err(|e| TrainError::Batch(e.to_string()))?;
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|source| TrainError::Io {
                path: parent.to_path_buf(),
                source,
            })?;
        }
        write_predictions(path, &questions, &answers)
            .map_err(|e| TrainError::Batch(e.to_string()))?;
        let gold: Vec<SquadGold> = self
            .dev_questions
            .iter()
            .map(|q| SquadGold {
                id: q.id.clone(),
                answers: q.answers.iter().map(|a| a.text.clone()).collect(),
            })
            .collect();
        let predicted: HashMap<String, String> = self
            .dev_questions
            .iter()
            .zip(&answers)
            .map(|(q, a)| (q.id.clone(), a.text.clone()))
            .collect();
        let score = evaluate(&gold, &predicted);
        Ok(vec![
            ("exact_match".into(), score.exact_match),
            ("f1".into(), score.f1),
        ])
    }
}
