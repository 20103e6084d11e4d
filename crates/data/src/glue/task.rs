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

/// One metric GLUE reports (named here, computed by terse-eval).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GlueMetric {
    /// Matthews correlation coefficient (CoLA).
    Mcc,
    /// F1 of class 1, the positive class (MRPC, QQP).
    F1,
    /// Accuracy.
    Accuracy,
    /// Pearson correlation (STS-B).
    Pearson,
    /// Spearman rank correlation (STS-B).
    Spearman,
}

impl GlueMetric {
    /// The name GLUE's leaderboard and HuggingFace's `evaluate` use.
    pub fn name(self) -> &'static str {
        match self {
            GlueMetric::Mcc => "mcc",
            GlueMetric::F1 => "f1",
            GlueMetric::Accuracy => "accuracy",
            GlueMetric::Pearson => "pearson",
            GlueMetric::Spearman => "spearman",
        }
    }
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

    /// The file of a split: `<split>.tsv` in the task's directory.
    pub fn split_file(self, split: &str) -> String {
        format!("{split}.tsv")
    }

    /// The metrics GLUE reports for the task, the first being the one its
    /// leaderboard ranks by.
    pub fn metrics(self) -> &'static [GlueMetric] {
        match self {
            GlueTask::Cola => &[GlueMetric::Mcc],
            GlueTask::Mrpc | GlueTask::Qqp => &[GlueMetric::F1, GlueMetric::Accuracy],
            GlueTask::Stsb => &[GlueMetric::Pearson, GlueMetric::Spearman],
            _ => &[GlueMetric::Accuracy],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_splits_and_metrics() {
        // HuggingFace `datasets` glue: mnli ClassLabel(names=["entailment",
        // "neutral", "contradiction"]) is the *datasets* order, but the
        // transformers GLUE processors (and this reader) sort MNLI's names:
        // contradiction 0, entailment 1, neutral 2.
        assert_eq!(
            GlueTask::Mnli.labels(),
            ["contradiction", "entailment", "neutral"]
        );
        assert_eq!(GlueTask::Rte.labels(), ["entailment", "not_entailment"]);
        assert_eq!(GlueTask::Wnli.labels(), ["0", "1"]);
        assert!(GlueTask::Stsb.labels().is_empty() && GlueTask::Stsb.is_regression());
        assert_eq!(GlueTask::Mnli.splits().len(), 5);
        assert_eq!(GlueTask::Mnli.split_file("dev_matched"), "dev_matched.tsv");
        assert_eq!(GlueTask::Qnli.splits(), ["train", "dev", "test"]);
        let names = |t: GlueTask| t.metrics().iter().map(|m| m.name()).collect::<Vec<_>>();
        assert_eq!(names(GlueTask::Cola), ["mcc"]);
        assert_eq!(names(GlueTask::Stsb), ["pearson", "spearman"]);
        assert_eq!(names(GlueTask::Mrpc), ["f1", "accuracy"]);
        assert_eq!(names(GlueTask::Qqp), ["f1", "accuracy"]);
        for t in [
            GlueTask::Sst2,
            GlueTask::Mnli,
            GlueTask::Qnli,
            GlueTask::Rte,
            GlueTask::Wnli,
        ] {
            assert_eq!(names(t), ["accuracy"]);
        }
        assert!(!GlueTask::Cola.is_pair() && GlueTask::Wnli.is_pair());
    }
}
