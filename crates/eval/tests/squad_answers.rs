//! SQuAD post-processing on features written by hand: which spans the rules
//! keep, which one wins across windows, the n-best probabilities (softmax
//! values computed with Python's `math.exp`, quoted beside them), the
//! refusal of inconsistent inputs, and the exact bytes of
//! `predictions.json` and `nbest_predictions.json`.

use terse_eval::{
    AnswerConfig, FeatureLogits, Prediction, QuestionContext, predict_answers,
    write_nbest_predictions, write_predictions,
};

/// `Paris  CAFÉ, in 1887.`: two spaces, upper case and an accent that an
/// uncased model never sees; 21 characters (22 bytes).
const CONTEXT: &str = "Paris  CAFÉ, in 1887.";

/// Feature A: `[CLS] q q [SEP] paris cafe , in 1887 . [SEP] [PAD]`; the
/// padding position has logits but no offset, and is not read.
const A_OFFSETS: [Option<(usize, usize)>; 11] = [
    None,
    None,
    None,
    None,
    Some((0, 5)),   // paris
    Some((7, 11)),  // cafe (CAFÉ)
    Some((11, 12)), // ,
    Some((13, 15)), // in
    Some((16, 20)), // 1887
    Some((20, 21)), // .
    None,
];
/// "." (position 9) has more context in feature B.
const A_MAX: [bool; 11] = [
    false, false, false, false, true, true, true, true, true, false, false,
];
// Start top 5: 0 (9, [CLS]), 1 (8, question), 9 (5, not max-context),
// 5 (4, cafe), 8 (3, 1887); padding (8 at 11) is left out, or it would push
// 1887 out of the top 5.
const A_START: [f32; 12] = [9., 8., 0., 0., 1., 4., 0., 0., 3., 5., 0., 8.];
// End top 5: 0 (9), 10 (7, [SEP]), 5 (2, cafe), 8 (1, 1887), 1 (0, question).
const A_END: [f32; 12] = [9., 0., 0., 0., 0., 2., 0., 0., 1., 0., 7., 0.];

fn feature_a() -> FeatureLogits<'static> {
    FeatureLogits {
        example: 0,
        offsets: &A_OFFSETS,
        max_context: &A_MAX,
        start_logits: &A_START,
        end_logits: &A_END,
    }
}

fn question(id: &'static str) -> QuestionContext<'static> {
    QuestionContext {
        id,
        context: CONTEXT,
    }
}

fn config(n_best: usize, max_answer: usize) -> AnswerConfig {
    AnswerConfig { n_best, max_answer }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-12
}

/// The texts of `p`'s n-best list, best first.
fn texts(p: &Prediction) -> Vec<&str> {
    p.n_best.iter().map(|c| c.text.as_str()).collect()
}

/// Asserts the first n-best probabilities of `p` are `want`, each within
/// `close`'s 1e-12.
fn probabilities_are(p: &Prediction, want: &[f64]) {
    let probs: Vec<_> = p.n_best.iter().map(|c| c.probability).collect();
    for (k, w) in want.iter().enumerate() {
        assert!(close(probs[k], *w), "{probs:?}");
    }
}

#[test]
fn only_valid_spans_among_the_top_logits_count() {
    // n_best 3: the top starts are [CLS], a question token and a start that
    // is not max-context: nothing valid, the empty answer.
    let p = predict_answers(&[question("q")], &[feature_a()], &config(3, 30)).unwrap();
    assert_eq!(p[0].text, "");
    assert!(p[0].n_best.is_empty());
    // n_best 5, max_answer 30: starts cafe (4), 1887 (3) with ends cafe (2),
    // 1887 (1): cafe–cafe 6, cafe–1887 5, 1887–1887 4 (1887–cafe ends
    // before it starts). Original characters: "CAFÉ", two spaces kept out.
    let p = predict_answers(&[question("q")], &[feature_a()], &config(5, 30)).unwrap();
    assert_eq!(p[0].text, "CAFÉ");
    assert_eq!(texts(&p[0]), ["CAFÉ", "CAFÉ, in 1887", "1887"]);
    // softmax([6, 5, 4]) = [0.6652409557748218, 0.24472847105479764, 0.09003057317038046]
    probabilities_are(
        &p[0],
        &[0.6652409557748218, 0.24472847105479764, 0.09003057317038046],
    );
    assert_eq!(
        (p[0].n_best[1].start_logit, p[0].n_best[1].end_logit),
        (4.0, 1.0)
    );
    // max_answer 3 drops cafe–1887 (positions 5..=8, 4 tokens);
    // softmax([6, 4]) = [0.8807970779778823, 0.11920292202211755].
    let p = predict_answers(&[question("q")], &[feature_a()], &config(5, 3)).unwrap();
    assert_eq!(texts(&p[0]), ["CAFÉ", "1887"]);
    probabilities_are(&p[0], &[0.8807970779778823, 0.11920292202211755]);
}

#[test]
fn the_best_span_over_all_windows_wins_and_texts_count_once() {
    // Feature B: `[CLS] q q [SEP] , in 1887 . [SEP]`, max-context for 1887
    // and "." only.
    let offsets = [
        None,
        None,
        None,
        None,
        Some((11, 12)),
        Some((13, 15)),
        Some((16, 20)),
        Some((20, 21)),
        None,
    ];
    let max = [false, false, false, false, false, false, true, true, false];
    // Start: "," (10) is not max-context; 1887 (6). End: 1887 (1.5), "." (0.5).
    let start = [0., 0., 0., 0., 10., 0., 6., 0., 0.];
    let end = [0., 0., 0., 0., 0., 0., 1.5, 0.5, 0.];
    let b = FeatureLogits {
        example: 0,
        offsets: &offsets,
        max_context: &max,
        start_logits: &start,
        end_logits: &end,
    };
    let questions = [question("q0"), question("q1")];
    // Features out of order; question 1 has none.
    let p = predict_answers(&questions, &[b, feature_a()], &config(5, 3)).unwrap();
    // B: 1887 7.5, "1887." 6.5; A: CAFÉ 6, 1887 4 (already listed).
    assert_eq!(p[0].text, "1887");
    assert_eq!(texts(&p[0]), ["1887", "1887.", "CAFÉ"]);
    // softmax([7.5, 6.5, 6]) = [0.6285317192117624, 0.23122389762214907, 0.14024438316608848]
    probabilities_are(
        &p[0],
        &[0.6285317192117624, 0.23122389762214907, 0.14024438316608848],
    );
    assert_eq!(p[1].text, "");
    // n_best also caps the list: 2 entries.
    let p = predict_answers(&questions, &[b, feature_a()], &config(2, 3)).unwrap();
    assert_eq!(p[0].n_best.len(), 2);
}

#[test]
fn inconsistent_inputs_are_refused_naming_the_feature() {
    let q = [question("q")];
    let error = |f: FeatureLogits<'_>| {
        predict_answers(&q, &[feature_a(), f], &config(20, 30))
            .unwrap_err()
            .to_string()
    };
    let mut f = feature_a();
    f.example = 1;
    assert_eq!(
        error(f),
        "SQuAD answers: feature 1: example 1 but only 1 questions"
    );
    let mut f = feature_a();
    f.max_context = &A_MAX[..10];
    assert_eq!(
        error(f),
        "SQuAD answers: feature 1: 11 offsets but 10 max-context flags"
    );
    let mut f = feature_a();
    f.end_logits = &A_END[..11];
    assert_eq!(
        error(f),
        "SQuAD answers: feature 1: 12 start and 11 end logits for 11 positions"
    );
    let nan = [0., 0., f32::NAN];
    let mut f = feature_a();
    f.offsets = &A_OFFSETS[..3];
    f.max_context = &A_MAX[..3];
    f.start_logits = &nan;
    f.end_logits = &nan;
    assert_eq!(
        error(f),
        "SQuAD answers: feature 1: start logit NaN at position 2"
    );
    // Offsets beyond the 21-character context.
    let offsets = [None, Some((16, 22))];
    let mut f = feature_a();
    f.offsets = &offsets;
    f.max_context = &[false, true];
    f.start_logits = &[0., 1.];
    f.end_logits = &[0., 1.];
    assert_eq!(
        error(f),
        "SQuAD answers: question 0: character span 16..22 outside its 21-character context"
    );
    let e = predict_answers(&q, &[], &config(0, 30)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "AnswerConfig: n_best 0 and max_answer 30 must both be at least 1"
    );
    let parsed: AnswerConfig = serde_json::from_str("{}").unwrap();
    assert_eq!(parsed, config(20, 30));
    assert!(serde_json::from_str::<AnswerConfig>(r#"{"nbest": 5}"#).is_err());
}

#[test]
fn predictions_files_in_the_official_format_byte_for_byte() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let questions = [question("q2"), question("q1")];
    let p = predict_answers(&questions, &[feature_a()], &config(5, 3)).unwrap();
    let path = dir.join("predictions.json");
    write_predictions(&path, &questions, &p).unwrap();
    // Question order kept, UTF-8 (not \u escapes), a question with no
    // feature answered with "".
    assert_eq!(
        std::fs::read(&path).unwrap(),
        "{\n  \"q2\": \"CAFÉ\",\n  \"q1\": \"\"\n}\n".as_bytes()
    );
    assert!(!dir.join("predictions.json.tmp").exists());
    let nbest = dir.join("nbest_predictions.json");
    write_nbest_predictions(&nbest, &questions, &p).unwrap();
    // The probabilities are those of softmax([6, 4]) above, printed in full.
    let expected = concat!(
        "{\n  \"q2\": [\n",
        "    {\n      \"text\": \"CAFÉ\",\n      \"probability\": 0.8807970779778823,\n",
        "      \"start_logit\": 4.0,\n      \"end_logit\": 2.0\n    },\n",
        "    {\n      \"text\": \"1887\",\n      \"probability\": 0.11920292202211755,\n",
        "      \"start_logit\": 3.0,\n      \"end_logit\": 1.0\n    }\n",
        "  ],\n  \"q1\": []\n}\n"
    );
    assert_eq!(std::fs::read_to_string(&nbest).unwrap(), expected);
    // A repeated id would lose an answer: refused, and nothing written.
    let twice = [question("q1"), question("q1")];
    let e = write_predictions(&dir.join("twice.json"), &twice, &p).unwrap_err();
    assert_eq!(
        e.to_string(),
        "SQuAD answers: question id \"q1\" appears twice"
    );
    assert!(!dir.join("twice.json").exists());
    let e = write_predictions(&dir.join("short.json"), &questions[..1], &p).unwrap_err();
    assert_eq!(
        e.to_string(),
        "SQuAD answers: 1 questions but 2 predictions"
    );
    let e = write_predictions(&dir.join("no/such/dir/p.json"), &questions, &p).unwrap_err();
    assert!(e.to_string().contains("no/such/dir/p.json.tmp"), "{e}");
}
