//! terse's SQuAD v1.1 scoring against the official `evaluate-v1.1.py` on the
//! full dev set: 1,375 predictions made by `fixtures/squad/
//! make_official_reference.py` (exact gold, articles, punctuation, case,
//! partial and extra words, other answers, non-breaking spaces and curly
//! quotes, empty strings; 125 questions left unanswered) with the official
//! script's per-question EM/F1 and totals recorded beside them. Every
//! per-question score and both totals must agree within 1e-12. Lives in the
//! workspace tests because the dev file comes through terse-data.

use std::collections::HashMap;

use terse_data::dataset;
use terse_eval::{evaluate, read_gold, score_question};

#[test]
fn dev_set_scores_equal_the_official_script() {
    let reference: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fixtures/squad/official_reference.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let predictions: HashMap<String, String> = reference["predictions"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(id, text)| (id.clone(), text.as_str().unwrap().to_string()))
        .collect();
    let gold = read_gold(&dataset("squad-v1.1").unwrap().join("dev-v1.1.json")).unwrap();
    assert_eq!(gold.len(), 10_570);

    let per_question = reference["per_question"].as_object().unwrap();
    assert_eq!(per_question.len(), 1_375);
    let mut compared = 0;
    for question in &gold {
        let Some(expected) = per_question.get(&question.id) else {
            continue;
        };
        let (em, f1) = score_question(&predictions[&question.id], &question.answers);
        let (want_em, want_f1) = (expected[0].as_f64().unwrap(), expected[1].as_f64().unwrap());
        assert!(
            (em - want_em).abs() < 1e-12 && (f1 - want_f1).abs() < 1e-12,
            "{}: prediction {:?}, answers {:?}: terse ({em}, {f1}), official ({want_em}, {want_f1})",
            question.id,
            predictions[&question.id],
            question.answers
        );
        compared += 1;
    }
    assert_eq!(compared, 1_375);

    let score = evaluate(&gold, &predictions);
    assert_eq!((score.total, score.answered), (10_570, 1_375));
    let official_em = reference["exact_match"].as_f64().unwrap();
    let official_f1 = reference["f1"].as_f64().unwrap();
    assert!(
        (score.exact_match - official_em).abs() < 1e-12,
        "{} vs {official_em}",
        score.exact_match
    );
    assert!(
        (score.f1 - official_f1).abs() < 1e-12,
        "{} vs {official_f1}",
        score.f1
    );
}
