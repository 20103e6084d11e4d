//! SQuAD v1.1 dev, all 10,570 questions and 34,726 gold answers (counts from
//! the official file, as DATA.md and a Python count give them), featurized
//! with the MiniLM tokenizer at BERT's settings (384 / 128 / 64).
//!
//! For each gold answer and each feature of its question, the answer's
//! token span is found from the feature's own offsets (the positions whose
//! characters overlap the answer), independently of the featurizer's
//! labelling code; the span is "in" the feature when the window's context
//! covers the answer's first and last characters. Mapping it back through
//! the offsets must give the gold text, for at least 99% of the questions,
//! compared exactly and after lowercasing and trimming non-alphanumerics.
//! The featurizer's labels (first answer) must equal that span, or 0/0 when
//! it is not in the window.
//!
//! Needs the SQuAD files and the MiniLM (fetched into the cache on first
//! use, through `terse_data::dataset` and `terse_data::minilm`).

use std::time::Instant;

use terse_data::{SquadFeatureConfig, SquadFeaturizer, WordPiece, dataset, minilm, read_squad};

mod squad_span;

use squad_span::span_in;

fn normalize(text: &str) -> String {
    text.trim_matches(|c: char| !c.is_alphanumeric())
        .to_lowercase()
}

fn chars(text: &str, start: usize, end: usize) -> String {
    text.chars().skip(start).take(end - start).collect()
}

#[test]
fn gold_answers_are_recoverable_through_the_features() {
    let dev = dataset("squad-v1.1").unwrap().join("dev-v1.1.json");
    let examples = read_squad(&dev).unwrap();
    assert_eq!(examples.len(), 10_570);
    let answers: usize = examples.iter().map(|e| e.answers.len()).sum();
    assert_eq!(answers, 34_726);

    let tokenizer = WordPiece::from_tokenizer_json(&minilm().unwrap().tokenizer).unwrap();
    let config = SquadFeatureConfig::default();
    let featurizer = SquadFeaturizer::new(&tokenizer, config).unwrap();
    let clock = Instant::now();
    let features = featurizer.featurize(&examples).unwrap();
    let seconds = clock.elapsed().as_secs_f64();

    let mut per_example = vec![Vec::new(); examples.len()];
    for feature in &features {
        per_example[feature.example].push(feature);
        assert!(feature.len() <= config.max_seq);
    }
    let (mut exact, mut normalized, mut label_errors) = (0, 0, 0);
    let mut misses = Vec::new();
    let mut lost = Vec::new();
    for (example, features) in examples.iter().zip(&per_example) {
        assert!(!features.is_empty(), "{}: no feature", example.id);
        let (mut any_exact, mut any_normalized) = (false, false);
        for (a, answer) in example.answers.iter().enumerate() {
            for feature in features {
                let span = span_in(feature, answer.start, answer.end());
                if a == 0 {
                    let label = (feature.start_position, feature.end_position);
                    label_errors += usize::from(label != span.unwrap_or((0, 0)));
                }
                let Some((s, e)) = span else { continue };
                let (Some(first), Some(last)) = (feature.offsets[s], feature.offsets[e]) else {
                    unreachable!("span_in returns context positions")
                };
                let text = chars(&example.context, first.0, last.1);
                any_exact |= text == answer.text;
                any_normalized |= normalize(&text) == normalize(&answer.text);
                if text != answer.text && misses.len() < 8 {
                    misses.push(format!("{:?} -> {text:?}", answer.text));
                }
            }
        }
        if !any_exact {
            lost.push(format!("{} {:?}", example.id, example.answers[0].text));
        }
        exact += usize::from(any_exact);
        normalized += usize::from(any_normalized);
    }
    let n = examples.len() as f64;
    let max = per_example.iter().map(Vec::len).max().unwrap_or(0);
    println!(
        "SQuAD dev: {} questions, {} features ({:.4} per question, max {max}), \
         featurized in {seconds:.2} s ({:.0} questions/s)",
        examples.len(),
        features.len(),
        features.len() as f64 / n,
        n / seconds,
    );
    println!(
        "gold text recovered through the offsets: exact {exact} ({:.3}%), \
         normalized {normalized} ({:.3}%); not recovered: {lost:?}; \
         answers that are part of a token, e.g. {misses:?}",
        100.0 * exact as f64 / n,
        100.0 * normalized as f64 / n,
    );
    assert_eq!(label_errors, 0, "labels that differ from the offsets' span");
    assert!(exact as f64 >= 0.99 * n, "exact {exact}");
    assert!(normalized >= exact);
    assert!(normalized as f64 >= 0.99 * n, "normalized {normalized}");
    // Each context token is max-context in exactly one of its question's
    // windows.
    for features in &per_example {
        let mut owners = std::collections::HashMap::new();
        for feature in features {
            for (o, m) in feature.offsets.iter().zip(&feature.max_context) {
                if let (Some(o), true) = (o, m) {
                    *owners.entry(*o).or_insert(0) += 1;
                }
            }
        }
        assert!(owners.values().all(|&n| n == 1));
    }
}
