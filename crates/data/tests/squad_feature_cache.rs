//! SQuAD's features kept in the cache between runs: what a later run reads
//! back is what featurizing gives (every field of every window, on all of
//! SQuAD's dev questions, compared with `featurize` itself), under a name
//! that changes with the file's content, the tokenizer and the window
//! settings; a damaged file is featurized again, a cache that cannot be
//! written costs only the time, and runs started at once featurize once.
//!
//! Needs the SQuAD files and MiniLM's tokenizer (fetched into the cache on
//! first use).

use std::path::{Path, PathBuf};

use terse_data::FeatureSource;
use terse_data::squad::cached_features;
use terse_data::{
    SquadExample, SquadFeatureConfig, SquadFeaturizer, WordPiece, dataset, minilm_tokenizer,
    parse_squad, read_squad,
};

fn tokenizer() -> WordPiece {
    WordPiece::from_tokenizer_json(&minilm_tokenizer().unwrap()).unwrap()
}

/// BERT's windows (384 / 128 / 64).
fn featurizer(tokenizer: &WordPiece) -> SquadFeaturizer<'_> {
    SquadFeaturizer::new(tokenizer, SquadFeatureConfig::default()).unwrap()
}

const SMALL: &str = r#"{"data": [{"title": "T", "paragraphs": [{
    "context": "Zoë's cat sat on the mat near the café door.",
    "qas": [{"id": "a", "question": "Where did the cat sit?",
             "answers": [{"text": "the café door", "answer_start": 30}]}]}]}]}"#;

/// A small SQuAD file at `path`.
fn small_file(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
}

/// A directory holding the small SQuAD file, the file and its examples.
fn small() -> (tempfile::TempDir, PathBuf, Vec<SquadExample>) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("small.json");
    small_file(&file, SMALL);
    let examples = parse_squad(SMALL, &file).unwrap();
    (dir, file, examples)
}

#[test]
fn the_dev_set_read_back_is_what_featurizing_gives() {
    let file = dataset("squad-v1.1").unwrap().join("dev-v1.1.json");
    let examples = read_squad(&file).unwrap();
    let tokenizer = tokenizer();
    let featurizer = featurizer(&tokenizer);
    let cache = tempfile::tempdir().unwrap();

    let (made, path, source) =
        cached_features(&featurizer, &file, &examples, cache.path()).unwrap();
    assert_eq!(source, FeatureSource::Featurized { kept: true });
    let name = path.file_name().unwrap().to_string_lossy().to_string();
    assert!(
        name.starts_with("squad-dev-v1_1-seq384-stride128-query64-")
            && name.ends_with(".safetensors"),
        "{name}"
    );
    let (read, again, source) =
        cached_features(&featurizer, &file, &examples, cache.path()).unwrap();
    assert_eq!((again, source), (path, FeatureSource::Cache));
    let direct = featurizer.featurize(&examples).unwrap();
    // Windows outside their question's context and answers beyond a
    // window are in the set: both kinds of offsets and labels round-trip.
    assert!(direct.iter().any(|f| f.start_position == 0));
    assert!(direct.iter().any(|f| f.offsets.iter().any(Option::is_none)));
    assert_eq!(
        direct.len(),
        10_833,
        "BERT's settings give 10,833 dev windows"
    );
    assert!(
        made == direct,
        "featurized through the cache differs from featurize"
    );
    assert!(
        read == direct,
        "read back from the cache differs from featurize"
    );
}

#[test]
fn the_name_changes_with_the_file_the_tokenizer_and_the_windows() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let (a, b) = (dir.path().join("a.json"), dir.path().join("b.json"));
    small_file(&a, SMALL);
    small_file(&b, &SMALL.replace("Where did", "Where has"));
    let examples = parse_squad(SMALL, &a).unwrap();
    let tokenizer = tokenizer();
    let name = |featurizer: &SquadFeaturizer, file: &Path, examples: &[SquadExample]| {
        let (_, path, _) = cached_features(featurizer, file, examples, &cache).unwrap();
        path
    };
    let base = name(&featurizer(&tokenizer), &a, &examples);
    assert_eq!(name(&featurizer(&tokenizer), &a, &examples), base);
    assert_ne!(
        name(&featurizer(&tokenizer), &b, &examples),
        base,
        "another file's content"
    );
    assert_ne!(
        name(&featurizer(&tokenizer), &a, &[]),
        base,
        "part of a file's questions"
    );
    let narrower = SquadFeatureConfig {
        max_seq: 256,
        ..SquadFeatureConfig::default()
    };
    let other_windows = SquadFeaturizer::new(&tokenizer, narrower).unwrap();
    assert_ne!(name(&other_windows, &a, &examples), base, "other windows");
    // One vocabulary file, three tokenizers: lowercasing or not encodes
    // otherwise, and so does a vocabulary with one more word.
    let words = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nwhere\ndid\nthe\ncat\nsit\n?\n";
    let vocab = dir.path().join("vocab.txt");
    std::fs::write(&vocab, words).unwrap();
    let uncased = WordPiece::from_vocab(&vocab, true).unwrap();
    let cased = WordPiece::from_vocab(&vocab, false).unwrap();
    let uncased_name = name(&featurizer(&uncased), &a, &examples);
    assert_ne!(
        name(&featurizer(&cased), &a, &examples),
        uncased_name,
        "not lowercasing"
    );
    std::fs::write(&vocab, format!("{words}mat\n")).unwrap();
    let larger = WordPiece::from_vocab(&vocab, true).unwrap();
    assert_ne!(
        name(&featurizer(&larger), &a, &examples),
        uncased_name,
        "one more word"
    );
    assert_eq!(
        tokenizer.fingerprint().unwrap(),
        self::tokenizer().fingerprint().unwrap(),
        "one tokenizer loaded twice"
    );
}

#[test]
fn a_damaged_file_is_featurized_again() {
    let (dir, file, examples) = small();
    let tokenizer = tokenizer();
    let featurizer = featurizer(&tokenizer);
    let cache = dir.path().join("cache");
    let (made, path, _) = cached_features(&featurizer, &file, &examples, &cache).unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    let (again, _, source) = cached_features(&featurizer, &file, &examples, &cache).unwrap();
    assert_eq!(source, FeatureSource::Featurized { kept: true });
    assert!(again == made);
    let (_, _, source) = cached_features(&featurizer, &file, &examples, &cache).unwrap();
    assert_eq!(
        source,
        FeatureSource::Cache,
        "the file written again is read"
    );
}

#[test]
fn a_cache_that_cannot_be_written_costs_only_the_time() {
    let (dir, file, examples) = small();
    let tokenizer = tokenizer();
    let featurizer = featurizer(&tokenizer);
    // A file where the cache's directory would be: nothing can be created
    // under it (even by root, unlike a read-only directory).
    let cache = dir.path().join("not-a-directory");
    std::fs::write(&cache, "").unwrap();
    let (features, _, source) = cached_features(&featurizer, &file, &examples, &cache).unwrap();
    assert_eq!(source, FeatureSource::Featurized { kept: false });
    assert!(features == featurizer.featurize(&examples).unwrap());
}

#[test]
fn runs_started_at_once_featurize_once() {
    let (dir, file, examples) = small();
    let tokenizer = tokenizer();
    let featurizer = featurizer(&tokenizer);
    let cache = dir.path().join("cache");
    let sources: Vec<FeatureSource> = std::thread::scope(|scope| {
        let runs: Vec<_> = (0..4)
            .map(|_| scope.spawn(|| cached_features(&featurizer, &file, &examples, &cache)))
            .collect();
        runs.into_iter()
            .map(|run| run.join().unwrap().unwrap().2)
            .collect()
    });
    let featurized = sources
        .iter()
        .filter(|s| matches!(s, FeatureSource::Featurized { .. }))
        .count();
    assert_eq!(featurized, 1, "{sources:?}");
}
