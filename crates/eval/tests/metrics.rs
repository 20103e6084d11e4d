//! SQuAD EM/F1 and the GLUE metrics on hand-worked cases; the arithmetic
//! behind every expected value is in the comment beside it. (The official
//! script's agreement on the real dev set is `tests/squad_official.rs`.)

use std::collections::HashMap;

use terse_eval::{
    EvalError, GlueMetricKind, GlueOutputs, SquadGold, average_ranks, binary_f1, evaluate,
    exact_match, f1, glue_scores, matthews_corrcoef, normalize_answer, pearson, read_gold,
    read_predictions, spearman,
};

fn close(a: f64, b: f64) {
    assert!((a - b).abs() < 1e-12, "{a} vs {b}");
}

#[test]
fn normalization_follows_the_official_rules() {
    // lower → punctuation out → whole-word articles out → whitespace collapsed.
    assert_eq!(normalize_answer("The  Eiffel Tower!"), "eiffel tower");
    assert_eq!(normalize_answer("An apple, a day"), "apple day");
    // Articles only as whole words: "theory", "another", "Anna" stay.
    assert_eq!(
        normalize_answer("theory of another Anna"),
        "theory of another anna"
    );
    // Punctuation goes first, so "the-end" becomes "theend" (no article).
    assert_eq!(normalize_answer("the-end"), "theend");
    // `_` is punctuation; non-ASCII punctuation (’, «) is not.
    assert_eq!(normalize_answer("a_b «x» it’s"), "ab «x» it’s");
    assert_eq!(normalize_answer(" \t\n"), "");
}

#[test]
fn exact_match_and_f1_by_hand() {
    assert_eq!(exact_match("the Denver Broncos", "Denver Broncos."), 1.0);
    assert_eq!(exact_match("Broncos", "Denver Broncos"), 0.0);
    // pred {denver, broncos, won}, gold {denver, broncos}: 2 common,
    // precision 2/3, recall 1 → F1 = 2·(2/3)/(5/3) = 0.8.
    close(f1("Denver Broncos won", "the Denver Broncos"), 0.8);
    // Repeated tokens count by multiplicity: pred [a1, b, b] vs gold [b]
    // ("a1" is not an article) → common 1, P = 1/3, R = 1 → F1 = 0.5.
    close(f1("a1 b b", "b"), 0.5);
    // Empty prediction (or one that normalizes to nothing) scores 0,
    // even against a gold answer that also normalizes to nothing.
    close(f1("", "Paris"), 0.0);
    close(f1("the", "a"), 0.0);
    assert_eq!(exact_match("the", "a"), 1.0);
}

#[test]
fn evaluate_takes_the_best_ground_truth_and_counts_unanswered_as_zero() {
    let gold = vec![
        SquadGold {
            id: "q1".into(),
            answers: vec!["Santa Clara".into(), "Levi's Stadium".into()],
        },
        SquadGold {
            id: "q2".into(),
            answers: vec!["1990".into()],
        },
        SquadGold {
            id: "q3".into(),
            answers: vec!["gold".into()],
        },
    ];
    let predictions: HashMap<String, String> = [
        ("q1", "Levi's Stadium in Santa Clara"),
        ("q2", "1990"),
        ("extra", "ignored"),
    ]
    .into_iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    // q1: vs "santa clara": common 2 of pred 5 (levis stadium in santa
    // clara), gold 2 → P 0.4, R 1 → F1 = 0.8/1.4 = 4/7; vs "levis stadium":
    // same 4/7. EM 0. q2: EM 1, F1 1. q3 unanswered: 0, 0.
    let score = evaluate(&gold, &predictions);
    assert_eq!((score.total, score.answered), (3, 2));
    close(score.exact_match, 100.0 / 3.0);
    close(score.f1, 100.0 * (4.0 / 7.0 + 1.0) / 3.0);
}

#[test]
fn malformed_files_name_the_field() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let gold = dir.join("dev.json");
    // The error reading `text` as the gold file.
    let gold_error = |text: &str| {
        std::fs::write(&gold, text).unwrap();
        read_gold(&gold).unwrap_err().to_string()
    };
    let error = gold_error(
        r#"{"data": [{"paragraphs": [{"qas": [{"id": "x", "answers": [{"text": "a"}]}, {"answers": []}]}]}]}"#,
    );
    assert!(
        error.contains("dev.json: data[0].paragraphs[0].qas[1].id: missing"),
        "{error}"
    );

    let error = gold_error("{\"data\": [\n{\"paragraphs\": ]}");
    assert!(error.contains("dev.json: line 2, column"), "{error}");

    let predictions = dir.join("predictions.json");
    std::fs::write(&predictions, r#"{"q1": "Paris", "q2": 3}"#).unwrap();
    let error = read_predictions(&predictions).unwrap_err().to_string();
    assert!(
        error.contains("predictions.json: \"q2\": the answer is not a string"),
        "{error}"
    );
    std::fs::write(&predictions, r#"{"q1": "Paris"}"#).unwrap();
    assert_eq!(read_predictions(&predictions).unwrap()["q1"], "Paris");
}

#[test]
fn matthews_and_f1_by_hand() {
    // tp = 3, tn = 2, fp = 1, fn = 1:
    // MCC = (3·2 − 1·1) / sqrt((3+1)(3+1)(2+1)(2+1)) = 5/12.
    // F1 = 2·3 / (2·3 + 1 + 1) = 0.75.
    let predictions = [1, 1, 1, 1, 0, 0, 0];
    let labels = [1, 1, 1, 0, 1, 0, 0];
    close(
        matthews_corrcoef(&predictions, &labels).unwrap(),
        5.0 / 12.0,
    );
    close(binary_f1(&predictions, &labels).unwrap(), 0.75);
    // A constant prediction: (tp+fp)(tn+fn)… has a zero factor → MCC 0.
    close(matthews_corrcoef(&[1, 1, 1], &[1, 0, 1]).unwrap(), 0.0);
    close(matthews_corrcoef(&[0, 0], &[0, 0]).unwrap(), 0.0);
    // Perfectly inverted: tp = tn = 0, fp = fn = 2 → −4/sqrt(2·2·2·2) = −1.
    close(
        matthews_corrcoef(&[1, 1, 0, 0], &[0, 0, 1, 1]).unwrap(),
        -1.0,
    );
    // No positive anywhere: F1 = 0 (zero division → 0).
    close(binary_f1(&[0, 0], &[0, 0]).unwrap(), 0.0);
    assert!(matches!(
        matthews_corrcoef(&[1], &[1, 0]),
        Err(EvalError::Undefined { metric: "mcc", .. })
    ));
}

#[test]
fn correlations_by_hand() {
    // x = 1..4, y = 2,4,5,9: means 2.5 and 5; dx = −1.5,−.5,.5,1.5;
    // dy = −3,−1,0,4; Σdxdy = 4.5+0.5+0+6 = 11; Σdx² = 5; Σdy² = 26
    // → r = 11/sqrt(130).
    let x = [1.0, 2.0, 3.0, 4.0];
    let y = [2.0, 4.0, 5.0, 9.0];
    close(pearson(&x, &y).unwrap(), 11.0 / 130f64.sqrt());
    // Monotone → Spearman 1; reversed → −1.
    close(spearman(&x, &y).unwrap(), 1.0);
    close(spearman(&x, &[9.0, 5.0, 4.0, 2.0]).unwrap(), -1.0);
    // Ties take the average rank: 10, 20, 20, 30 → 1, 2.5, 2.5, 4.
    assert_eq!(
        average_ranks(&[10.0, 20.0, 20.0, 30.0]),
        [1.0, 2.5, 2.5, 4.0]
    );
    // Spearman with ties = Pearson of (1,2,3,4) and (1,2.5,2.5,4): dx as
    // above, dy = −1.5,0,0,1.5 → Σdxdy = 4.5, Σdy² = 4.5 → 4.5/sqrt(5·4.5).
    close(
        spearman(&x, &[10.0, 20.0, 20.0, 30.0]).unwrap(),
        4.5 / (5.0f64 * 4.5).sqrt(),
    );
    // Constant input has no correlation: NaN, as scipy returns (an STS-B
    // evaluation of a collapsed model does not end the run).
    assert!(pearson(&x, &[1.0; 4]).unwrap().is_nan());
    assert!(spearman(&[1.0; 4], &y).unwrap().is_nan());
    // Fewer than 2 samples is a malformed call: still an error.
    assert!(spearman(&[1.0], &[2.0]).is_err());
}

#[test]
fn each_task_kind_reports_its_metrics() {
    let predictions = [1, 1, 1, 1, 0, 0, 0];
    let labels = [1, 1, 1, 0, 1, 0, 0];
    let classes = GlueOutputs::Classes {
        predictions: &predictions,
        labels: &labels,
    };
    let got = glue_scores(GlueMetricKind::F1AndAccuracy, &classes).unwrap();
    assert_eq!(got[0].0, "f1");
    close(got[0].1, 0.75);
    assert_eq!(got[1].0, "accuracy");
    close(got[1].1, 5.0 / 7.0);
    let got = glue_scores(GlueMetricKind::Matthews, &classes).unwrap();
    assert_eq!(got[0].0, "mcc");
    close(got[0].1, 5.0 / 12.0);
    let scores = GlueOutputs::Scores {
        predictions: &[1.0, 2.0, 3.0, 4.0],
        labels: &[2.0, 4.0, 5.0, 9.0],
    };
    let got = glue_scores(GlueMetricKind::Correlation, &scores).unwrap();
    assert_eq!((got[0].0, got[1].0), ("pearson", "spearman"));
    close(got[1].1, 1.0);
    assert!(glue_scores(GlueMetricKind::Accuracy, &scores).is_err());
}
