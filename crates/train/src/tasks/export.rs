//! What an export directory holds beside the weights and `config.json`:
//! the tokenizer the examples were made with (so `--from DIR` and
//! `AutoTokenizer.from_pretrained(DIR)` tokenize as training did). A
//! classifier's label names are `config.json` keys, written by
//! `terse_models::bert::classifier_config_keys`.

use std::path::Path;

use crate::TrainError;

/// Copies `tokenizer` into `dir` as `tokenizer.json`.
pub(crate) fn copy_tokenizer(tokenizer: &Path, dir: &Path) -> Result<(), TrainError> {
    copy_as(tokenizer, dir, "tokenizer.json")
}

/// Copies `file` into `dir` as `name` (through a temporary file renamed
/// over any previous one).
pub(crate) fn copy_as(file: &Path, dir: &Path, name: &str) -> Result<(), TrainError> {
    let target = dir.join(name);
    let partial = dir.join(format!("{name}.partial"));
    std::fs::copy(file, &partial)
        .and_then(|_| std::fs::rename(&partial, &target))
        .map_err(|source| TrainError::Io {
            path: target,
            source,
        })?;
    Ok(())
}
