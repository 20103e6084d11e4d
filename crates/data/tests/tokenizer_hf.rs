//! WordPiece against HuggingFace `tokenizers` (Python) on the MiniLM's own
//! tokenizer: ids, token types, tokens and character offsets of single texts
//! and pairs with accents, punctuation, CJK, emoji, control characters and
//! words split into several pieces, for the tokenizer loaded from
//! `tokenizer.json` and the one built from `vocab.txt`. The reference was
//! computed once by `models/tests/fixtures/make_hf_fixtures.py`.
//!
//! Needs the MiniLM files (fetched into the cache on first use, 84 MB).

use serde::Deserialize;
use terse_data::{Encoding, WordPiece, minilm};

#[derive(Deserialize)]
struct Case {
    text: String,
    #[serde(default)]
    pair: Option<String>,
    ids: Vec<u32>,
    type_ids: Vec<u32>,
    tokens: Vec<String>,
    offsets: Vec<(usize, usize)>,
    sequence_ids: Vec<Option<usize>>,
}

#[derive(Deserialize)]
struct Fixture {
    offsets: String,
    singles: Vec<Case>,
    pairs: Vec<Case>,
}

fn fixture() -> Fixture {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../models/tests/fixtures/minilm_tokenizer.json"
    );
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn check(name: &str, tokenizer: &WordPiece, fixture: &Fixture) {
    assert_eq!(fixture.offsets, "chars");
    let mut checked = 0;
    for case in fixture.singles.iter().chain(&fixture.pairs) {
        let got: Encoding = match &case.pair {
            None => tokenizer.encode(&case.text).unwrap(),
            Some(pair) => tokenizer.encode_pair(&case.text, pair).unwrap(),
        };
        let what = format!("{name}: {:?} / {:?}", case.text, case.pair);
        assert_eq!(got.tokens, case.tokens, "{what}");
        assert_eq!(got.ids, case.ids, "{what}");
        assert_eq!(got.type_ids, case.type_ids, "{what}");
        assert_eq!(got.offsets, case.offsets, "{what}");
        assert_eq!(got.sequence, case.sequence_ids, "{what}");
        checked += 1;
    }
    assert!(checked >= 15, "{checked} cases");
}

#[test]
fn wordpiece_matches_huggingface_ids_and_offsets() {
    let files = minilm().unwrap();
    let fixture = fixture();
    let from_json = WordPiece::from_tokenizer_json(&files.tokenizer).unwrap();
    check("tokenizer.json", &from_json, &fixture);
    let from_vocab = WordPiece::from_vocab(&files.vocab, true).unwrap();
    check("vocab.txt", &from_vocab, &fixture);
    let special = from_json.special();
    assert_eq!(
        (
            special.pad,
            special.unk,
            special.cls,
            special.sep,
            special.mask
        ),
        (0, 100, 101, 102, 103)
    );
    assert_eq!(from_json.vocab_size(), 30522);
    // tokenizer.json pads and truncates to 128 by itself: both are off.
    let long = "word ".repeat(300);
    assert_eq!(from_json.encode(&long).unwrap().len(), 302);
}

#[test]
fn a_corrupted_tokenizer_file_names_itself() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, "{\"model\": ").unwrap();
    let message = WordPiece::from_tokenizer_json(&path)
        .unwrap_err()
        .to_string();
    assert!(message.contains("tokenizer.json"), "{message}");
    let vocab = dir.join("vocab.txt");
    std::fs::write(&vocab, "[PAD]\n[UNK]\nhello\n").unwrap();
    let message = WordPiece::from_vocab(&vocab, true).unwrap_err().to_string();
    assert!(
        message.contains("vocab.txt") && message.contains("[SEP]"),
        "{message}"
    );
}
