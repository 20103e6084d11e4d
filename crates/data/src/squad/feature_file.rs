//! The file SQuAD's features are kept in (`cache.rs`): safetensors with
//! flat little-endian arrays — per window its question, length and labels;
//! per position its id, token type, character offsets and max-context
//! flag — and in the header the number of questions and a CRC-32C of the
//! arrays' bytes.

use std::collections::HashMap;
use std::fs;
use std::path::Path;

use safetensors::{Dtype, SafeTensors, tensor::TensorView};

use super::SquadFeature;
use crate::DataError;
use crate::fetch::io;

/// An offset pair of a position outside the context (`None`).
const NO_OFFSET: u32 = u32::MAX;

/// The arrays' little-endian bytes.
#[derive(Default)]
struct Columns {
    example: Vec<u8>,
    length: Vec<u8>,
    start_position: Vec<u8>,
    end_position: Vec<u8>,
    input_ids: Vec<u8>,
    token_type_ids: Vec<u8>,
    offsets: Vec<u8>,
    max_context: Vec<u8>,
}

/// `value` as the file's 32 bits (`NO_OFFSET` is reserved).
fn narrow(value: usize, what: &str) -> Result<[u8; 4], String> {
    u32::try_from(value)
        .ok()
        .filter(|&v| v != NO_OFFSET)
        .map(u32::to_le_bytes)
        .ok_or_else(|| format!("{what} {value} does not fit the file's 32 bits"))
}

impl Columns {
    fn of(features: &[SquadFeature]) -> Result<Self, String> {
        let mut c = Columns::default();
        for f in features {
            c.example.extend(narrow(f.example, "question index")?);
            c.length.extend(narrow(f.len(), "length")?);
            c.start_position
                .extend(narrow(f.start_position, "start position")?);
            c.end_position
                .extend(narrow(f.end_position, "end position")?);
            c.input_ids
                .extend(f.input_ids.iter().flat_map(|id| id.to_le_bytes()));
            for &t in &f.token_type_ids {
                c.token_type_ids.push(
                    u8::try_from(t).map_err(|_| format!("token type {t} does not fit 8 bits"))?,
                );
            }
            for offset in &f.offsets {
                match *offset {
                    Some((s, e)) => {
                        c.offsets.extend(narrow(s, "offset")?);
                        c.offsets.extend(narrow(e, "offset")?);
                    }
                    None => c.offsets.extend([NO_OFFSET.to_le_bytes(); 2].concat()),
                }
            }
            c.max_context
                .extend(f.max_context.iter().map(|&m| u8::from(m)));
        }
        Ok(c)
    }

    /// Name, dtype, shape and bytes of each array.
    fn arrays(&self) -> [(&'static str, Dtype, Vec<usize>, &[u8]); 8] {
        let n = self.example.len() / 4;
        let positions = self.token_type_ids.len();
        [
            ("example", Dtype::U32, vec![n], &self.example),
            ("length", Dtype::U32, vec![n], &self.length),
            ("start_position", Dtype::U32, vec![n], &self.start_position),
            ("end_position", Dtype::U32, vec![n], &self.end_position),
            ("input_ids", Dtype::U32, vec![positions], &self.input_ids),
            (
                "token_type_ids",
                Dtype::U8,
                vec![positions],
                &self.token_type_ids,
            ),
            ("offsets", Dtype::U32, vec![positions, 2], &self.offsets),
            ("max_context", Dtype::U8, vec![positions], &self.max_context),
        ]
    }
}

/// CRC-32C over the arrays' bytes in name order.
fn checksum<'a>(arrays: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> String {
    let mut arrays: Vec<_> = arrays.into_iter().collect();
    arrays.sort_by_key(|&(name, _)| name);
    let crc = arrays
        .iter()
        .fold(0, |crc, (_, bytes)| crc32c::crc32c_append(crc, bytes));
    format!("{crc:08x}")
}

/// Writes `features`, the windows of `questions` questions, to `path`,
/// synced, readable by every user (a shared `TERSE_CACHE`).
pub(super) fn write_features(
    path: &Path,
    features: &[SquadFeature],
    questions: usize,
) -> Result<(), String> {
    let columns = Columns::of(features)?;
    let arrays = columns.arrays();
    let crc = checksum(arrays.iter().map(|(name, _, _, bytes)| (*name, *bytes)));
    let views = arrays
        .iter()
        .map(|(name, dtype, shape, bytes)| {
            TensorView::new(*dtype, shape.clone(), bytes)
                .map(|view| (*name, view))
                .map_err(|e| format!("array `{name}`: {e}"))
        })
        .collect::<Result<Vec<_>, String>>()?;
    let metadata = HashMap::from([
        ("format".to_string(), "terse SQuAD features".to_string()),
        ("questions".to_string(), questions.to_string()),
        ("crc32c".to_string(), crc),
    ]);
    safetensors::serialize_to_file(views, Some(metadata), path).map_err(|e| e.to_string())?;
    // safetensors writes through a temporary file of mode 0600.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(path, fs::Permissions::from_mode(0o644)).map_err(|e| e.to_string())?;
    }
    fs::File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| e.to_string())
}

/// The features in `path`, checked against its checksum, as the windows of
/// `questions` questions.
pub(super) fn read_features(path: &Path, questions: usize) -> Result<Vec<SquadFeature>, DataError> {
    let bad = |detail: String| DataError::Format {
        path: path.to_path_buf(),
        detail,
    };
    let bytes = fs::read(path).map_err(io(path))?;
    let tensors = SafeTensors::deserialize(&bytes).map_err(|e| bad(e.to_string()))?;
    let (_, header) = SafeTensors::read_metadata(&bytes).map_err(|e| bad(e.to_string()))?;
    let field = |name: &str| {
        header
            .metadata()
            .as_ref()
            .and_then(|m| m.get(name).cloned())
            .ok_or_else(|| bad(format!("no {name} in the header")))
    };
    let stored = field("crc32c")?;
    let views = tensors
        .names()
        .into_iter()
        .map(|name| Ok((name, tensors.tensor(name).map_err(|e| bad(e.to_string()))?)))
        .collect::<Result<Vec<_>, DataError>>()?;
    let actual = checksum(views.iter().map(|(name, view)| (*name, view.data())));
    if stored != actual {
        return Err(bad(format!("CRC-32C {actual}, the header says {stored}")));
    }
    if field("questions")? != questions.to_string() {
        return Err(bad(format!(
            "the windows of {} questions, not of the {questions} read",
            field("questions")?
        )));
    }
    let array = |name: &str, dtype: Dtype| -> Result<&[u8], DataError> {
        let view = tensors
            .tensor(name)
            .map_err(|_| bad(format!("no array `{name}`")))?;
        if view.dtype() != dtype {
            return Err(bad(format!(
                "array `{name}` is {:?}, not {dtype:?}",
                view.dtype()
            )));
        }
        Ok(view.data())
    };
    let words = |bytes: &[u8]| -> Vec<u32> {
        bytes
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    };
    let example = words(array("example", Dtype::U32)?);
    let length = words(array("length", Dtype::U32)?);
    let start_position = words(array("start_position", Dtype::U32)?);
    let end_position = words(array("end_position", Dtype::U32)?);
    let input_ids = array("input_ids", Dtype::U32)?;
    let offsets = array("offsets", Dtype::U32)?;
    let token_type_ids = array("token_type_ids", Dtype::U8)?;
    let max_context = array("max_context", Dtype::U8)?;
    let n = example.len();
    let positions: usize = length.iter().map(|&l| l as usize).sum();
    if [length.len(), start_position.len(), end_position.len()] != [n; 3]
        || [input_ids.len(), offsets.len()] != [4 * positions, 8 * positions]
        || [token_type_ids.len(), max_context.len()] != [positions; 2]
    {
        return Err(bad("arrays of inconsistent lengths".into()));
    }
    // Windows come in question order (what the dev limit relies on), and
    // their labels are positions within them.
    let in_order = example.windows(2).all(|w| w[0] <= w[1]);
    if !in_order || example.last().is_some_and(|&e| e as usize >= questions) {
        return Err(bad(format!(
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
            return Err(bad(format!(
                "window {i}: labels {start}..={end} outside its {} positions",
                length[i]
            )));
        }
        features.push(SquadFeature {
            example: example[i] as usize,
            input_ids: words(&input_ids[4 * span.start..4 * span.end]),
            token_type_ids: token_type_ids[span.clone()]
                .iter()
                .map(|&t| u32::from(t))
                .collect(),
            offsets: words(&offsets[8 * span.start..8 * span.end])
                .chunks_exact(2)
                .map(|pair| (pair[0] != NO_OFFSET).then(|| (pair[0] as usize, pair[1] as usize)))
                .collect(),
            max_context: max_context[span].iter().map(|&m| m != 0).collect(),
            start_position: start as usize,
            end_position: end as usize,
        });
    }
    Ok(features)
}
