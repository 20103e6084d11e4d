//! Featurization and post-processing together on the full SQuAD v1.1 dev
//! set: logits that peak exactly on a gold answer's token span must come
//! back, through `predict_answers` and `predictions.json`, as the gold text.
//!
//! For each question, the first gold answer whose token span (found from a
//! feature's offsets, as in `terse-data`'s `squad_dev` test) maps back to the
//! gold text exactly, starts on a max-context token and is at most 30
//! tokens long gets start and end logits of 10 there; every feature also
//! gets 15 on `[CLS]` (which post-processing must skip) and 0 elsewhere. The
//! prediction must equal that gold text for every such question, and such
//! questions must be at least 99% of the 10,570.
//!
//! It lives in the workspace tests because it joins two crates that may not
//! depend on each other (the trainer uses both). Needs the SQuAD files and
//! the MiniLM in the cache (fetched on first use).

use std::collections::HashMap;

use terse_data::{SquadFeatureConfig, SquadFeaturizer, WordPiece, dataset, minilm, read_squad};
use terse_eval::{
    AnswerConfig, FeatureLogits, QuestionContext, predict_answers, write_predictions,
};

// The answer-span rule of `terse-data`'s `squad_dev` test, written there once.
#[path = "../crates/data/tests/squad_span/mod.rs"]
mod squad_span;

use squad_span::span_in;

#[test]
fn logits_on_the_gold_span_predict_the_gold_text() {
    let dev = dataset("squad-v1.1").unwrap().join("dev-v1.1.json");
    let examples = read_squad(&dev).unwrap();
    let tokenizer = WordPiece::from_tokenizer_json(&minilm().unwrap().tokenizer).unwrap();
    let featurizer = SquadFeaturizer::new(&tokenizer, SquadFeatureConfig::default()).unwrap();
    let features = featurizer.featurize(&examples).unwrap();
    let config = AnswerConfig::default();

    let mut logits: Vec<(Vec<f32>, Vec<f32>)> = features
        .iter()
        .map(|f| {
            let mut start = vec![0.0; f.len()];
            let mut end = vec![0.0; f.len()];
            start[0] = 15.0;
            end[0] = 15.0;
            (start, end)
        })
        .collect();
    // Question index → the gold text its logits point at.
    let mut expected: HashMap<usize, String> = HashMap::new();
    for (q, example) in examples.iter().enumerate() {
        'answers: for answer in &example.answers {
            for (f, feature) in features.iter().enumerate().filter(|(_, f)| f.example == q) {
                let Some((s, e)) = span_in(feature, answer.start, answer.end()) else {
                    continue;
                };
                let (Some(first), Some(last)) = (feature.offsets[s], feature.offsets[e]) else {
                    continue;
                };
                let text: String = example
                    .context
                    .chars()
                    .skip(first.0)
                    .take(last.1 - first.0)
                    .collect();
                if text == answer.text && feature.max_context[s] && e - s < config.max_answer {
                    logits[f].0[s] = 10.0;
                    logits[f].1[e] = 10.0;
                    expected.insert(q, text);
                    break 'answers;
                }
            }
        }
    }
    let questions: Vec<QuestionContext<'_>> = examples
        .iter()
        .map(|e| QuestionContext {
            id: &e.id,
            context: &e.context,
        })
        .collect();
    let views: Vec<FeatureLogits<'_>> = features
        .iter()
        .zip(&logits)
        .map(|(f, (start, end))| FeatureLogits {
            example: f.example,
            offsets: &f.offsets,
            max_context: &f.max_context,
            start_logits: start,
            end_logits: end,
        })
        .collect();
    let predictions = predict_answers(&questions, &views, &config).unwrap();
    let wrong: Vec<_> = expected
        .iter()
        .filter(|&(&q, gold)| predictions[q].text != *gold)
        .map(|(&q, gold)| {
            (
                examples[q].id.clone(),
                gold.clone(),
                predictions[q].text.clone(),
            )
        })
        .collect();
    println!(
        "round trip: {} of {} questions have a gold span to peak on; {} predicted otherwise",
        expected.len(),
        examples.len(),
        wrong.len()
    );
    assert!(wrong.is_empty(), "{wrong:?}");
    assert!(expected.len() as f64 >= 0.99 * examples.len() as f64);
    // The probabilities of each n-best list sum to 1.
    for p in predictions.iter().filter(|p| !p.n_best.is_empty()) {
        let total: f64 = p.n_best.iter().map(|c| c.probability).sum();
        assert!((total - 1.0).abs() < 1e-9, "{total}");
    }

    // predictions.json holds the same answers under the question ids.
    let scratch = tempfile::tempdir().unwrap();
    let path = scratch.path().join("predictions.json");
    write_predictions(&path, &questions, &predictions).unwrap();
    let read: HashMap<String, String> =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(read.len(), examples.len());
    for (&q, gold) in &expected {
        assert_eq!(read[&examples[q].id], *gold);
    }
}
