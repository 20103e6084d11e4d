//! SQuAD featurization: each question with a sliding window over its context,
//! `[CLS] question [SEP] window [SEP]`, as BERT's `run_squad.py`
//! (`convert_examples_to_features`) builds them, on the WordPiece tokens and
//! character offsets of HuggingFace `tokenizers`.
//!
//! The windows follow Google's `run_squad.py`: at most
//! `max_seq − q_len − 3` context tokens each, the next one starting
//! `doc_stride` tokens further on, the last one reaching the end of the
//! context. (HuggingFace's `prepare_*_features` passes the same `doc_stride`
//! to the tokenizer as the *overlap* between windows instead, which gives
//! fewer windows; the labels, offsets and max-context rule are the same.)
//!
//! A token appears in several windows; [`SquadFeature::max_context`] marks
//! the one window where it has the most context on both sides (Google's
//! `_check_is_max_context`), so that post-processing takes each answer start
//! from one window only.

use serde::{Deserialize, Serialize};

use crate::squad::SquadExample;
use crate::{DataError, Encoding, WordPiece};

fn default_max_seq() -> usize {
    384
}
fn default_doc_stride() -> usize {
    128
}
fn default_max_query() -> usize {
    64
}

/// Window sizes of SQuAD featurization; the defaults are BERT's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SquadFeatureConfig {
    /// Tokens per feature, `[CLS]` and both `[SEP]` included.
    #[serde(default = "default_max_seq")]
    pub max_seq: usize,
    /// Context tokens from one window's start to the next one's.
    #[serde(default = "default_doc_stride")]
    pub doc_stride: usize,
    /// Question tokens kept; longer questions are cut to their first
    /// `max_query` tokens.
    #[serde(default = "default_max_query")]
    pub max_query: usize,
}

impl Default for SquadFeatureConfig {
    fn default() -> Self {
        SquadFeatureConfig {
            max_seq: default_max_seq(),
            doc_stride: default_doc_stride(),
            max_query: default_max_query(),
        }
    }
}

impl SquadFeatureConfig {
    /// Context tokens per window when the question is as long as it may be.
    pub fn min_window(&self) -> Option<usize> {
        self.max_seq
            .checked_sub(self.max_query + 3)
            .filter(|&w| w > 0)
    }

    /// Checks the rules between the fields: a question of `max_query` tokens
    /// must leave room for at least one context token, and `doc_stride` must
    /// be between 1 and that smallest window (a longer stride would skip
    /// context tokens; `run_squad.py` silently shortens it instead).
    pub fn validate(&self) -> Result<(), DataError> {
        let fail = |detail: String| DataError::Config {
            config: "SquadFeatureConfig",
            detail,
        };
        if self.max_query == 0 {
            return Err(fail("max_query is 0: the question would be dropped".into()));
        }
        let window = self.min_window().ok_or_else(|| {
            fail(format!(
                "max_seq {} leaves no context token after a {}-token question, [CLS] and two [SEP]",
                self.max_seq, self.max_query
            ))
        })?;
        if self.doc_stride == 0 || self.doc_stride > window {
            return Err(fail(format!(
                "doc_stride {} must be in 1..={window} (max_seq {} - max_query {} - 3), \
                 or windows would repeat or skip context tokens",
                self.doc_stride, self.max_seq, self.max_query
            )));
        }
        Ok(())
    }
}

/// One window of one question: a model input with what post-processing
/// needs to map its positions back to the context. Not padded: batches pad
/// `input_ids` with `[PAD]` and mask the padding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SquadFeature {
    /// Index of the question in the examples featurized.
    pub example: usize,
    /// `[CLS] question [SEP] window [SEP]`.
    pub input_ids: Vec<u32>,
    /// 0 for `[CLS]`, the question and its `[SEP]`; 1 for the window and the
    /// last `[SEP]`.
    pub token_type_ids: Vec<u32>,
    /// Per position, the `(start, end)` character offsets of a window token
    /// in the context; `None` for `[CLS]`, the question and `[SEP]`.
    pub offsets: Vec<Option<(usize, usize)>>,
    /// Per position, whether this window is the one where the token has the
    /// most context (false outside the window).
    pub max_context: Vec<bool>,
    /// Position of the first answer's first token, or 0 (`[CLS]`) when the
    /// answer is not entirely inside this window.
    pub start_position: usize,
    /// Position of the first answer's last token, or 0 (`[CLS]`).
    pub end_position: usize,
}

impl SquadFeature {
    /// Number of positions (at most `max_seq`).
    pub fn len(&self) -> usize {
        self.input_ids.len()
    }

    /// Whether there are no positions (never, for a built feature).
    pub fn is_empty(&self) -> bool {
        self.input_ids.is_empty()
    }
}

/// Builds [`SquadFeature`]s with one tokenizer and one validated config.
#[derive(Debug)]
pub struct SquadFeaturizer<'t> {
    tokenizer: &'t WordPiece,
    config: SquadFeatureConfig,
}

impl<'t> SquadFeaturizer<'t> {
    /// Validates `config` (see [`SquadFeatureConfig::validate`]).
    pub fn new(tokenizer: &'t WordPiece, config: SquadFeatureConfig) -> Result<Self, DataError> {
        config.validate()?;
        Ok(SquadFeaturizer { tokenizer, config })
    }

    /// The config.
    pub fn config(&self) -> &SquadFeatureConfig {
        &self.config
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &WordPiece {
        self.tokenizer
    }

    /// The features of all `examples`, in order (each example's windows in
    /// context order); `SquadFeature::example` indexes `examples`. Labels
    /// come from each example's first answer. A context with no tokens at
    /// all gives no feature (as in `run_squad.py`).
    pub fn featurize(&self, examples: &[SquadExample]) -> Result<Vec<SquadFeature>, DataError> {
        let progress = crate::progress::bar(examples.len(), "featurizing questions");
        let mut features = Vec::with_capacity(examples.len() * 5 / 4);
        // A paragraph's questions are consecutive and share its `Arc`:
        // tokenize each context once (SQuAD has ~5 questions per paragraph).
        let mut last: Option<(&SquadExample, Encoding)> = None;
        for (index, example) in examples.iter().enumerate() {
            let reuse = matches!(&last, Some((prev, _)) if std::sync::Arc::ptr_eq(&prev.context, &example.context));
            if !reuse {
                last = Some((example, self.tokenizer.encode_plain(&example.context)?));
            }
            let context = last.as_ref().map(|(_, encoding)| encoding);
            if let Some(context) = context {
                self.windows(index, example, context, &mut features)?;
            }
            progress.inc(1);
        }
        progress.finish_and_clear();
        Ok(features)
    }

    /// The features of one example, with `SquadFeature::example` set to `index`.
    pub fn featurize_example(
        &self,
        index: usize,
        example: &SquadExample,
    ) -> Result<Vec<SquadFeature>, DataError> {
        let context = self.tokenizer.encode_plain(&example.context)?;
        let mut features = Vec::new();
        self.windows(index, example, &context, &mut features)?;
        Ok(features)
    }

    fn windows(
        &self,
        index: usize,
        example: &SquadExample,
        context: &Encoding,
        out: &mut Vec<SquadFeature>,
    ) -> Result<(), DataError> {
        let special = self.tokenizer.special();
        let question = self.tokenizer.encode_plain(&example.question)?;
        let q_len = question.len().min(self.config.max_query);
        // validate() guarantees max_seq > max_query + 3 ≥ q_len + 3.
        let window = self.config.max_seq - q_len - 3;
        let spans = doc_spans(context.len(), window, self.config.doc_stride);
        let answer = example
            .answers
            .first()
            .and_then(|a| answer_token_span(&context.offsets, a.start, a.end()));
        let offset = q_len + 2;
        for (w, &(start, len)) in spans.iter().enumerate() {
            let seq = offset + len + 1;
            let mut input_ids = Vec::with_capacity(seq);
            input_ids.push(special.cls);
            input_ids.extend_from_slice(&question.ids[..q_len]);
            input_ids.push(special.sep);
            input_ids.extend_from_slice(&context.ids[start..start + len]);
            input_ids.push(special.sep);
            let mut token_type_ids = vec![0; offset];
            token_type_ids.resize(seq, 1);
            let mut offsets = vec![None; offset];
            offsets.extend(
                context.offsets[start..start + len]
                    .iter()
                    .copied()
                    .map(Some),
            );
            offsets.push(None);
            let mut max_context = vec![false; offset];
            max_context.extend((start..start + len).map(|t| is_max_context(&spans, w, t)));
            max_context.push(false);
            let (start_position, end_position) = match answer {
                Some((s, e)) if s >= start && e < start + len => {
                    (s - start + offset, e - start + offset)
                }
                _ => (0, 0),
            };
            out.push(SquadFeature {
                example: index,
                input_ids,
                token_type_ids,
                offsets,
                max_context,
                start_position,
                end_position,
            });
        }
        Ok(())
    }
}

/// `(start, len)` of each window over `tokens` context tokens
/// (`run_squad.py`'s `doc_spans` loop).
fn doc_spans(tokens: usize, window: usize, stride: usize) -> Vec<(usize, usize)> {
    let mut spans = Vec::new();
    let mut start = 0;
    while start < tokens {
        let len = (tokens - start).min(window);
        spans.push((start, len));
        if start + len == tokens {
            break;
        }
        start += len.min(stride);
    }
    spans
}

/// Whether window `current` is where context token `token` has the most
/// context: score `min(left, right) + 0.01·len`, the first window winning
/// ties (`_check_is_max_context`), computed in hundredths so that no
/// floating-point rounding decides a tie.
fn is_max_context(spans: &[(usize, usize)], current: usize, token: usize) -> bool {
    let mut best: Option<(usize, usize)> = None;
    for (w, &(start, len)) in spans.iter().enumerate() {
        if token < start || token >= start + len {
            continue;
        }
        let end = start + len - 1;
        let score = 100 * (token - start).min(end - token) + len;
        if best.is_none_or(|(_, b)| score > b) {
            best = Some((w, score));
        }
    }
    best.map(|(w, _)| w) == Some(current)
}

/// The first and last tokens that overlap characters `start..end` of the
/// context, or `None` when no token does (an answer made only of characters
/// the tokenizer drops). HuggingFace instead takes the last token starting
/// at or before `start`, which differs only for an answer that begins on a
/// character no token covers (a space); SQuAD v1.1 has none.
fn answer_token_span(
    offsets: &[(usize, usize)],
    start: usize,
    end: usize,
) -> Option<(usize, usize)> {
    let first = offsets.iter().position(|&(_, e)| e > start)?;
    let last = offsets.iter().rposition(|&(s, _)| s < end)?;
    (first <= last).then_some((first, last))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_advance_by_the_stride_and_the_last_reaches_the_end() {
        // 13 tokens, windows of 6, stride 3: 0..6, 3..9, 6..12, then 9..13
        // (only 4 left) reaches the end.
        assert_eq!(doc_spans(13, 6, 3), vec![(0, 6), (3, 6), (6, 6), (9, 4)]);
        // Exactly two windows' worth with a stride of a whole window.
        assert_eq!(doc_spans(8, 4, 4), vec![(0, 4), (4, 4)]);
        assert_eq!(doc_spans(3, 6, 3), vec![(0, 3)]);
        assert_eq!(doc_spans(0, 6, 3), vec![]);
    }

    #[test]
    fn max_context_prefers_centre_then_longer_window_then_first() {
        let spans = [(0, 6), (3, 6), (6, 6), (9, 4)];
        // Token 10: window 2 has min(4, 1) = 1 and length 6 (score 106);
        // window 3 has min(1, 2) = 1 and length 4 (104): window 2.
        assert!(is_max_context(&spans, 2, 10));
        assert!(!is_max_context(&spans, 3, 10));
        // Token 4: windows 0 and 1 both score 1·100 + 6: the first wins.
        assert!(is_max_context(&spans, 0, 4));
        assert!(!is_max_context(&spans, 1, 4));
        // A token outside the window is never its max context.
        assert!(!is_max_context(&spans, 0, 7));
    }

    #[test]
    fn answer_span_covers_the_tokens_overlapping_the_answer() {
        // "the café door." as (0,3) (4,8) (9,13) (13,14).
        let offsets = [(0, 3), (4, 8), (9, 13), (13, 14)];
        assert_eq!(answer_token_span(&offsets, 4, 13), Some((1, 2)));
        // Part of a token: the whole token.
        assert_eq!(answer_token_span(&offsets, 5, 7), Some((1, 1)));
        // Leading and trailing spaces add no token.
        assert_eq!(answer_token_span(&offsets, 3, 9), Some((1, 1)));
        // Only a space: no token.
        assert_eq!(answer_token_span(&offsets, 3, 4), None);
    }

    #[test]
    fn config_defaults_and_validation() {
        let config: SquadFeatureConfig = serde_json::from_str("{}").unwrap();
        assert_eq!(config, SquadFeatureConfig::default());
        assert_eq!(
            (config.max_seq, config.doc_stride, config.max_query),
            (384, 128, 64)
        );
        assert_eq!(config.min_window(), Some(317));
        assert!(config.validate().is_ok());
        assert!(serde_json::from_str::<SquadFeatureConfig>(r#"{"stride": 3}"#).is_err());
        let bad = |max_seq, doc_stride, max_query| {
            SquadFeatureConfig {
                max_seq,
                doc_stride,
                max_query,
            }
            .validate()
            .unwrap_err()
            .to_string()
        };
        assert_eq!(
            bad(67, 1, 64),
            "SquadFeatureConfig: max_seq 67 leaves no context token after a 64-token question, [CLS] and two [SEP]"
        );
        assert_eq!(
            bad(384, 318, 64),
            "SquadFeatureConfig: doc_stride 318 must be in 1..=317 (max_seq 384 - max_query 64 - 3), \
             or windows would repeat or skip context tokens"
        );
        assert!(bad(384, 0, 64).contains("doc_stride 0"));
        assert!(bad(384, 128, 0).contains("max_query is 0"));
        let edge = SquadFeatureConfig {
            max_seq: 68,
            doc_stride: 1,
            max_query: 64,
        };
        assert!(edge.validate().is_ok());
    }
}
