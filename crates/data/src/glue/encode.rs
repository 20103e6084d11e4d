//! Sentence(-pair) classification inputs: `[CLS] a [SEP]` or
//! `[CLS] a [SEP] b [SEP]`, token types 0 then 1, cut to `max_seq` by the
//! longest-first rule of Google's and HuggingFace's GLUE code (repeatedly
//! drop the last token of the longer text; of `b` on a tie).

use super::example::{Label, SentenceExample};
use crate::{DataError, WordPiece};

/// One model input (not padded).
#[derive(Debug, Clone, PartialEq)]
pub struct ClassificationFeature {
    /// Token ids.
    pub input_ids: Vec<u32>,
    /// 0 for `[CLS] a [SEP]`, 1 for `b [SEP]`.
    pub token_type_ids: Vec<u32>,
    /// The gold label, if any.
    pub label: Option<Label>,
}

/// Encodes `example` into at most `max_seq` tokens: the texts' WordPiece
/// pieces ([`WordPiece::encode_plain`]) are cut longest-first before
/// `[CLS]`/`[SEP]` are added. A `max_seq` with no room for a single text
/// token is a [`DataError::Config`].
pub fn encode_classification(
    tokenizer: &WordPiece,
    example: &SentenceExample,
    max_seq: usize,
) -> Result<ClassificationFeature, DataError> {
    let special = tokenizer.special();
    let mut a = tokenizer.encode_plain(&example.text_a)?.ids;
    let mut b = match &example.text_b {
        Some(text) => Some(tokenizer.encode_plain(text)?.ids),
        None => None,
    };
    let specials = if b.is_some() { 3 } else { 2 };
    if max_seq <= specials {
        return Err(DataError::Config {
            config: "glue",
            detail: format!("max_seq = {max_seq} leaves no room for text"),
        });
    }
    let budget = max_seq - specials;
    match &mut b {
        None => a.truncate(budget),
        Some(b) => {
            while a.len() + b.len() > budget {
                if a.len() > b.len() {
                    a.pop();
                } else {
                    b.pop();
                }
            }
        }
    }
    let mut input_ids = vec![special.cls];
    input_ids.extend_from_slice(&a);
    input_ids.push(special.sep);
    let first = input_ids.len();
    if let Some(b) = b {
        input_ids.extend_from_slice(&b);
        input_ids.push(special.sep);
    }
    let token_type_ids = (0..input_ids.len())
        .map(|i| u32::from(i >= first))
        .collect();
    Ok(ClassificationFeature {
        input_ids,
        token_type_ids,
        label: example.label,
    })
}
