//! Which metrics a GLUE task reports, and computing them: CoLA Matthews
//! correlation; STS-B Pearson and Spearman; MRPC and QQP F1 and accuracy;
//! SST-2, MNLI (matched and mismatched), QNLI, RTE, WNLI accuracy. The task
//! names live in terse-data's readers; this crate only needs the kind.

use crate::EvalError;
use crate::classification::{accuracy_of, binary_f1, matthews_corrcoef};
use crate::correlation::{pearson, spearman};

/// The metric family of a GLUE task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GlueMetricKind {
    /// CoLA: Matthews correlation.
    Matthews,
    /// MRPC, QQP: F1 of class 1 and accuracy.
    F1AndAccuracy,
    /// STS-B: Pearson and Spearman correlation.
    Correlation,
    /// Every other task: accuracy.
    Accuracy,
}

/// Predictions and labels of a GLUE task: classes, or scores for STS-B.
#[derive(Debug, Clone, PartialEq)]
pub enum GlueOutputs<'a> {
    /// Class indices.
    Classes {
        /// Predicted classes.
        predictions: &'a [u32],
        /// Gold classes.
        labels: &'a [u32],
    },
    /// Regression scores.
    Scores {
        /// Predicted scores.
        predictions: &'a [f64],
        /// Gold scores.
        labels: &'a [f64],
    },
}

/// The named metrics of a task, in GLUE's reporting order (values in [−1, 1]
/// or [0, 1], not percent).
pub fn glue_scores(
    kind: GlueMetricKind,
    outputs: &GlueOutputs<'_>,
) -> Result<Vec<(&'static str, f64)>, EvalError> {
    // The kind asks for outputs of the other sort.
    let unfit = || EvalError::Undefined {
        metric: "glue",
        detail: format!(
            "{kind:?} needs {} outputs",
            if kind == GlueMetricKind::Correlation {
                "score"
            } else {
                "class"
            }
        ),
    };
    match *outputs {
        GlueOutputs::Scores {
            predictions: p,
            labels: l,
        } => match kind {
            GlueMetricKind::Correlation => Ok(vec![
                ("pearson", pearson(p, l)?),
                ("spearman", spearman(p, l)?),
            ]),
            _ => Err(unfit()),
        },
        GlueOutputs::Classes {
            predictions: p,
            labels: l,
        } => match kind {
            GlueMetricKind::Matthews => Ok(vec![("mcc", matthews_corrcoef(p, l)?)]),
            GlueMetricKind::F1AndAccuracy => Ok(vec![
                ("f1", binary_f1(p, l)?),
                ("accuracy", accuracy_of(p, l)?),
            ]),
            GlueMetricKind::Accuracy => Ok(vec![("accuracy", accuracy_of(p, l)?)]),
            GlueMetricKind::Correlation => Err(unfit()),
        },
    }
}
