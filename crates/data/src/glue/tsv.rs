//! Readers for the GLUE TSV files as the benchmark distributes them:
//! tab-separated, one record per line, no quoting (a `"` is a literal
//! character), a header line naming the columns — except CoLA's train and
//! dev files, which have none. Columns are found by header name, so their
//! order does not matter; every record must have as many fields as the
//! header, and every label must be one of the task's. A leading UTF-8
//! byte-order mark is dropped, and a file without a single example is
//! refused.

use std::collections::HashMap;
use std::path::Path;

use super::example::{Label, SentenceExample};
use super::task::GlueTask;
use crate::DataError;

/// Where a column is.
#[derive(Debug, Clone, Copy)]
enum Col {
    Named(&'static str),
    At(usize),
}

/// The columns of one task's file.
struct Layout {
    header: bool,
    fields: Option<usize>,
    guid: Option<Col>,
    a: Col,
    b: Option<Col>,
    label: Option<Col>,
}

fn layout(task: GlueTask, labelled: bool) -> Layout {
    use Col::*;
    let named =
        |guid: Option<Col>, a: &'static str, b: Option<&'static str>, label: &'static str| Layout {
            header: true,
            fields: None,
            guid,
            a: Named(a),
            b: b.map(Named),
            label: labelled.then_some(Named(label)),
        };
    // An `index` column in the test file only.
    let test_index = (!labelled).then_some(Named("index"));
    // The sentence-pair tasks with `index`, `sentence1` and `sentence2`.
    let pair = |label| named(Some(Named("index")), "sentence1", Some("sentence2"), label);
    match task {
        // source, label, original annotation, sentence.
        GlueTask::Cola if labelled => Layout {
            header: false,
            fields: Some(4),
            guid: None,
            a: At(3),
            b: None,
            label: Some(At(1)),
        },
        GlueTask::Cola => named(Some(Named("index")), "sentence", None, ""),
        GlueTask::Sst2 => named(test_index, "sentence", None, "label"),
        // Train and dev have no id column (guids are `<split>-<line>`); test
        // has `index`.
        GlueTask::Mrpc => named(test_index, "#1 String", Some("#2 String"), "Quality"),
        GlueTask::Stsb => pair("score"),
        GlueTask::Qqp => named(
            Some(Named("id")),
            "question1",
            Some("question2"),
            "is_duplicate",
        ),
        GlueTask::Mnli => pair("gold_label"),
        GlueTask::Qnli => named(Some(Named("index")), "question", Some("sentence"), "label"),
        GlueTask::Rte | GlueTask::Wnli => pair("label"),
    }
}

/// Reads split `split` (`train`, `dev`, `test`, MNLI's `dev_matched`, …) of
/// `task` from `dir` (the task's directory of the GLUE download).
pub fn read_glue(
    dir: &Path,
    task: GlueTask,
    split: &str,
) -> Result<Vec<SentenceExample>, DataError> {
    if !task.splits().contains(&split) {
        return Err(DataError::Config {
            config: "glue",
            detail: format!(
                "{task:?} has no split {split:?}; it has {}",
                task.splits().join(", ")
            ),
        });
    }
    let path = dir.join(task.split_file(split));
    let text = std::fs::read_to_string(&path).map_err(|source| DataError::Io {
        path: path.clone(),
        source,
    })?;
    parse_glue(&text, &path, task, split)
}

/// `text` without one leading UTF-8 byte-order mark (U+FEFF). The GLUE
/// download's MRPC `train.tsv` and `dev.tsv` begin with one, inherited from
/// `msr_paraphrase_train.txt` (HuggingFace opens GLUE files as `utf-8-sig`);
/// left in place it glues itself to the first column's name, and the
/// header then has "\u{feff}Quality" where "Quality" is looked for.
pub(super) fn strip_bom(text: &str) -> &str {
    text.strip_prefix('\u{feff}').unwrap_or(text)
}

/// Parses the text of a GLUE TSV file; `path` and `split` name it. A file
/// with no example is an error here, naming it, rather than an empty split
/// that fails far from the file (no batch to fill, no dev score).
pub fn parse_glue(
    text: &str,
    path: &Path,
    task: GlueTask,
    split: &str,
) -> Result<Vec<SentenceExample>, DataError> {
    let bad = |line: usize, detail: String| DataError::Format {
        path: path.to_path_buf(),
        detail: format!("line {line}: {detail}"),
    };
    let layout = layout(task, !split.starts_with("test"));
    let mut lines = strip_bom(text)
        .split('\n')
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .enumerate();
    let (names, width): (HashMap<&str, usize>, usize) = if layout.header {
        let header = match lines.next() {
            Some((_, header)) if !header.is_empty() => header,
            _ => return Err(bad(1, "empty file (expected a header line)".into())),
        };
        let names: Vec<&str> = header.split('\t').collect();
        (
            names.iter().enumerate().map(|(i, n)| (*n, i)).collect(),
            names.len(),
        )
    } else {
        (
            HashMap::new(),
            layout.fields.expect("header-less layouts give a width"),
        )
    };
    let column = |col: Col| -> Result<usize, DataError> {
        match col {
            Col::At(i) => Ok(i),
            Col::Named(name) => names.get(name).copied().ok_or_else(|| {
                let mut have: Vec<_> = names.iter().collect();
                have.sort_by_key(|(_, i)| **i);
                let have: Vec<&str> = have.into_iter().map(|(n, _)| *n).collect();
                bad(
                    1,
                    format!("no column {name:?} (the header has: {})", have.join(", ")),
                )
            }),
        }
    };
    let guid = layout.guid.map(column).transpose()?;
    let a = column(layout.a)?;
    let b = layout.b.map(column).transpose()?;
    let label = layout.label.map(column).transpose()?;
    let label_name = match layout.label {
        Some(Col::Named(n)) => n.to_string(),
        Some(Col::At(i)) => format!("{}", i + 1),
        None => String::new(),
    };

    let mut examples = Vec::new();
    for (n, line) in lines {
        let line_no = n + 1;
        if line.is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split('\t').collect();
        if fields.len() != width {
            return Err(bad(
                line_no,
                format!("{} tab-separated fields, expected {width}", fields.len()),
            ));
        }
        let label = match label {
            None => None,
            Some(i) => Some(
                parse_label(task, fields[i])
                    .map_err(|detail| bad(line_no, format!("column {label_name:?}: {detail}")))?,
            ),
        };
        examples.push(SentenceExample {
            guid: match guid {
                Some(i) => format!("{split}-{}", fields[i]),
                None => format!("{split}-{line_no}"),
            },
            text_a: fields[a].to_string(),
            text_b: b.map(|i| fields[i].to_string()),
            label,
        });
    }
    if examples.is_empty() {
        return Err(DataError::Format {
            path: path.to_path_buf(),
            detail: if layout.header {
                "holds no examples (nothing after its header line)".into()
            } else {
                "holds no examples (the file is empty)".into()
            },
        });
    }
    Ok(examples)
}

/// A label of `task` from its text in the file.
pub fn parse_label(task: GlueTask, text: &str) -> Result<Label, String> {
    if task.is_regression() {
        return match text.trim().parse::<f32>() {
            Ok(score) if (0.0..=5.0).contains(&score) => Ok(Label::Score(score)),
            _ => Err(format!("{text:?} is not a similarity score in [0, 5]")),
        };
    }
    task.labels()
        .iter()
        .position(|l| *l == text.trim())
        .map(|i| Label::Class(i as u32))
        .ok_or_else(|| {
            format!(
                "unknown label {text:?} (expected one of {})",
                task.labels().join(", ")
            )
        })
}
