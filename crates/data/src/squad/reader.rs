//! The official SQuAD v1.1 JSON (`{"data": [{"title", "paragraphs": [{"context",
//! "qas": [{"id", "question", "answers": [{"text", "answer_start"}]}]}]}]}`)
//! read into one [`SquadExample`] per question.
//!
//! The file is walked as a `serde_json::Value` rather than derived structs so
//! that every error names the record it is about
//! (`data[3].paragraphs[0].qas[2].answers[0].answer_start`): a derived
//! deserializer only knows a line and column. Every answer is checked against
//! its context here, once, so that featurization and post-processing can
//! index the context without further checks.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use serde_json::Value;

use crate::DataError;

/// One gold answer of a question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SquadAnswer {
    /// The answer as it appears in the context.
    pub text: String,
    /// Where it starts in the context, in characters (Unicode scalar values,
    /// as Python indexes strings), not bytes.
    pub start: usize,
}

impl SquadAnswer {
    /// One past its last character in the context (a character offset).
    pub fn end(&self) -> usize {
        self.start + self.text.chars().count()
    }
}

/// One question on one paragraph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SquadExample {
    /// The question's id (the key of `predictions.json`).
    pub id: String,
    /// The title of the article the paragraph is from.
    pub title: Arc<str>,
    /// The question.
    pub question: String,
    /// The paragraph, shared by all its questions.
    pub context: Arc<str>,
    /// The gold answers: exactly one per training question, usually three
    /// (often equal) per dev question. Never empty; every one is checked to
    /// be the context's text at its start.
    pub answers: Vec<SquadAnswer>,
}

/// Reads a SQuAD v1.1 file (`train-v1.1.json` or `dev-v1.1.json`).
pub fn read_squad(path: &Path) -> Result<Vec<SquadExample>, DataError> {
    let text = std::fs::read_to_string(path).map_err(|source| DataError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse_squad(&text, path)
}

/// Parses SQuAD v1.1 JSON; `path` only names the source in errors.
///
/// Rejects, naming the record: malformed JSON, a missing or mistyped field,
/// a question without answers, an empty answer, an `answer_start` beyond the
/// context or where the context does not read the answer's text, a question
/// marked unanswerable (SQuAD v2's `is_impossible`, which v1.1 featurization
/// cannot label), and a question id used twice (ids key `predictions.json`).
pub fn parse_squad(json: &str, path: &Path) -> Result<Vec<SquadExample>, DataError> {
    let err = |at: &str, detail: String| DataError::Format {
        path: path.to_path_buf(),
        detail: format!("{at}: {detail}"),
    };
    let root: Value = serde_json::from_str(json).map_err(|e| DataError::Format {
        path: path.to_path_buf(),
        detail: format!("not JSON: {e}"),
    })?;
    let walk = Walk { path };
    let mut examples = Vec::new();
    let mut ids = HashSet::new();
    for (a, article) in walk.array(&root, "data", "")?.iter().enumerate() {
        let at_article = format!("data[{a}]");
        let title: Arc<str> = walk.string(article, "title", &at_article)?.into();
        for (p, paragraph) in walk
            .array(article, "paragraphs", &at_article)?
            .iter()
            .enumerate()
        {
            let at_paragraph = format!("{at_article}.paragraphs[{p}]");
            let context: Arc<str> = walk.string(paragraph, "context", &at_paragraph)?.into();
            // Byte position of every character, plus the end: answer starts
            // are character offsets and Rust slices by bytes.
            let bytes: Vec<usize> = context
                .char_indices()
                .map(|(b, _)| b)
                .chain([context.len()])
                .collect();
            let chars = bytes.len() - 1;
            for (q, qa) in walk
                .array(paragraph, "qas", &at_paragraph)?
                .iter()
                .enumerate()
            {
                let at_qa = format!("{at_paragraph}.qas[{q}]");
                let id = walk.string(qa, "id", &at_qa)?.to_string();
                let question = walk.string(qa, "question", &at_qa)?.to_string();
                if qa.get("is_impossible").and_then(Value::as_bool) == Some(true) {
                    return Err(err(
                        &at_qa,
                        "is_impossible is true (a SQuAD v2 question; v1.1 has none)".into(),
                    ));
                }
                let raw_answers = walk.array(qa, "answers", &at_qa)?;
                if raw_answers.is_empty() {
                    return Err(err(&format!("{at_qa}.answers"), "no answers".into()));
                }
                let mut answers = Vec::with_capacity(raw_answers.len());
                for (n, answer) in raw_answers.iter().enumerate() {
                    let at_answer = format!("{at_qa}.answers[{n}]");
                    let text = walk.string(answer, "text", &at_answer)?.to_string();
                    let at_start = format!("{at_answer}.answer_start");
                    let start = answer
                        .get("answer_start")
                        .ok_or_else(|| err(&at_start, "missing".into()))?;
                    let start = start.as_u64().ok_or_else(|| {
                        err(&at_start, format!("{start} is not a non-negative integer"))
                    })? as usize;
                    if text.is_empty() {
                        return Err(err(&format!("{at_answer}.text"), "empty".into()));
                    }
                    let answer = SquadAnswer { text, start };
                    let end = answer.end();
                    if end > chars {
                        return Err(err(
                            &at_start,
                            format!(
                                "{start} + {} characters of {:?} runs past the context's {chars} characters",
                                end - start,
                                answer.text
                            ),
                        ));
                    }
                    let found = &context[bytes[start]..bytes[end]];
                    if found != answer.text {
                        return Err(err(
                            &at_start,
                            format!(
                                "the context reads {found:?} at {start}, not the answer {:?}",
                                answer.text
                            ),
                        ));
                    }
                    answers.push(answer);
                }
                if !ids.insert(id.clone()) {
                    return Err(err(&format!("{at_qa}.id"), format!("{id:?} is used twice")));
                }
                examples.push(SquadExample {
                    id,
                    title: title.clone(),
                    question,
                    context: context.clone(),
                    answers,
                });
            }
        }
    }
    Ok(examples)
}

/// Typed field access whose errors name the record.
struct Walk<'p> {
    path: &'p Path,
}

impl Walk<'_> {
    fn field<'v>(&self, value: &'v Value, key: &str, at: &str) -> Result<&'v Value, DataError> {
        let at_key = if at.is_empty() {
            key.to_string()
        } else {
            format!("{at}.{key}")
        };
        let object = value.as_object().ok_or_else(|| DataError::Format {
            path: self.path.to_path_buf(),
            detail: format!(
                "{}: expected an object, found {}",
                if at.is_empty() { "top level" } else { at },
                kind(value)
            ),
        })?;
        object.get(key).ok_or_else(|| DataError::Format {
            path: self.path.to_path_buf(),
            detail: format!("{at_key}: missing"),
        })
    }

    fn typed<'v, T>(
        &self,
        value: &'v Value,
        key: &str,
        at: &str,
        want: &str,
        get: impl Fn(&'v Value) -> Option<T>,
    ) -> Result<T, DataError> {
        let v = self.field(value, key, at)?;
        get(v).ok_or_else(|| DataError::Format {
            path: self.path.to_path_buf(),
            detail: format!(
                "{}{key}: expected {want}, found {}",
                if at.is_empty() {
                    String::new()
                } else {
                    format!("{at}.")
                },
                kind(v)
            ),
        })
    }

    fn array<'v>(&self, value: &'v Value, key: &str, at: &str) -> Result<&'v [Value], DataError> {
        self.typed(value, key, at, "an array", |v| {
            v.as_array().map(Vec::as_slice)
        })
    }

    fn string<'v>(&self, value: &'v Value, key: &str, at: &str) -> Result<&'v str, DataError> {
        self.typed(value, key, at, "a string", Value::as_str)
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<Vec<SquadExample>, DataError> {
        parse_squad(json, Path::new("fixture.json"))
    }

    fn error(json: &str) -> String {
        match parse(json) {
            Ok(examples) => panic!("accepted: {examples:?}"),
            Err(e) => e.to_string(),
        }
    }

    /// Two articles; the second's context has multi-byte characters before
    /// its answer, so a byte offset would land elsewhere.
    const GOOD: &str = r#"{"version": "1.1", "data": [
        {"title": "A", "paragraphs": [{"context": "Paris is in France.", "qas": [
            {"id": "q1", "question": "Where is Paris?", "answers": [
                {"text": "France", "answer_start": 12},
                {"text": "in France", "answer_start": 9}]}]}]},
        {"title": "B", "paragraphs": [{"context": "Zoë’s café opened in 1990.", "qas": [
            {"id": "q2", "question": "When?", "answers": [{"text": "1990", "answer_start": 21}]},
            {"id": "q3", "question": "Whose?", "answers": [{"text": "Zoë", "answer_start": 0}]}]}]}]}"#;

    #[test]
    fn reads_questions_with_character_offsets() {
        let examples = parse(GOOD).unwrap();
        assert_eq!(examples.len(), 3);
        assert_eq!(examples[0].id, "q1");
        assert_eq!(&*examples[0].title, "A");
        assert_eq!(examples[0].question, "Where is Paris?");
        assert_eq!(&*examples[0].context, "Paris is in France.");
        assert_eq!(
            examples[0].answers,
            vec![
                SquadAnswer {
                    text: "France".into(),
                    start: 12
                },
                SquadAnswer {
                    text: "in France".into(),
                    start: 9
                }
            ]
        );
        // "Zoë’s café opened in " is 21 characters but 25 bytes (ë, ’, é).
        assert_eq!(examples[1].answers[0].start, 21);
        assert_eq!(examples[1].answers[0].end(), 25);
        assert_eq!(&*examples[2].title, "B");
        assert!(Arc::ptr_eq(&examples[1].context, &examples[2].context));
    }

    #[test]
    fn malformed_json_names_the_file() {
        let e = error(r#"{"data": ["#);
        assert!(e.starts_with("fixture.json: not JSON: "), "{e}");
    }

    #[test]
    fn missing_and_mistyped_fields_name_the_record() {
        assert_eq!(
            error(r#"{"version": "1.1"}"#),
            "fixture.json: data: missing"
        );
        assert_eq!(
            error(r#"{"data": {}}"#),
            "fixture.json: data: expected an array, found an object"
        );
        assert_eq!(
            error(r#"{"data": [{"title": "A", "paragraphs": [{"qas": []}]}]}"#),
            "fixture.json: data[0].paragraphs[0].context: missing"
        );
        let no_id = GOOD.replace(r#""id": "q3", "#, "");
        assert_eq!(
            error(&no_id),
            "fixture.json: data[1].paragraphs[0].qas[1].id: missing"
        );
        let numeric_question = GOOD.replace(r#""question": "When?""#, r#""question": 7"#);
        assert_eq!(
            error(&numeric_question),
            "fixture.json: data[1].paragraphs[0].qas[0].question: expected a string, found a number"
        );
        let no_start = GOOD.replace(r#", "answer_start": 9"#, "");
        assert_eq!(
            error(&no_start),
            "fixture.json: data[0].paragraphs[0].qas[0].answers[1].answer_start: missing"
        );
        let negative = GOOD.replace(r#""answer_start": 9"#, r#""answer_start": -1"#);
        assert_eq!(
            error(&negative),
            "fixture.json: data[0].paragraphs[0].qas[0].answers[1].answer_start: -1 is not a non-negative integer"
        );
        assert_eq!(
            error(r#"{"data": [7]}"#),
            "fixture.json: data[0]: expected an object, found a number"
        );
    }

    #[test]
    fn answers_that_do_not_match_the_context_are_refused() {
        // One character off: the context reads "990." there.
        let shifted = GOOD.replace(r#""answer_start": 21"#, r#""answer_start": 22"#);
        assert_eq!(
            error(&shifted),
            "fixture.json: data[1].paragraphs[0].qas[0].answers[0].answer_start: \
             the context reads \"990.\" at 22, not the answer \"1990\""
        );
        // 26 characters in the context; 23 + 4 runs past it.
        let beyond = GOOD.replace(r#""answer_start": 21"#, r#""answer_start": 23"#);
        assert_eq!(
            error(&beyond),
            "fixture.json: data[1].paragraphs[0].qas[0].answers[0].answer_start: \
             23 + 4 characters of \"1990\" runs past the context's 26 characters"
        );
        // A byte offset (25) instead of the character offset (21).
        let bytes = GOOD.replace(r#""answer_start": 21"#, r#""answer_start": 25"#);
        assert!(error(&bytes).contains("runs past"), "{}", error(&bytes));
        let empty = GOOD.replace(r#""text": "Zoë""#, r#""text": """#);
        assert_eq!(
            error(&empty),
            "fixture.json: data[1].paragraphs[0].qas[1].answers[0].text: empty"
        );
    }

    #[test]
    fn questions_without_answers_unanswerable_or_duplicated_are_refused() {
        let none = GOOD.replace(
            r#""answers": [{"text": "1990", "answer_start": 21}]"#,
            r#""answers": []"#,
        );
        assert_eq!(
            error(&none),
            "fixture.json: data[1].paragraphs[0].qas[0].answers: no answers"
        );
        let v2 = GOOD.replace(r#""id": "q2","#, r#""id": "q2", "is_impossible": true,"#);
        assert_eq!(
            error(&v2),
            "fixture.json: data[1].paragraphs[0].qas[0]: is_impossible is true (a SQuAD v2 question; v1.1 has none)"
        );
        let twice = GOOD.replace(r#""id": "q3""#, r#""id": "q1""#);
        assert_eq!(
            error(&twice),
            "fixture.json: data[1].paragraphs[0].qas[1].id: \"q1\" is used twice"
        );
    }

    #[test]
    fn a_missing_file_is_an_io_error() {
        let e = read_squad(Path::new("/nonexistent/dev-v1.1.json")).unwrap_err();
        assert!(matches!(e, DataError::Io { .. }), "{e:?}");
    }
}
