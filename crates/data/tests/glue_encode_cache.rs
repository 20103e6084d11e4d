//! A sentence task's encodings kept in the cache between runs: what a later
//! run reads back is what `encode_classification` gives (all of SNLI's
//! 9,824 test pairs, every id and token type), with the labels of the
//! examples read now; the name changes with the texts, `max_seq` and the
//! tokenizer, and a damaged file is encoded again.
//!
//! Needs the SNLI files and MiniLM's tokenizer (fetched into the cache on
//! first use).

use terse_data::glue::{Label, SentenceExample, cached_encodings, encode_classification};
use terse_data::{FeatureSource, WordPiece, dataset, minilm_tokenizer, read_snli};

fn tokenizer() -> WordPiece {
    WordPiece::from_tokenizer_json(&minilm_tokenizer().unwrap()).unwrap()
}

fn pair(a: &str, b: Option<&str>, label: u32) -> SentenceExample {
    SentenceExample {
        guid: String::new(),
        text_a: a.into(),
        text_b: b.map(Into::into),
        label: Some(Label::Class(label)),
    }
}

#[test]
fn snli_s_test_pairs_read_back_are_what_encoding_gives() {
    let examples = read_snli(&dataset("snli").unwrap().join("snli_1.0_test.jsonl")).unwrap();
    assert_eq!(examples.len(), 9_824);
    let tokenizer = tokenizer();
    let cache = tempfile::tempdir().unwrap();
    let encode = || cached_encodings(&tokenizer, &examples, 128, cache.path(), "snli-test");
    let (made, path, source) = encode().unwrap();
    assert_eq!(source, FeatureSource::Featurized { kept: true });
    let name = path.file_name().unwrap().to_string_lossy().to_string();
    assert!(name.starts_with("snli-test-seq128-"), "{name}");
    let (read, again, source) = encode().unwrap();
    assert_eq!((again, source), (path, FeatureSource::Cache));
    let direct: Vec<_> = examples
        .iter()
        .map(|e| encode_classification(&tokenizer, e, 128).unwrap())
        .collect();
    assert!(direct.iter().any(|f| f.token_type_ids.contains(&1)));
    assert!(made == direct, "encoded through the cache differs");
    assert!(read == direct, "read back from the cache differs");
}

#[test]
fn labels_come_from_the_examples_and_names_from_what_is_encoded() {
    let tokenizer = tokenizer();
    let dir = tempfile::tempdir().unwrap();
    let examples = vec![
        pair("A cat sat.", Some("An animal rests."), 0),
        pair("Rain fell all day.", None, 1),
    ];
    let encode = |examples: &[SentenceExample], max_seq| {
        cached_encodings(&tokenizer, examples, max_seq, dir.path(), "pairs").unwrap()
    };
    let (_, base, _) = encode(&examples, 16);
    // Other labels, same texts: the same file, the new labels.
    let mut relabelled = examples.clone();
    relabelled[1].label = Some(Label::Class(2));
    let (features, path, source) = encode(&relabelled, 16);
    assert_eq!((path, source), (base.clone(), FeatureSource::Cache));
    assert_eq!(features[1].label, Some(Label::Class(2)));
    let mut other_text = examples.clone();
    other_text[0].text_b = Some("An animal sleeps.".into());
    assert_ne!(encode(&other_text, 16).1, base, "another text");
    let mut unpaired = examples.clone();
    unpaired[0].text_b = None;
    assert_ne!(encode(&unpaired, 16).1, base, "a pair made single");
    assert_ne!(encode(&examples, 12).1, base, "another max_seq");
    let vocab = dir.path().join("vocab.txt");
    std::fs::write(&vocab, "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\ncat\n").unwrap();
    let small = WordPiece::from_vocab(&vocab, true).unwrap();
    let (_, path, _) = cached_encodings(&small, &examples, 16, dir.path(), "pairs").unwrap();
    assert_ne!(path, base, "another tokenizer");
}

#[test]
fn a_damaged_file_is_encoded_again() {
    let tokenizer = tokenizer();
    let dir = tempfile::tempdir().unwrap();
    let examples = vec![pair("A cat sat.", Some("An animal rests."), 0)];
    let encode = || cached_encodings(&tokenizer, &examples, 16, dir.path(), "pairs").unwrap();
    let (made, path, _) = encode();
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    let (again, _, source) = encode();
    assert_eq!(source, FeatureSource::Featurized { kept: true });
    assert!(again == made);
    assert_eq!(encode().2, FeatureSource::Cache);
}

#[test]
fn files_unused_for_30_days_make_way_for_a_new_one_of_their_kind() {
    use std::time::{Duration, SystemTime};
    let days = |n: u64| SystemTime::now() - Duration::from_secs(n * 24 * 3600);
    let aged = |path: &std::path::Path, at: SystemTime| {
        let file = std::fs::File::options().write(true).open(path).unwrap();
        file.set_modified(at).unwrap();
    };
    let tokenizer = tokenizer();
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, unused_days: u64| {
        let path = dir.path().join(name);
        std::fs::write(&path, "an older version's").unwrap();
        aged(&path, days(unused_days));
        path
    };
    // Of this kind (`pairs`, seq 16) but another hash: one unused for 40
    // days (with its lock), one used yesterday; of another kind, unused.
    let stale = file("pairs-seq16-0123456789abcdef.safetensors", 40);
    std::fs::write(stale.with_extension("lock"), "").unwrap();
    let recent = file("pairs-seq16-fedcba9876543210.safetensors", 1);
    let other_kind = file("pairs-seq12-0123456789abcdef.safetensors", 40);
    let examples = vec![pair("A cat sat.", Some("An animal rests."), 0)];
    let encode = || cached_encodings(&tokenizer, &examples, 16, dir.path(), "pairs").unwrap();
    let (_, path, source) = encode();
    assert_eq!(source, FeatureSource::Featurized { kept: true });
    assert!(!stale.exists() && !stale.with_extension("lock").exists());
    assert!(recent.exists() && other_kind.exists() && path.exists());
    // A read is a use: the file's time becomes now.
    aged(&path, days(40));
    assert_eq!(encode().2, FeatureSource::Cache);
    let modified = std::fs::metadata(&path).unwrap().modified().unwrap();
    assert!(modified > days(1), "the read did not mark the file used");
}
