//! Evaluation metrics for terse.
//!
//! This crate will hold SQuAD v1.1 exact match and token F1 (the official
//! script's normalisation), the answer post-processing (n-best spans mapped back
//! to context text), the GLUE metrics (Matthews correlation, Pearson and
//! Spearman, F1, accuracy) and plain classification accuracy. Today it has the
//! SQuAD answer post-processing and predictions files ([`squad_answers`]) and
//! the accuracy that the optimizer tests on Fashion-MNIST report.
#![warn(missing_docs)]

pub mod squad_answers;

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
