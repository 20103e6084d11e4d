//! Pre-training corpora as documents of sentences. BERT's next-sentence task
//! needs both: sentences, to cut segments at sentence ends, and document
//! boundaries, so that an "actual next" segment really follows its first
//! segment and a "random next" one comes from elsewhere.
//!
//! Sources: Google's plain format (one sentence per line, a blank line
//! between documents) for a user's own corpus; the State of the Union
//! addresses (one document per address); SQuAD's Wikipedia paragraphs (one
//! document per article). Running text is cut into sentences by
//! [`split_sentences`].

use std::path::Path;

use serde_json::Value;

use crate::DataError;

/// A document: its sentences in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Document {
    /// Where it came from (file and article), for messages.
    pub origin: String,
    /// Its sentences, none empty.
    pub sentences: Vec<String>,
}

/// Abbreviations after which a period does not end a sentence (compared in
/// lower case, without the final period).
const ABBREVIATIONS: [&str; 28] = [
    "mr", "mrs", "ms", "dr", "st", "jr", "sr", "messrs", "gen", "gov", "sen", "rep", "hon", "rev",
    "prof", "capt", "col", "lt", "vs", "etc", "no", "co", "inc", "ltd", "jan", "feb", "u.s", "e.g",
];

/// Whether the word ending at a period is an abbreviation or an initial.
fn is_abbreviation(word: &str) -> bool {
    let word = word.trim_start_matches(|c: char| !c.is_alphanumeric());
    let lower = word.to_lowercase();
    let lower = lower.trim_end_matches('.');
    if ABBREVIATIONS.contains(&lower) || lower == "i.e" {
        return true;
    }
    // Single initials ("John F. Kennedy") and dotted acronyms ("U.S.A.").
    let letters: Vec<&str> = lower.split('.').collect();
    letters
        .iter()
        .all(|l| l.chars().count() == 1 && l.chars().all(char::is_alphabetic))
}

/// Cuts running text into sentences: after `.`, `!` or `?` (and any closing
/// quotes or brackets) followed by whitespace and a capital letter, a digit
/// or an opening quote — except after an abbreviation or an initial, and
/// never inside a number like `3.5` (no whitespace follows). Whitespace
/// inside a sentence is collapsed to single spaces.
pub fn split_sentences(text: &str) -> Vec<String> {
    let words: Vec<&str> = text.split_whitespace().collect();
    let mut sentences = Vec::new();
    let mut current: Vec<&str> = Vec::new();
    for (i, word) in words.iter().enumerate() {
        current.push(word);
        let core = word.trim_end_matches(['"', '\'', ')', ']', '”', '’']);
        let ends = core.ends_with(['.', '!', '?']);
        let next_starts = words.get(i + 1).is_some_and(|next| {
            next.chars()
                .next()
                .is_some_and(|c| c.is_uppercase() || c.is_ascii_digit() || "\"'“‘([".contains(c))
        });
        let abbreviation = core.ends_with('.') && is_abbreviation(core);
        if ends && next_starts && !abbreviation {
            sentences.push(current.join(" "));
            current.clear();
        }
    }
    if !current.is_empty() {
        sentences.push(current.join(" "));
    }
    sentences
}

fn read(path: &Path) -> Result<String, DataError> {
    std::fs::read_to_string(path).map_err(|source| DataError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Google's format: one sentence per line, a blank line between documents.
pub fn read_plain_corpus(path: &Path) -> Result<Vec<Document>, DataError> {
    let text = read(path)?;
    let mut documents = Vec::new();
    let mut sentences = Vec::new();
    let mut start = 1;
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            if !sentences.is_empty() {
                documents.push(Document {
                    origin: format!("{}:{start}", path.display()),
                    sentences: std::mem::take(&mut sentences),
                });
            }
            start = n + 2;
        } else {
            sentences.push(line.to_string());
        }
    }
    if !sentences.is_empty() {
        documents.push(Document {
            origin: format!("{}:{start}", path.display()),
            sentences,
        });
    }
    Ok(documents)
}

/// One document per State of the Union address (`*.txt` of `dir`, in name
/// order, i.e. chronologically).
pub fn read_sotu(dir: &Path) -> Result<Vec<Document>, DataError> {
    let files = super::files_with_extension(dir, "txt")?;
    let mut documents = Vec::new();
    for path in files {
        let sentences = split_sentences(&read(&path)?);
        if !sentences.is_empty() {
            documents.push(Document {
                origin: path.display().to_string(),
                sentences,
            });
        }
    }
    Ok(documents)
}

/// One document per SQuAD article: its paragraphs' sentences in order.
pub fn read_squad_contexts(path: &Path) -> Result<Vec<Document>, DataError> {
    let json: Value = serde_json::from_str(&read(path)?).map_err(|e| DataError::Format {
        path: path.to_path_buf(),
        detail: format!("line {}, column {}: {e}", e.line(), e.column()),
    })?;
    let bad = |at: String| DataError::Format {
        path: path.to_path_buf(),
        detail: format!("{at}: missing or of the wrong type"),
    };
    let articles = json["data"].as_array().ok_or_else(|| bad("data".into()))?;
    let mut documents = Vec::new();
    for (a, article) in articles.iter().enumerate() {
        let paragraphs = article["paragraphs"]
            .as_array()
            .ok_or_else(|| bad(format!("data[{a}].paragraphs")))?;
        let mut sentences = Vec::new();
        for (p, paragraph) in paragraphs.iter().enumerate() {
            let context = paragraph["context"]
                .as_str()
                .ok_or_else(|| bad(format!("data[{a}].paragraphs[{p}].context")))?;
            sentences.extend(split_sentences(context));
        }
        if !sentences.is_empty() {
            let title = article["title"].as_str().unwrap_or("?");
            documents.push(Document {
                origin: format!("{}: {title}", path.display()),
                sentences,
            });
        }
    }
    Ok(documents)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentences_end_where_a_reader_would_end_them() {
        let text = "Mr. Speaker, the U.S. economy grew 3.5 percent. It was \
                    \"a good year.\" Did it last? Yes! John F. Kennedy spoke in 1961. \
                    (See p. 4.) Then came 1962.";
        assert_eq!(
            split_sentences(text),
            [
                "Mr. Speaker, the U.S. economy grew 3.5 percent.",
                "It was \"a good year.\"",
                "Did it last?",
                "Yes!",
                "John F. Kennedy spoke in 1961.",
                "(See p. 4.)",
                "Then came 1962.",
            ]
        );
        // A lower-case word after a period does not start a sentence.
        assert_eq!(
            split_sentences("e.g. this one. and  that"),
            ["e.g. this one. and that"]
        );
        assert!(split_sentences(" \n\t").is_empty());
    }

    #[test]
    fn plain_corpus_keeps_documents() {
        let path = std::env::temp_dir().join(format!("terse-plain-{}.txt", std::process::id()));
        std::fs::write(
            &path,
            "A one.\nA two.\n\n\n B one. \n\nC one.\nC two.\nC three.",
        )
        .unwrap();
        let docs = read_plain_corpus(&path).unwrap();
        let sentences: Vec<Vec<&str>> = docs
            .iter()
            .map(|d| d.sentences.iter().map(String::as_str).collect())
            .collect();
        assert_eq!(
            sentences,
            [
                vec!["A one.", "A two."],
                vec!["B one."],
                vec!["C one.", "C two.", "C three."]
            ]
        );
        assert!(docs[2].origin.ends_with(":7"), "{}", docs[2].origin);
    }
}
