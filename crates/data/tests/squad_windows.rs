//! SQuAD featurization on a paragraph small enough to work out by hand, with
//! the real MiniLM tokenizer: the windows, token ids, token types, character
//! offsets, max-context flags and answer positions below are derived in the
//! comments from `vocab.txt` (id = line number − 1) and `run_squad.py`'s
//! rules, not from the code under test.
//!
//! Needs the MiniLM files (fetched into the cache on first use).

use terse_data::{
    SquadExample, SquadFeatureConfig, SquadFeaturizer, WordPiece, minilm, parse_squad,
};

fn tokenizer() -> WordPiece {
    WordPiece::from_tokenizer_json(&minilm().unwrap().tokenizer).unwrap()
}

/// Context (44 characters, 46 bytes: ë and é take two bytes each):
///
/// ```text
/// Zoë's cat sat on the mat near the café door.
/// 0   4    9   14   20  25   30  34   39  43
/// ```
///
/// Uncased BERT lowercases, strips accents and splits punctuation, giving 13
/// context tokens (index: token (char offsets) id):
/// 0 zoe (0,3) 11199, 1 ' (3,4) 1005, 2 s (4,5) 1055, 3 cat (6,9) 4937,
/// 4 sat (10,13) 2938, 5 on (14,16) 2006, 6 the (17,20) 1996,
/// 7 mat (21,24) 13523, 8 near (25,29) 2379, 9 the (30,33) 1996,
/// 10 cafe (34,38) 7668, 11 door (39,43) 2341, 12 . (43,44) 1012.
///
/// Question "Where did the cat sit?": where 2073, did 2106, the 1996,
/// cat 4937, sit 4133, ? 1029 (6 tokens). The answer "the café door"
/// (characters 30..43) is context tokens 9..=11.
const SQUAD: &str = r#"{"data": [{"title": "T", "paragraphs": [{
    "context": "Zoë's cat sat on the mat near the café door.",
    "qas": [
      {"id": "a", "question": "Where did the cat sit?",
       "answers": [{"text": "the café door", "answer_start": 30}]},
      {"id": "b", "question": "Where did the cat sit?",
       "answers": [{"text": "mat", "answer_start": 21}]}]}]}]}"#;

const CONTEXT_IDS: [u32; 13] = [
    11199, 1005, 1055, 4937, 2938, 2006, 1996, 13523, 2379, 1996, 7668, 2341, 1012,
];
const CONTEXT_OFFSETS: [(usize, usize); 13] = [
    (0, 3),
    (3, 4),
    (4, 5),
    (6, 9),
    (10, 13),
    (14, 16),
    (17, 20),
    (21, 24),
    (25, 29),
    (30, 33),
    (34, 38),
    (39, 43),
    (43, 44),
];
const QUESTION_IDS: [u32; 6] = [2073, 2106, 1996, 4937, 4133, 1029];
const CLS: u32 = 101;
const SEP: u32 = 102;

/// The fixture's examples.
fn examples() -> Vec<SquadExample> {
    parse_squad(SQUAD, "fixture".as_ref()).unwrap()
}

/// Windows of 15 tokens at stride 3, questions cut to `max_query` tokens.
fn config(max_query: usize) -> SquadFeatureConfig {
    SquadFeatureConfig {
        max_seq: 15,
        doc_stride: 3,
        max_query,
    }
}

#[test]
fn windows_offsets_max_context_and_labels_by_hand() {
    let tokenizer = tokenizer();
    let examples = examples();
    // max_seq 15 with a 6-token question leaves 15 − 6 − 3 = 6 context
    // tokens per window; stride 3. Windows (context token ranges):
    // A 0..=5, B 3..=8, C 6..=11, then 9 + 6 > 13 so D 9..=12 (length 4)
    // reaches the end.
    let featurizer = SquadFeaturizer::new(&tokenizer, config(6)).unwrap();
    let features = featurizer.featurize(&examples).unwrap();
    assert_eq!(features.len(), 8, "4 windows for each of the 2 questions");
    let windows = [(0usize, 6usize), (3, 6), (6, 6), (9, 4)];
    // Max context, score 100·min(left, right) + length, first window on ties:
    // token 4: A min(4,1)=1 → 106, B min(1,4)=1 → 106: tie, A.
    // token 5: A 0 → 6, B min(2,3)=2 → 206: B. token 7: B 106 = C 106: B.
    // token 8: B 6, C 206: C. token 10: C min(4,1)=1 → 106, D min(1,2)=1 →
    // 104: C (the longer window). token 11: C 6, D min(2,1)=1 → 104: D.
    let max_context: [&[bool]; 4] = [
        &[true, true, true, true, true, false],   // A: tokens 0..=5
        &[false, false, true, true, true, false], // B: tokens 3..=8
        &[false, false, true, true, true, false], // C: tokens 6..=11
        &[false, false, true, true],              // D: tokens 9..=12
    ];
    // Context starts at position 6 + 2 = 8. Answer a (tokens 9..=11) is
    // only inside C (positions 8 + 3 = 11 ..= 13) and D (8 ..= 10); answer b
    // ("mat", token 7) is inside B (8 + 4 = 12) and C (8 + 1 = 9).
    let labels = [
        [(0, 0), (0, 0), (11, 13), (8, 10)],
        [(0, 0), (12, 12), (9, 9), (0, 0)],
    ];
    for (f, feature) in features.iter().enumerate() {
        let (q, w) = (f / 4, f % 4);
        let (start, len) = windows[w];
        assert_eq!(feature.example, q);
        let mut ids = vec![CLS];
        ids.extend(QUESTION_IDS);
        ids.push(SEP);
        ids.extend(&CONTEXT_IDS[start..start + len]);
        ids.push(SEP);
        assert_eq!(feature.input_ids, ids, "feature {f}");
        let mut types = vec![0; 8];
        types.resize(8 + len + 1, 1);
        assert_eq!(feature.token_type_ids, types, "feature {f}");
        let mut offsets = vec![None; 8];
        offsets.extend(CONTEXT_OFFSETS[start..start + len].iter().map(|&o| Some(o)));
        offsets.push(None);
        assert_eq!(feature.offsets, offsets, "feature {f}");
        let mut flags = vec![false; 8];
        flags.extend(max_context[w]);
        flags.push(false);
        assert_eq!(feature.max_context, flags, "feature {f}");
        assert_eq!(
            (feature.start_position, feature.end_position),
            labels[q][w],
            "feature {f}"
        );
    }
    // Each context token is max-context in exactly one window.
    let mut owners = [0; 13];
    for (w, &(start, len)) in windows.iter().enumerate() {
        for (i, _) in max_context[w].iter().enumerate().filter(|(_, m)| **m) {
            owners[start + i] += 1;
        }
        assert_eq!(max_context[w].len(), len);
    }
    assert_eq!(owners, [1; 13]);
    // The answer's positions in C map back through the offsets to its text.
    let c = &features[2];
    let (s, e) = (c.offsets[11].unwrap().0, c.offsets[13].unwrap().1);
    let text: String = examples[0].context.chars().skip(s).take(e - s).collect();
    assert_eq!(text, "the café door");
    // One example at a time gives the same features.
    assert_eq!(
        featurizer.featurize_example(1, &examples[1]).unwrap(),
        features[4..]
    );
}

#[test]
fn long_questions_are_cut_to_max_query() {
    let tokenizer = tokenizer();
    let examples = examples();
    // The question keeps where, did, the; windows of 15 − 3 − 3 = 9 tokens:
    // 0..=8, 3..=11, then 6..=12 (7 tokens) reaches the end.
    let featurizer = SquadFeaturizer::new(&tokenizer, config(3)).unwrap();
    let features = featurizer.featurize_example(0, &examples[0]).unwrap();
    assert_eq!(features.len(), 3);
    let mut first = vec![CLS, 2073, 2106, 1996, SEP];
    first.extend(&CONTEXT_IDS[..9]);
    first.push(SEP);
    assert_eq!(features[0].input_ids, first);
    assert_eq!(features[2].len(), 5 + 7 + 1);
    // Context starts at 3 + 2 = 5; tokens 9..=11 are inside windows 3..=11
    // (5 + 6 ..= 5 + 8) and 6..=12 (5 + 3 ..= 5 + 5), not 0..=8.
    let labels: Vec<_> = features
        .iter()
        .map(|f| (f.start_position, f.end_position))
        .collect();
    assert_eq!(labels, [(0, 0), (11, 13), (8, 10)]);
}

#[test]
fn an_invalid_config_is_refused_before_featurizing() {
    let tokenizer = tokenizer();
    let config = SquadFeatureConfig {
        doc_stride: 7,
        ..config(6)
    };
    let e = SquadFeaturizer::new(&tokenizer, config).unwrap_err();
    assert!(
        e.to_string().contains("doc_stride 7 must be in 1..=6"),
        "{e}"
    );
}
