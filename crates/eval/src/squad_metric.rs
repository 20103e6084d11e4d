//! SQuAD v1.1 scoring, exactly as the official `evaluate-v1.1.py`: answers
//! are normalized (lower case, ASCII punctuation removed, the articles
//! a/an/the removed as whole words, whitespace collapsed), exact match and
//! token F1 take the best over a question's ground truths, and a question
//! without a prediction scores 0 but still counts in the total.

use std::collections::HashMap;
use std::path::Path;

use serde_json::Value;

use crate::EvalError;

/// Python's `string.punctuation`, which the official script removes.
const PUNCTUATION: &str = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";

/// Python's `str.split()` whitespace: Unicode White_Space plus the ASCII
/// information separators U+001C..U+001F, which Python also splits on.
fn is_python_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's `\w` for `str` patterns: Unicode alphanumerics and `_`.
fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The official `normalize_answer`: lower → remove punctuation → remove
/// articles (`re.sub(r'\b(a|an|the)\b', ' ', …)`) → collapse whitespace.
pub fn normalize_answer(text: &str) -> String {
    let lowered = text.to_lowercase();
    let no_punct: String = lowered
        .chars()
        .filter(|c| !PUNCTUATION.contains(*c))
        .collect();
    // `\b(a|an|the)\b` matches exactly the maximal runs of word characters
    // that are one of the three articles.
    let mut no_articles = String::with_capacity(no_punct.len());
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        if matches!(word.as_str(), "a" | "an" | "the") {
            out.push(' ');
        } else {
            out.push_str(word);
        }
        word.clear();
    };
    for c in no_punct.chars() {
        if is_word(c) {
            word.push(c);
        } else {
            flush(&mut word, &mut no_articles);
            no_articles.push(c);
        }
    }
    flush(&mut word, &mut no_articles);
    tokens(&no_articles).join(" ")
}

fn tokens(text: &str) -> Vec<&str> {
    text.split(is_python_space)
        .filter(|t| !t.is_empty())
        .collect()
}

/// 1 when the normalized texts are equal, else 0.
pub fn exact_match(prediction: &str, ground_truth: &str) -> f64 {
    f64::from(u8::from(
        normalize_answer(prediction) == normalize_answer(ground_truth),
    ))
}

/// Token F1 of the normalized texts (0 when they share no token, which
/// includes an empty prediction).
pub fn f1(prediction: &str, ground_truth: &str) -> f64 {
    let prediction = normalize_answer(prediction);
    let ground_truth = normalize_answer(ground_truth);
    let predicted = tokens(&prediction);
    let gold = tokens(&ground_truth);
    let mut counts: HashMap<&str, i64> = HashMap::new();
    for t in &gold {
        *counts.entry(t).or_default() += 1;
    }
    let mut same = 0usize;
    for t in &predicted {
        if let Some(n) = counts.get_mut(t)
            && *n > 0
        {
            *n -= 1;
            same += 1;
        }
    }
    if same == 0 {
        return 0.0;
    }
    let precision = same as f64 / predicted.len() as f64;
    let recall = same as f64 / gold.len() as f64;
    2.0 * precision * recall / (precision + recall)
}

/// A question's id and its ground-truth answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SquadGold {
    /// The question id.
    pub id: String,
    /// Every ground-truth answer text.
    pub answers: Vec<String>,
}

/// The official script's result.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SquadScore {
    /// Exact match, in percent.
    pub exact_match: f64,
    /// Token F1, in percent.
    pub f1: f64,
    /// Questions in the dataset.
    pub total: usize,
    /// Questions that had a prediction.
    pub answered: usize,
}

/// Best score of `prediction` over the ground truths (the official
/// `metric_max_over_ground_truths`; 0 with none).
fn best(metric: fn(&str, &str) -> f64, prediction: &str, truths: &[String]) -> f64 {
    truths
        .iter()
        .map(|t| metric(prediction, t))
        .fold(0.0, f64::max)
}

/// Exact match and F1 of one prediction against its ground truths.
pub fn score_question(prediction: &str, truths: &[String]) -> (f64, f64) {
    (
        best(exact_match, prediction, truths),
        best(f1, prediction, truths),
    )
}

/// Scores `predictions` (question id → answer text) on `gold`.
pub fn evaluate(gold: &[SquadGold], predictions: &HashMap<String, String>) -> SquadScore {
    let (mut em, mut f, mut answered) = (0.0, 0.0, 0);
    for question in gold {
        let Some(prediction) = predictions.get(&question.id) else {
            continue;
        };
        answered += 1;
        let (e, g) = score_question(prediction, &question.answers);
        em += e;
        f += g;
    }
    let total = gold.len();
    let percent = |x: f64| {
        if total == 0 {
            0.0
        } else {
            100.0 * x / total as f64
        }
    };
    SquadScore {
        exact_match: percent(em),
        f1: percent(f),
        total,
        answered,
    }
}

fn read_json(path: &Path) -> Result<Value, EvalError> {
    let text = std::fs::read_to_string(path).map_err(|source| EvalError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| EvalError::Format {
        path: path.to_path_buf(),
        detail: format!("line {}, column {}: {e}", e.line(), e.column()),
    })
}

/// The questions and answers of an official SQuAD v1.1 dataset file.
pub fn read_gold(path: &Path) -> Result<Vec<SquadGold>, EvalError> {
    let json = read_json(path)?;
    let bad = |at: String, what: &str| EvalError::Format {
        path: path.to_path_buf(),
        detail: format!("{at}: {what}"),
    };
    let array = |v: &Value, at: String| -> Result<Vec<Value>, EvalError> {
        v.as_array()
            .cloned()
            .ok_or_else(|| bad(at, "missing or not an array"))
    };
    let mut gold = Vec::new();
    for (a, article) in array(&json["data"], "data".into())?.iter().enumerate() {
        let at = format!("data[{a}].paragraphs");
        for (p, paragraph) in array(&article["paragraphs"], at.clone())?
            .iter()
            .enumerate()
        {
            let at = format!("{at}[{p}].qas");
            for (q, qa) in array(&paragraph["qas"], at.clone())?.iter().enumerate() {
                let at = format!("{at}[{q}]");
                let id = qa["id"]
                    .as_str()
                    .ok_or_else(|| bad(format!("{at}.id"), "missing or not a string"))?;
                let mut answers = Vec::new();
                for (i, answer) in array(&qa["answers"], format!("{at}.answers"))?
                    .iter()
                    .enumerate()
                {
                    let text = answer["text"].as_str().ok_or_else(|| {
                        bad(format!("{at}.answers[{i}].text"), "missing or not a string")
                    })?;
                    answers.push(text.to_string());
                }
                gold.push(SquadGold {
                    id: id.to_string(),
                    answers,
                });
            }
        }
    }
    Ok(gold)
}

/// An official `predictions.json`: `{"<question id>": "<answer text>", …}`.
pub fn read_predictions(path: &Path) -> Result<HashMap<String, String>, EvalError> {
    let json = read_json(path)?;
    let object = json.as_object().ok_or_else(|| EvalError::Format {
        path: path.to_path_buf(),
        detail: "not a JSON object of question id → answer text".into(),
    })?;
    object
        .iter()
        .map(|(id, text)| match text.as_str() {
            Some(text) => Ok((id.clone(), text.to_string())),
            None => Err(EvalError::Format {
                path: path.to_path_buf(),
                detail: format!("{id:?}: the answer is not a string"),
            }),
        })
        .collect()
}
