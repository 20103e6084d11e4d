//! Pre-training corpora as documents of sentences. BERT's next-sentence task
//! needs both: sentences, to cut segments at sentence ends, and document
//! boundaries, so that an "actual next" segment really follows its first
//! segment and a "random next" one comes from elsewhere.
//!
//! Sources: Google's plain format (one sentence per line, a blank line
//! between documents) for a user's own corpus; the State of the Union
//! addresses (one document per address); SQuAD's Wikipedia paragraphs (one
//! document per article); IMDB reviews (one document per review). Running
//! text is cut into paragraphs at blank lines and paragraphs into sentences
//! by [`split_sentences`], so no sentence spans a paragraph break (a heading
//! without a final period stays its own sentence).

use std::path::Path;

use serde_json::Value;

use crate::DataError;
use crate::glue::{ReviewSource, read_movie_reviews};

/// A document: its sentences in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Document {
    /// Where it came from (file and article), for messages.
    pub origin: String,
    /// Its sentences, none empty.
    pub sentences: Vec<String>,
}

/// Abbreviations after which a period does not end a sentence (compared in
/// lower case, without the final period). "etc." ending a sentence is thus
/// missed — rarer, in these corpora, than "etc." inside one.
const ABBREVIATIONS: [&str; 29] = [
    "mr", "mrs", "ms", "dr", "st", "jr", "sr", "messrs", "gen", "gov", "sen", "rep", "hon", "rev",
    "prof", "capt", "col", "lt", "vs", "etc", "co", "inc", "ltd", "jan", "feb", "p", "pp", "vol",
    "fig",
];

/// Whether `word`, ending in a period, is an abbreviation or an initial
/// (so the period does not end the sentence); `next` is the word after it.
fn is_abbreviation(word: &str, next: &str) -> bool {
    let word = word
        .trim_start_matches(|c: char| !c.is_alphanumeric())
        .trim_end_matches('.');
    let lower = word.to_lowercase();
    if ABBREVIATIONS.contains(&lower.as_str()) {
        return true;
    }
    // "No. 5" is a number sign; "said no. Then" ends a sentence.
    if lower == "no" {
        return next.starts_with(|c: char| c.is_ascii_digit());
    }
    // A single capital initial ("John F. Kennedy"), but not a lower-case
    // letter ("plan b.").
    let mut chars = word.chars();
    if let (Some(c), None) = (chars.next(), chars.next()) {
        return c.is_uppercase();
    }
    // Dotted abbreviations of single letters, any case: "U.S", "e.g", "i.e".
    word.contains('.')
        && word
            .split('.')
            .all(|l| l.chars().count() == 1 && l.chars().all(char::is_alphabetic))
}

/// Cuts running text into sentences: after `.`, `!` or `?` (and any closing
/// quotes or brackets) followed by whitespace and a capital letter, a digit
/// or an opening quote or bracket — except after an abbreviation or a
/// single capital initial, and never inside a number like `3.5` (no
/// whitespace follows). Whitespace inside a sentence is collapsed to single
/// spaces; line breaks are whitespace like any other (see
/// [`split_paragraphs`] for blank lines).
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
        let abbreviation =
            core.ends_with('.') && is_abbreviation(core, words.get(i + 1).unwrap_or(&""));
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

/// The sentences of running text whose paragraphs are separated by blank
/// lines: each paragraph cut by [`split_sentences`] on its own.
pub fn split_paragraphs(text: &str) -> Vec<String> {
    let mut sentences = Vec::new();
    let mut paragraph = String::new();
    for line in text.lines().chain([""]) {
        if line.trim().is_empty() {
            sentences.extend(split_sentences(&paragraph));
            paragraph.clear();
        } else {
            paragraph.push_str(line);
            paragraph.push('\n');
        }
    }
    sentences
}

fn read(path: &Path) -> Result<String, DataError> {
    std::fs::read_to_string(path).map_err(|source| DataError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// The documents of a corpus named as configs and `terse-data shards` name
/// them: `sotu` (State of the Union addresses), `squad` (the SQuAD training
/// articles), `imdb` (the IMDB reviews), or a path to a file in Google's
/// one-sentence-per-line format. The datasets are fetched and verified
/// first.
pub fn read_corpus(name: &str) -> Result<Vec<Document>, DataError> {
    match name {
        "sotu" => read_sotu(&crate::dataset("sotu")?),
        "imdb" => read_imdb(&crate::dataset("movie-reviews")?.join("combined_movie_reviews.csv")),
        "squad" => read_squad_contexts(&crate::dataset("squad-v1.1")?.join("train-v1.1.json")),
        path => read_plain_corpus(Path::new(path)),
    }
}

/// The files [`read_corpus`] reads for `name`.
pub fn corpus_files(name: &str) -> Result<Vec<std::path::PathBuf>, DataError> {
    Ok(match name {
        "sotu" => super::files_with_extension(&crate::dataset("sotu")?, "txt")?,
        "imdb" => vec![crate::dataset("movie-reviews")?.join("combined_movie_reviews.csv")],
        "squad" => vec![crate::dataset("squad-v1.1")?.join("train-v1.1.json")],
        path => vec![Path::new(path).to_path_buf()],
    })
}

/// What the examples made from `corpus` depend on besides the settings: the
/// first 16 hex digits of a SHA-256 over the SHA-256s of its files and of
/// `extra` files (the vocabulary), and the shard format version. A cache
/// keyed by it cannot hand out examples of an edited corpus.
pub fn corpus_fingerprint(
    corpus: &[String],
    extra: &[std::path::PathBuf],
) -> Result<String, DataError> {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new();
    hash.update(super::shard::VERSION.to_le_bytes());
    let mut files = Vec::new();
    for name in corpus {
        files.extend(corpus_files(name)?);
    }
    files.extend_from_slice(extra);
    for path in files {
        hash.update(crate::fetch::sha256_file(&path)?);
    }
    let digest = hash.finalize();
    Ok(digest[..8].iter().map(|b| format!("{b:02x}")).collect())
}

/// Google's format: one sentence per line, a blank line between documents.
/// A file with no sentence is refused here, naming it, rather than making
/// no examples that fail far from the file.
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
    if documents.is_empty() {
        return Err(DataError::Format {
            path: path.to_path_buf(),
            detail: "holds no sentences (every line is blank)".into(),
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
        let sentences = split_paragraphs(&read(&path)?);
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

/// One document per IMDB review of the movie-reviews CSV
/// (`combined_movie_reviews.csv`, rows whose source is `imdb`; `<br />`
/// read as a space).
pub fn read_imdb(csv: &Path) -> Result<Vec<Document>, DataError> {
    let reviews = read_movie_reviews(csv, ReviewSource::Imdb)?;
    Ok(reviews
        .into_iter()
        .map(|review| Document {
            sentences: split_sentences(&review.text_a),
            origin: format!("{}: {}", csv.display(), review.guid),
        })
        .filter(|document| !document.sentences.is_empty())
        .collect())
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
    fn abbreviations_initials_and_quotes() {
        // Each expected split worked out by hand from the rules above.
        let cases: [(&str, &[&str]); 6] = [
            (
                "Dr. Smith met Mrs. Jones at St. Paul's. They talked.",
                &["Dr. Smith met Mrs. Jones at St. Paul's.", "They talked."],
            ),
            // "no." before a digit is "number"; before a word it ends.
            (
                "He said no. Then he left. See No. 5 for details.",
                &["He said no.", "Then he left.", "See No. 5 for details."],
            ),
            // A period inside a number, then after a closing bracket.
            (
                "It grew (by 3.5%). Next year 2.0 is due! 1999 was worse.",
                &[
                    "It grew (by 3.5%).",
                    "Next year 2.0 is due!",
                    "1999 was worse.",
                ],
            ),
            // Closing and opening curly quotes around the boundary.
            (
                "He wrote \u{201c}Stop.\u{201d} \u{201c}Why?\u{201d} she asked.",
                &[
                    "He wrote \u{201c}Stop.\u{201d}",
                    "\u{201c}Why?\u{201d} she asked.",
                ],
            ),
            // A lower-case single letter is not an initial; i.e. and etc. are
            // abbreviations even before a capital.
            (
                "Take plan b. Or not, i.e. Plan C, etc. Fine.",
                &["Take plan b.", "Or not, i.e. Plan C, etc. Fine."],
            ),
            (
                "U.S. Steel and the U.S.A. Today",
                &["U.S. Steel and the U.S.A. Today"],
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(split_sentences(text), expected, "{text}");
        }
    }

    #[test]
    fn paragraphs_end_sentences() {
        let text = "A Heading\n\nFirst one. Second\none.\n  \t\nThird para\n";
        assert_eq!(
            split_paragraphs(text),
            ["A Heading", "First one.", "Second one.", "Third para"]
        );
    }

    /// `name` holding `content` in a scratch directory, which is removed
    /// when the returned guard drops.
    fn scratch_file(name: &str, content: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        let scratch = tempfile::tempdir().unwrap();
        let path = scratch.path().join(name);
        std::fs::write(&path, content).unwrap();
        (scratch, path)
    }

    #[test]
    fn squad_articles_are_documents() {
        let (_scratch, path) = scratch_file(
            "squad.json",
            r#"{"data": [
                {"title": "T1", "paragraphs": [
                    {"context": "One. Two three.", "qas": []},
                    {"context": "Four.", "qas": []}]},
                {"title": "T2", "paragraphs": [{"context": "Five six.", "qas": []}]}
            ]}"#,
        );
        let docs = read_squad_contexts(&path).unwrap();
        let sentences: Vec<&[String]> = docs.iter().map(|d| d.sentences.as_slice()).collect();
        assert_eq!(
            sentences,
            [&["One.", "Two three.", "Four."][..], &["Five six."]]
        );
        assert!(docs[1].origin.ends_with(": T2"), "{}", docs[1].origin);

        std::fs::write(&path, r#"{"data": [{"paragraphs": [{"context": 3}]}]}"#).unwrap();
        let e = read_squad_contexts(&path).unwrap_err().to_string();
        assert!(
            e.contains("squad.json: data[0].paragraphs[0].context: missing"),
            "{e}"
        );
        std::fs::write(&path, "{\"data\": [").unwrap();
        let e = read_squad_contexts(&path).unwrap_err().to_string();
        assert!(e.contains("squad.json: line 1, column 10"), "{e}");
    }

    #[test]
    fn imdb_reviews_are_documents_with_breaks_as_spaces() {
        let (_scratch, path) = scratch_file(
            "reviews.csv",
            "text,label,source\n\
             \"Great film.<br /><br />Loved it, \"\"really\"\".\",1,imdb\n\
             A rotten tomato.,0,rotten_tomatoes\n\
             \"Dull. Very\nslow!\",0,imdb\n",
        );
        let docs = read_imdb(&path).unwrap();
        let sentences: Vec<&[String]> = docs.iter().map(|d| d.sentences.as_slice()).collect();
        assert_eq!(
            sentences,
            [
                &["Great film.", "Loved it, \"really\"."][..],
                &["Dull.", "Very slow!"]
            ]
        );
    }

    #[test]
    fn plain_corpus_keeps_documents() {
        let (_scratch, path) = scratch_file(
            "plain.txt",
            "A one.\nA two.\n\n\n B one. \n\nC one.\nC two.\nC three.",
        );
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

    #[test]
    fn a_plain_corpus_without_sentences_is_refused_naming_it() {
        for content in ["", "\n  \n\t\n"] {
            let (_scratch, path) = scratch_file("plain.txt", content);
            let e = read_plain_corpus(&path).unwrap_err().to_string();
            assert_eq!(
                e,
                format!(
                    "{}: holds no sentences (every line is blank)",
                    path.display()
                ),
                "{content:?}"
            );
        }
    }

    #[test]
    fn the_fingerprint_follows_the_content_not_the_name() {
        let (_scratch, path) = scratch_file("corpus.txt", "A one.\nA two.\n");
        let (_vocab_dir, vocab) = scratch_file("vocab.txt", "[PAD]\n[UNK]\n");
        let corpus = [path.display().to_string()];
        let first = corpus_fingerprint(&corpus, std::slice::from_ref(&vocab)).unwrap();
        assert_eq!(first.len(), 16);
        assert_eq!(
            corpus_fingerprint(&corpus, std::slice::from_ref(&vocab)).unwrap(),
            first
        );
        std::fs::write(&path, "A one.\nA three.\n").unwrap();
        let edited = corpus_fingerprint(&corpus, std::slice::from_ref(&vocab)).unwrap();
        assert_ne!(edited, first, "an edited corpus keeps its fingerprint");
        std::fs::write(&vocab, "[PAD]\n").unwrap();
        let other_vocab = corpus_fingerprint(&corpus, std::slice::from_ref(&vocab)).unwrap();
        assert_ne!(
            other_vocab, edited,
            "another vocabulary keeps the fingerprint"
        );
    }
}
