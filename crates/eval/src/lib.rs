//! Evaluation metrics for terse.
//!
//! SQuAD v1.1 exact match and token F1 with the official script's
//! normalization ([`squad_metric`]), the answer post-processing (n-best spans
//! mapped back to context text) and predictions files ([`squad_answers`]),
//! the GLUE metrics (Matthews correlation, Pearson and Spearman, F1,
//! accuracy: [`classification`], [`correlation`], [`glue_metric`]) and plain
//! classification accuracy.
#![warn(missing_docs)]

pub mod classification;
pub mod correlation;
mod error;
pub mod glue_metric;
pub mod squad_answers;
pub mod squad_metric;

pub use classification::{Confusion, accuracy_of, binary_f1, matthews_corrcoef};
pub use correlation::{average_ranks, pearson, spearman};
pub use error::EvalError;
pub use glue_metric::{GlueMetricKind, GlueOutputs, glue_scores};
pub use squad_metric::{
    SquadGold, SquadScore, evaluate, exact_match, f1, normalize_answer, read_gold,
    read_predictions, score_question,
};

pub use squad_answers::{
    AnswerConfig, Candidate, FeatureLogits, Prediction, QuestionContext, SquadAnswerError,
    predict_answers, write_nbest_predictions, write_predictions,
};

/// Fraction of `predictions` equal to `labels` (0 for empty input).
///
/// ```
/// assert_eq!(terse_eval::accuracy(&[1, 2, 3, 4], &[1, 0, 3, 4]), 0.75);
/// ```
pub fn accuracy<T: PartialEq>(predictions: &[T], labels: &[T]) -> f64 {
    assert_eq!(
        predictions.len(),
        labels.len(),
        "accuracy needs one prediction per label"
    );
    if labels.is_empty() {
        return 0.0;
    }
    let correct = predictions
        .iter()
        .zip(labels)
        .filter(|(p, l)| p == l)
        .count();
    correct as f64 / labels.len() as f64
}
