//! SQuAD answer post-processing: a span-QA model's start and end logits,
//! per feature (one window of one question), turned into one answer text per
//! question, an n-best list with probabilities, and the official
//! `predictions.json` / `nbest_predictions.json` files.
//!
//! The rules are BERT's `run_squad.py` (`write_predictions`): for each
//! feature the `n_best` highest start and `n_best` highest end logits among
//! its own positions are paired; a pair is dropped when either end is
//! outside the context window (`[CLS]`, the question, `[SEP]`), when the
//! start is not in the window where that token has the most context, when
//! the end comes before the start, or when the span is longer than
//! `max_answer` tokens. The score is `start_logit + end_logit`; the
//! best-scoring pair over all the question's features wins. Its text is the
//! context's own characters from the start token's first to the end token's
//! last, so case, accents and spacing are the context's (the model read a
//! lowercased, accent-stripped copy). `run_squad.py` instead re-tokenizes
//! and aligns the detokenized span (`get_final_text`); with character
//! offsets that is unnecessary. It also ranks its fixed padding to
//! `max_seq_length` among the top logits; terse pads a batch only to its
//! longest feature, so padding is left out (a feature's answer would
//! otherwise depend on its batch).
//!
//! The inputs are plain slices so that this crate does not depend on
//! `terse-data`: the trainer builds a [`FeatureLogits`] from each
//! `terse_data::SquadFeature`'s `example`, `offsets` and `max_context`.

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize};

/// What is wrong with post-processing's input or output.
#[derive(Debug, thiserror::Error)]
pub enum SquadAnswerError {
    /// Inputs that do not fit together (named by feature and position).
    #[error("SQuAD answers: {0}")]
    Input(String),
    /// A config whose values make no sense.
    #[error("AnswerConfig: {0}")]
    Config(String),
    /// A predictions file that could not be written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

fn default_n_best() -> usize {
    20
}
fn default_max_answer() -> usize {
    30
}

/// Post-processing limits; the defaults are BERT's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnswerConfig {
    /// Start and end candidates per feature, and the length of the n-best list.
    #[serde(default = "default_n_best")]
    pub n_best: usize,
    /// Longest answer, in tokens.
    #[serde(default = "default_max_answer")]
    pub max_answer: usize,
}

impl Default for AnswerConfig {
    fn default() -> Self {
        AnswerConfig {
            n_best: default_n_best(),
            max_answer: default_max_answer(),
        }
    }
}

impl AnswerConfig {
    /// Both limits must be at least 1 (0 would predict nothing, silently).
    pub fn validate(&self) -> Result<(), SquadAnswerError> {
        if self.n_best == 0 || self.max_answer == 0 {
            return Err(SquadAnswerError::Config(format!(
                "n_best {} and max_answer {} must both be at least 1",
                self.n_best, self.max_answer
            )));
        }
        Ok(())
    }
}

/// A question: its id and its context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuestionContext<'a> {
    /// The question id (the key in `predictions.json`).
    pub id: &'a str,
    /// The paragraph the answer is taken from.
    pub context: &'a str,
}

/// One feature's model output with what maps its positions to the context.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FeatureLogits<'a> {
    /// Index of the feature's question in the [`QuestionContext`] slice.
    pub example: usize,
    /// Per position, `(start, end)` character offsets of a context token;
    /// `None` outside the context window.
    pub offsets: &'a [Option<(usize, usize)>],
    /// Per position, whether this feature is the token's max-context window.
    pub max_context: &'a [bool],
    /// Start logits, one per position; may be longer than `offsets`
    /// (padding to the longest feature of its batch). The extra positions
    /// are not read: among the top `n_best` they would crowd out the
    /// feature's own, so that its answer would depend on which features
    /// shared its batch.
    pub start_logits: &'a [f32],
    /// End logits, as many as `start_logits`.
    pub end_logits: &'a [f32],
}

/// One entry of a question's n-best list.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Candidate {
    /// The answer text, from the context.
    pub text: String,
    /// Softmax of its score over the n-best list.
    pub probability: f64,
    /// Its start logit.
    pub start_logit: f32,
    /// Its end logit.
    pub end_logit: f32,
}

/// The answer to one question.
#[derive(Debug, Clone, PartialEq)]
pub struct Prediction {
    /// The best span's text; empty when no feature has a valid span.
    pub text: String,
    /// The best distinct texts, best first (at most `n_best`; a text found
    /// in several windows or at several places counts once, with its best
    /// score, as in `run_squad.py`).
    pub n_best: Vec<Candidate>,
}

/// A valid span of one feature.
struct Span {
    score: f64,
    start_logit: f32,
    end_logit: f32,
    chars: (usize, usize),
}

/// The answer to each question (in `questions` order) from its features'
/// logits. Features may come in any order; a question without features gets
/// the empty answer. Fails, naming the feature, on an example index out of
/// range, slices of different lengths, a logit that is not finite at one of
/// the feature's positions, or offsets outside the context.
pub fn predict_answers(
    questions: &[QuestionContext<'_>],
    features: &[FeatureLogits<'_>],
    config: &AnswerConfig,
) -> Result<Vec<Prediction>, SquadAnswerError> {
    config.validate()?;
    let mut spans: Vec<Vec<Span>> = (0..questions.len()).map(|_| Vec::new()).collect();
    for (f, feature) in features.iter().enumerate() {
        let spans = spans.get_mut(feature.example).ok_or_else(|| {
            SquadAnswerError::Input(format!(
                "feature {f}: example {} but only {} questions",
                feature.example,
                questions.len()
            ))
        })?;
        check_feature(f, feature)?;
        // The feature's own positions only (`check_feature` made sure the
        // logits reach that far): padding is not read.
        let n = feature.offsets.len();
        let starts = top_k(&feature.start_logits[..n], config.n_best);
        let ends = top_k(&feature.end_logits[..n], config.n_best);
        for &s in &starts {
            let Some(start) = feature.offsets[s] else {
                continue;
            };
            if !feature.max_context[s] {
                continue;
            }
            for &e in &ends {
                let Some(end) = feature.offsets[e] else {
                    continue;
                };
                if e < s || e - s + 1 > config.max_answer {
                    continue;
                }
                let (start_logit, end_logit) = (feature.start_logits[s], feature.end_logits[e]);
                spans.push(Span {
                    score: f64::from(start_logit) + f64::from(end_logit),
                    start_logit,
                    end_logit,
                    chars: (start.0, end.1),
                });
            }
        }
    }
    questions
        .iter()
        .zip(spans)
        .enumerate()
        .map(|(q, (question, mut spans))| {
            // Stable: equal scores keep feature, then start, then end order.
            spans.sort_by(|a, b| b.score.total_cmp(&a.score));
            n_best(q, question.context, &spans, config.n_best)
        })
        .collect()
}

fn check_feature(f: usize, feature: &FeatureLogits<'_>) -> Result<(), SquadAnswerError> {
    let n = feature.offsets.len();
    if feature.max_context.len() != n {
        return Err(SquadAnswerError::Input(format!(
            "feature {f}: {n} offsets but {} max-context flags",
            feature.max_context.len()
        )));
    }
    if feature.start_logits.len() != feature.end_logits.len() || feature.start_logits.len() < n {
        return Err(SquadAnswerError::Input(format!(
            "feature {f}: {} start and {} end logits for {n} positions",
            feature.start_logits.len(),
            feature.end_logits.len()
        )));
    }
    // Padding's logits are never read, so they may be anything.
    for (which, logits) in [("start", feature.start_logits), ("end", feature.end_logits)] {
        if let Some(p) = logits[..n].iter().position(|x| !x.is_finite()) {
            return Err(SquadAnswerError::Input(format!(
                "feature {f}: {which} logit {} at position {p}",
                logits[p]
            )));
        }
    }
    Ok(())
}

/// Indices of the `k` largest values, largest first, the lower index first
/// among equal values (a stable descending sort, as `run_squad.py`'s
/// `_get_best_indexes`).
fn top_k(logits: &[f32], k: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    order.truncate(k);
    order
}

fn n_best(
    q: usize,
    context: &str,
    spans: &[Span],
    n: usize,
) -> Result<Prediction, SquadAnswerError> {
    // Byte position of every character and of the end: offsets count
    // characters, Rust slices bytes.
    let bytes: Vec<usize> = context
        .char_indices()
        .map(|(b, _)| b)
        .chain([context.len()])
        .collect();
    let mut seen = HashSet::new();
    let mut kept: Vec<(&Span, String)> = Vec::new();
    for span in spans {
        if kept.len() == n {
            break;
        }
        let (s, e) = span.chars;
        if s > e || e >= bytes.len() {
            return Err(SquadAnswerError::Input(format!(
                "question {q}: character span {s}..{e} outside its {}-character context",
                bytes.len() - 1
            )));
        }
        let text = &context[bytes[s]..bytes[e]];
        if seen.insert(text) {
            kept.push((span, text.to_string()));
        }
    }
    let max = kept.first().map_or(0.0, |(s, _)| s.score);
    let total: f64 = kept.iter().map(|(s, _)| (s.score - max).exp()).sum();
    let n_best: Vec<Candidate> = kept
        .into_iter()
        .map(|(span, text)| Candidate {
            text,
            probability: (span.score - max).exp() / total,
            start_logit: span.start_logit,
            end_logit: span.end_logit,
        })
        .collect();
    Ok(Prediction {
        text: n_best.first().map(|c| c.text.clone()).unwrap_or_default(),
        n_best,
    })
}

/// A JSON object whose keys keep the questions' order (as the official
/// script's `OrderedDict` does), refusing a repeated id.
struct Ordered<'a, V>(Vec<(&'a str, V)>);

impl<V: Serialize> Serialize for Ordered<'_, V> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

fn ordered<'a, V>(
    questions: &[QuestionContext<'a>],
    predictions: &'a [Prediction],
    value: impl Fn(&'a Prediction) -> V,
) -> Result<Ordered<'a, V>, SquadAnswerError> {
    if questions.len() != predictions.len() {
        return Err(SquadAnswerError::Input(format!(
            "{} questions but {} predictions",
            questions.len(),
            predictions.len()
        )));
    }
    let mut ids = HashSet::new();
    let mut entries = Vec::with_capacity(questions.len());
    for (question, prediction) in questions.iter().zip(predictions) {
        if !ids.insert(question.id) {
            return Err(SquadAnswerError::Input(format!(
                "question id {:?} appears twice",
                question.id
            )));
        }
        entries.push((question.id, value(prediction)));
    }
    Ok(Ordered(entries))
}

/// Writes `{"<question id>": "<answer text>", …}` (the official
/// `predictions.json` that `evaluate-v1.1.py` reads), UTF-8, to a temporary
/// file next to `path` that is then renamed over it, so a reader never sees
/// half a file.
pub fn write_predictions(
    path: &Path,
    questions: &[QuestionContext<'_>],
    predictions: &[Prediction],
) -> Result<(), SquadAnswerError> {
    let map = ordered(questions, predictions, |p| p.text.as_str())?;
    write_json(path, &map)
}

/// Writes `{"<question id>": [{"text", "probability", "start_logit",
/// "end_logit"}, …], …}` (`run_squad.py`'s `nbest_predictions.json`), the
/// same way as [`write_predictions`].
pub fn write_nbest_predictions(
    path: &Path,
    questions: &[QuestionContext<'_>],
    predictions: &[Prediction],
) -> Result<(), SquadAnswerError> {
    let map = ordered(questions, predictions, |p| p.n_best.as_slice())?;
    write_json(path, &map)
}

fn write_json(path: &Path, value: &impl Serialize) -> Result<(), SquadAnswerError> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| SquadAnswerError::Io { path, source }
    };
    let file = std::fs::File::create(&tmp).map_err(io(&tmp))?;
    let mut out = std::io::BufWriter::new(file);
    serde_json::to_writer_pretty(&mut out, value).map_err(|e| SquadAnswerError::Io {
        path: tmp.clone(),
        source: e.into(),
    })?;
    out.write_all(b"\n").map_err(io(&tmp))?;
    let file = out.into_inner().map_err(|e| SquadAnswerError::Io {
        path: tmp.clone(),
        source: e.into_error(),
    })?;
    file.sync_all().map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `[CLS] one two [SEP]` on the context "one two", then two padding
    /// positions with logits above every real one.
    const OFFSETS: [Option<(usize, usize)>; 4] = [None, Some((0, 3)), Some((4, 7)), None];
    const MAX_CONTEXT: [bool; 4] = [false, true, true, false];
    const START: [f32; 6] = [0., 2., 1., 0., 9., 9.];
    const END: [f32; 6] = [0., 1., 2., 0., 9., f32::NAN];

    fn answer(positions: usize) -> Prediction {
        let question = QuestionContext {
            id: "q",
            context: "one two",
        };
        let feature = FeatureLogits {
            example: 0,
            offsets: &OFFSETS,
            max_context: &MAX_CONTEXT,
            start_logits: &START[..positions],
            end_logits: &END[..positions],
        };
        let config = AnswerConfig {
            n_best: 2,
            max_answer: 30,
        };
        predict_answers(&[question], &[feature], &config)
            .unwrap()
            .remove(0)
    }

    #[test]
    fn padding_after_the_features_positions_does_not_change_its_answer() {
        // Own positions only: starts "one" (2), "two" (1); ends "two" (2),
        // "one" (1). Spans "one two" 2 + 2 = 4, "one" 2 + 1 = 3, "two"
        // 1 + 2 = 3; n_best 2 keeps the first two (stable order).
        let alone = answer(4);
        assert_eq!(alone.text, "one two");
        let texts: Vec<&str> = alone.n_best.iter().map(|c| c.text.as_str()).collect();
        assert_eq!(texts, ["one two", "one"]);
        // Padded to 5 and to 6 positions, as in a batch with a longer
        // feature. Were padding read, its logits 9 would take top-2 slots:
        // one padded position would leave only "one two" (starts 4 and
        // "one", ends 4 and "two"), two would leave no valid span at all;
        // and the NaN end logit at position 5 would be refused.
        assert_eq!(answer(5), alone);
        assert_eq!(answer(6), alone);
    }
}
