//! The nine GLUE tasks (Wang et al. 2019): their label sets in HuggingFace's
//! order, their split files and the metrics the benchmark reports for them.

use crate::DataError;

/// A GLUE task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GlueTask {
    /// Corpus of Linguistic Acceptability (single sentence, 0/1).
    Cola,
    /// Stanford Sentiment Treebank, binary (single sentence, 0/1).
    Sst2,
    /// Microsoft Research Paraphrase Corpus (pair, 0/1).
    Mrpc,
    /// Semantic Textual Similarity Benchmark (pair, score 0–5).
    Stsb,
    /// Quora Question Pairs (pair, 0/1).
    Qqp,
    /// Multi-Genre NLI (pair, 3 classes; matched and mismatched dev/test).
    Mnli,
    /// Question NLI (pair, entailment/not_entailment).
    Qnli,
    /// Recognizing Textual Entailment (pair, entailment/not_entailment).
    Rte,
    /// Winograd NLI (pair, 0/1).
    Wnli,
}

/// The metrics GLUE reports for a task (computed by terse-eval).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GlueMetric {
    /// Matthews correlation (CoLA).
    Matthews,
    /// F1 of class 1 and accuracy (MRPC, QQP).
    F1AndAccuracy,
    /// Pearson and Spearman correlation (STS-B).
    Correlation,
    /// Accuracy (the others).
    Accuracy,
}

impl GlueTask {
    /// All nine, in GLUE's order.
    pub const ALL: [GlueTask; 9] = [
        GlueTask::Cola,
        GlueTask::Sst2,
        GlueTask::Mrpc,
        GlueTask::Stsb,
        GlueTask::Qqp,
        GlueTask::Mnli,
        GlueTask::Qnli,
        GlueTask::Rte,
        GlueTask::Wnli,
    ];

    /// The directory name of the GLUE download (`CoLA`, `SST-2`, …).
    pub fn dir_name(self) -> &'static str {
        match self {
            GlueTask::Cola => "CoLA",
            GlueTask::Sst2 => "SST-2",
            GlueTask::Mrpc => "MRPC",
            GlueTask::Stsb => "STS-B",
            GlueTask::Qqp => "QQP",
            GlueTask::Mnli => "MNLI",
            GlueTask::Qnli => "QNLI",
            GlueTask::Rte => "RTE",
            GlueTask::Wnli => "WNLI",
        }
    }

    /// The task of a command-line name (`cola`, `sst2` or `sst-2`, …).
    pub fn parse(name: &str) -> Result<Self, DataError> {
        let key: String = name
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric())
            .collect();
        GlueTask::ALL
            .into_iter()
            .find(|t| t.dir_name().to_lowercase().replace('-', "") == key)
            .ok_or_else(|| DataError::Config {
                config: "glue",
                detail: format!(
                    "unknown task {name:?}; known: cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli"
                ),
            })
    }

    /// Class names by index (HuggingFace's order); empty for STS-B.
    pub fn labels(self) -> &'static [&'static str] {
        match self {
            GlueTask::Mnli => &["contradiction", "entailment", "neutral"],
            GlueTask::Qnli | GlueTask::Rte => &["entailment", "not_entailment"],
            GlueTask::Stsb => &[],
            _ => &["0", "1"],
        }
    }

    /// Whether labels are scores (STS-B) rather than classes.
    pub fn is_regression(self) -> bool {
        self == GlueTask::Stsb
    }

    /// Whether examples are sentence pairs.
    pub fn is_pair(self) -> bool {
        !matches!(self, GlueTask::Cola | GlueTask::Sst2)
    }

    /// The split names with files (`<split>.tsv`).
    pub fn splits(self) -> &'static [&'static str] {
        match self {
            GlueTask::Mnli => &[
                "train",
                "dev_matched",
                "dev_mismatched",
                "test_matched",
                "test_mismatched",
            ],
            _ => &["train", "dev", "test"],
        }
    }

    /// The metrics GLUE reports.
    pub fn metric(self) -> GlueMetric {
        match self {
            GlueTask::Cola => GlueMetric::Matthews,
            GlueTask::Mrpc | GlueTask::Qqp => GlueMetric::F1AndAccuracy,
            GlueTask::Stsb => GlueMetric::Correlation,
            _ => GlueMetric::Accuracy,
        }
    }
}
