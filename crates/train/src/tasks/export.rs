//! What an export directory holds beside the weights and `config.json`:
//! the tokenizer the examples were made with (so `--from DIR` and
//! `AutoTokenizer.from_pretrained(DIR)` tokenize as training did) and a
//! classifier's label names (so `transformers` builds a head of the right
//! size).

use std::path::Path;

use crate::TrainError;

/// `config.json` keys of a sequence classifier over `names` (in label
/// order); no names: a one-output regression head.
pub(crate) fn classification_head(names: &[&str]) -> serde_json::Map<String, serde_json::Value> {
    let mut head = serde_json::Map::new();
    if names.is_empty() {
        head.insert("num_labels".into(), 1.into());
        head.insert("problem_type".into(), "regression".into());
        return head;
    }
    let id2label: serde_json::Map<String, serde_json::Value> = names
        .iter()
        .enumerate()
        .map(|(i, name)| (i.to_string(), (*name).into()))
        .collect();
    let label2id: serde_json::Map<String, serde_json::Value> = names
        .iter()
        .enumerate()
        .map(|(i, name)| ((*name).to_string(), i.into()))
        .collect();
    head.insert("num_labels".into(), names.len().into());
    head.insert("id2label".into(), id2label.into());
    head.insert("label2id".into(), label2id.into());
    head.insert("problem_type".into(), "single_label_classification".into());
    head
}

/// Copies `tokenizer` into `dir` as `tokenizer.json` (through a temporary
/// file renamed over any previous one).
pub(crate) fn copy_tokenizer(tokenizer: &Path, dir: &Path) -> Result<(), TrainError> {
    let target = dir.join("tokenizer.json");
    let partial = dir.join("tokenizer.json.partial");
    std::fs::copy(tokenizer, &partial)
        .and_then(|_| std::fs::rename(&partial, &target))
        .map_err(|source| TrainError::Io {
            path: target,
            source,
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_three_class_head_names_its_labels_both_ways() {
        let head = classification_head(&["contradiction", "entailment", "neutral"]);
        let json = serde_json::Value::Object(head);
        assert_eq!(json["num_labels"], 3);
        assert_eq!(json["id2label"]["2"], "neutral");
        assert_eq!(json["label2id"]["entailment"], 1);
        assert_eq!(json["problem_type"], "single_label_classification");
        let regression = serde_json::Value::Object(classification_head(&[]));
        assert_eq!(regression["num_labels"], 1);
        assert_eq!(regression["problem_type"], "regression");
    }
}
