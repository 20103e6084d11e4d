//! The file SQuAD's features are kept in (`cache.rs`, through
//! `feature_cache.rs`): per window its question, length and labels; per
//! position its id, token type, character offsets and max-context flag.

use std::path::Path;

use safetensors::Dtype;

use super::SquadFeature;
use crate::DataError;
use crate::feature_cache::{Array, Tokens, narrow, read_arrays, tokens_at, words, write_arrays};

/// The header's format name.
const FORMAT: &str = "terse SQuAD features";

/// An offset of a position outside the context (`None`).
const NO_OFFSET: u32 = u32::MAX;

/// The arrays' little-endian bytes.
#[derive(Default)]
struct Columns {
    example: Vec<u8>,
    length: Vec<u8>,
    start_position: Vec<u8>,
    end_position: Vec<u8>,
    tokens: Tokens,
    offsets: Vec<u8>,
    max_context: Vec<u8>,
}

impl Columns {
    fn of(features: &[SquadFeature]) -> Result<Self, String> {
        let word = |value, what| narrow(value, what, Some(NO_OFFSET));
        let mut c = Columns::default();
        for f in features {
            c.example.extend(word(f.example, "question index")?);
            c.length.extend(word(f.len(), "length")?);
            c.start_position
                .extend(word(f.start_position, "start position")?);
            c.end_position.extend(word(f.end_position, "end position")?);
            c.tokens.push(&f.input_ids, &f.token_type_ids)?;
            for offset in &f.offsets {
                match *offset {
                    Some((s, e)) => {
                        c.offsets.extend(word(s, "offset")?);
                        c.offsets.extend(word(e, "offset")?);
                    }
                    None => c.offsets.extend([NO_OFFSET.to_le_bytes(); 2].concat()),
                }
            }
            c.max_context
                .extend(f.max_context.iter().map(|&m| u8::from(m)));
        }
        Ok(c)
    }

    fn arrays(&self) -> [Array<'_>; 8] {
        let n = self.example.len() / 4;
        let positions = self.tokens.positions();
        let [input_ids, token_type_ids] = self.tokens.arrays();
        [
            ("example", Dtype::U32, vec![n], &self.example),
            ("length", Dtype::U32, vec![n], &self.length),
            ("start_position", Dtype::U32, vec![n], &self.start_position),
            ("end_position", Dtype::U32, vec![n], &self.end_position),
            input_ids,
            token_type_ids,
            ("offsets", Dtype::U32, vec![positions, 2], &self.offsets),
            ("max_context", Dtype::U8, vec![positions], &self.max_context),
        ]
    }
}

/// Writes `features`, the windows of `questions` questions, to `path`.
pub(super) fn write_features(
    path: &Path,
    features: &[SquadFeature],
    questions: usize,
) -> Result<(), String> {
    write_arrays(path, FORMAT, questions, &Columns::of(features)?.arrays())
}

/// The features in `path`, checked as the windows of `questions`
/// questions.
pub(super) fn read_features(path: &Path, questions: usize) -> Result<Vec<SquadFeature>, DataError> {
    read_arrays(path, FORMAT, questions, |arrays| {
        let example = words(arrays.get("example", Dtype::U32)?);
        let length = words(arrays.get("length", Dtype::U32)?);
        let start_position = words(arrays.get("start_position", Dtype::U32)?);
        let end_position = words(arrays.get("end_position", Dtype::U32)?);
        let input_ids = arrays.get("input_ids", Dtype::U32)?;
        let offsets = arrays.get("offsets", Dtype::U32)?;
        let token_type_ids = arrays.get("token_type_ids", Dtype::U8)?;
        let max_context = arrays.get("max_context", Dtype::U8)?;
        let n = example.len();
        let positions: usize = length.iter().map(|&l| l as usize).sum();
        if [length.len(), start_position.len(), end_position.len()] != [n; 3]
            || [input_ids.len(), offsets.len()] != [4 * positions, 8 * positions]
            || [token_type_ids.len(), max_context.len()] != [positions; 2]
        {
            return Err(arrays.bad("arrays of inconsistent lengths".into()));
        }
        // Windows come in question order (what the dev limit relies on),
        // and their labels are positions within them.
        let in_order = example.windows(2).all(|w| w[0] <= w[1]);
        if !in_order || example.last().is_some_and(|&e| e as usize >= questions) {
            return Err(arrays.bad(format!(
                "windows out of question order or beyond the {questions} questions"
            )));
        }
        let mut features = Vec::with_capacity(n);
        let mut at = 0;
        for i in 0..n {
            let span = at..at + length[i] as usize;
            at = span.end;
            let (start, end) = (start_position[i], end_position[i]);
            if start > end || end >= length[i].max(1) {
                return Err(arrays.bad(format!(
                    "window {i}: labels {start}..={end} outside its {} positions",
                    length[i]
                )));
            }
            let (ids, types) = tokens_at(input_ids, token_type_ids, span.clone());
            features.push(SquadFeature {
                example: example[i] as usize,
                input_ids: ids,
                token_type_ids: types,
                offsets: words(&offsets[8 * span.start..8 * span.end])
                    .chunks_exact(2)
                    .map(|pair| {
                        (pair[0] != NO_OFFSET).then(|| (pair[0] as usize, pair[1] as usize))
                    })
                    .collect(),
                max_context: max_context[span].iter().map(|&m| m != 0).collect(),
                start_position: start as usize,
                end_position: end as usize,
            });
        }
        Ok(features)
    })
}
