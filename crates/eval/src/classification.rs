//! Classification metrics of GLUE: accuracy, the F1 of the positive class
//! (MRPC, QQP) and the Matthews correlation coefficient (CoLA), with the
//! conventions of scikit-learn, which GLUE's reference code calls.

use crate::EvalError;

fn same_length<T>(metric: &'static str, predictions: &[T], labels: &[T]) -> Result<(), EvalError> {
    if predictions.len() != labels.len() {
        return Err(EvalError::Undefined {
            metric,
            detail: format!(
                "{} predictions for {} labels",
                predictions.len(),
                labels.len()
            ),
        });
    }
    if labels.is_empty() {
        return Err(EvalError::Undefined {
            metric,
            detail: "no samples".into(),
        });
    }
    Ok(())
}

/// Binary confusion counts with class 1 as positive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Confusion {
    /// Predicted 1, label 1.
    pub tp: u64,
    /// Predicted 0, label 0.
    pub tn: u64,
    /// Predicted 1, label 0.
    pub fp: u64,
    /// Predicted 0, label 1.
    pub fn_: u64,
}

impl Confusion {
    /// Counts over binary predictions (any value ≠ 0 is class 1).
    pub fn count(predictions: &[u32], labels: &[u32]) -> Self {
        let mut c = Confusion::default();
        for (&p, &l) in predictions.iter().zip(labels) {
            match (p != 0, l != 0) {
                (true, true) => c.tp += 1,
                (false, false) => c.tn += 1,
                (true, false) => c.fp += 1,
                (false, true) => c.fn_ += 1,
            }
        }
        c
    }
}

/// Fraction of predictions equal to their label.
pub fn accuracy_of(predictions: &[u32], labels: &[u32]) -> Result<f64, EvalError> {
    same_length("accuracy", predictions, labels)?;
    let correct = predictions
        .iter()
        .zip(labels)
        .filter(|(p, l)| p == l)
        .count();
    Ok(correct as f64 / labels.len() as f64)
}

/// F1 of class 1: `2·tp / (2·tp + fp + fn)`; 0 when there is no positive
/// prediction or label (scikit-learn's `zero_division` default).
pub fn binary_f1(predictions: &[u32], labels: &[u32]) -> Result<f64, EvalError> {
    same_length("f1", predictions, labels)?;
    let c = Confusion::count(predictions, labels);
    let denominator = 2 * c.tp + c.fp + c.fn_;
    Ok(if denominator == 0 {
        0.0
    } else {
        (2 * c.tp) as f64 / denominator as f64
    })
}

/// Matthews correlation of binary predictions:
/// `(tp·tn − fp·fn) / sqrt((tp+fp)(tp+fn)(tn+fp)(tn+fn))`, and 0 when the
/// denominator is 0 (a constant prediction or label), as scikit-learn.
pub fn matthews_corrcoef(predictions: &[u32], labels: &[u32]) -> Result<f64, EvalError> {
    same_length("mcc", predictions, labels)?;
    let c = Confusion::count(predictions, labels);
    let [tp, tn, fp, fn_] = [c.tp, c.tn, c.fp, c.fn_].map(|x| x as f64);
    let denominator = ((tp + fp) * (tp + fn_) * (tn + fp) * (tn + fn_)).sqrt();
    Ok(if denominator == 0.0 {
        0.0
    } else {
        (tp * tn - fp * fn_) / denominator
    })
}
