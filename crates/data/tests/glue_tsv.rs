//! The GLUE readers on fixture files written in each task's official layout
//! (`fixtures/glue/`, see its README): every split of all nine tasks parses
//! to the rows written there (guids, labels in HuggingFace's order, and the
//! texts that test quoting and empty fields), columns are found by header
//! name whatever their order, a leading UTF-8 byte-order mark (MRPC's train
//! and dev files have one) is dropped, and malformed or example-less files
//! fail naming the file, the line and the column.

use std::path::{Path, PathBuf};

use terse_data::glue::{GlueTask, Label, SentenceExample, parse_glue, read_glue};

fn dir(task: GlueTask) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/glue")
        .join(task.dir_name())
}

fn read(task: GlueTask, split: &str) -> Vec<SentenceExample> {
    read_glue(&dir(task), task, split).unwrap_or_else(|e| panic!("{e}"))
}

fn guids(examples: &[SentenceExample]) -> Vec<&str> {
    examples.iter().map(|e| e.guid.as_str()).collect()
}

fn labels(examples: &[SentenceExample]) -> Vec<Option<Label>> {
    examples.iter().map(|e| e.label).collect()
}

fn classes(indices: &[u32]) -> Vec<Option<Label>> {
    indices.iter().map(|&i| Some(Label::Class(i))).collect()
}

#[test]
fn every_split_of_every_task_parses() {
    let mut rows = 0;
    for task in GlueTask::ALL {
        for split in task.splits() {
            let examples = read(task, split);
            for e in &examples {
                assert_eq!(e.text_b.is_some(), task.is_pair(), "{task:?} {split}");
                assert_eq!(
                    e.label.is_some(),
                    !split.starts_with("test"),
                    "{task:?} {split}"
                );
            }
            rows += examples.len();
        }
    }
    // python3: sum over the 29 files of their non-empty lines, less one
    // header per file but CoLA train/dev → 94.
    assert_eq!(rows, 94);
}

/// The gold labels, one line per labelled file. Independent source:
/// python3 `csv.reader(f, delimiter='\t', quoting=csv.QUOTE_NONE)` on each
/// file, printing the label column (by header name; CoLA column 2) →
/// CoLA train/dev 1 0 1 0; SST-2 train 0 0 1 1, dev 1 0 1; MRPC train 1 0 1,
/// dev 1 0 0; STS-B train 5.000 3.800 0.500, dev 5.000 4.750 5.000 0.000;
/// QQP train 0 1 0 1, dev 0 0 1; MNLI train neutral entailment entailment
/// entailment, dev_matched neutral contradiction entailment, dev_mismatched
/// contradiction contradiction entailment; QNLI train not_entailment
/// not_entailment entailment, dev entailment not_entailment not_entailment;
/// RTE train not_entailment entailment entailment, dev not_entailment
/// entailment not_entailment; WNLI train 1 1 1 0, dev 0 1 1. Mapped by hand
/// to HuggingFace's indices: MNLI contradiction 0, entailment 1, neutral 2;
/// QNLI/RTE entailment 0, not_entailment 1.
#[test]
fn labels_are_the_ones_written() {
    use GlueTask::*;
    let cases: [(GlueTask, &str, &[u32]); 20] = [
        (Cola, "train", &[1, 0, 1, 0]),
        (Cola, "dev", &[1, 0, 1, 0]),
        (Sst2, "train", &[0, 0, 1, 1]),
        (Sst2, "dev", &[1, 0, 1]),
        (Mrpc, "train", &[1, 0, 1]),
        (Mrpc, "dev", &[1, 0, 0]),
        (Qqp, "train", &[0, 1, 0, 1]),
        (Qqp, "dev", &[0, 0, 1]),
        (Mnli, "train", &[2, 1, 1, 1]),
        (Mnli, "dev_matched", &[2, 0, 1]),
        (Mnli, "dev_mismatched", &[0, 0, 1]),
        (Qnli, "train", &[1, 1, 0]),
        (Qnli, "dev", &[0, 1, 1]),
        (Rte, "train", &[1, 0, 0]),
        (Rte, "dev", &[1, 0, 1]),
        (Wnli, "train", &[1, 1, 1, 0]),
        (Wnli, "dev", &[0, 1, 1]),
        // Test files: no labels, three rows each.
        (Cola, "test", &[]),
        (Mnli, "test_matched", &[]),
        (Mnli, "test_mismatched", &[]),
    ];
    for (task, split, expected) in cases {
        let got = read(task, split);
        if split.starts_with("test") {
            assert_eq!(labels(&got), [None, None, None], "{task:?} {split}");
        } else {
            assert_eq!(labels(&got), classes(expected), "{task:?} {split}");
        }
    }
    let score = |s: f32| Some(Label::Score(s));
    assert_eq!(
        labels(&read(Stsb, "train")),
        [score(5.0), score(3.8), score(0.5)]
    );
    assert_eq!(
        labels(&read(Stsb, "dev")),
        [score(5.0), score(4.75), score(5.0), score(0.0)]
    );
}

#[test]
fn guids_come_from_the_id_column_or_the_line() {
    use GlueTask::*;
    // No id column: `<split>-<line>`, 1-based, header included.
    assert_eq!(
        guids(&read(Cola, "train")),
        ["train-1", "train-2", "train-3", "train-4"]
    );
    assert_eq!(guids(&read(Sst2, "dev")), ["dev-2", "dev-3", "dev-4"]);
    assert_eq!(
        guids(&read(Mrpc, "train")),
        ["train-2", "train-3", "train-4"]
    );
    // `index` / `id` columns.
    assert_eq!(guids(&read(Cola, "test")), ["test-0", "test-1", "test-2"]);
    assert_eq!(guids(&read(Mrpc, "test")), ["test-0", "test-1", "test-2"]);
    assert_eq!(
        guids(&read(Qqp, "train")),
        [
            "train-133273",
            "train-402555",
            "train-360472",
            "train-150662"
        ]
    );
    assert_eq!(
        guids(&read(Mnli, "dev_mismatched")),
        ["dev_mismatched-0", "dev_mismatched-1", "dev_mismatched-2"]
    );
    assert_eq!(guids(&read(Stsb, "dev"))[3], "dev-3");
}

#[test]
fn texts_keep_quotes_and_empty_fields() {
    use GlueTask::*;
    let text = |task, split, row: usize| {
        let e = &read(task, split)[row];
        (e.text_a.clone(), e.text_b.clone())
    };
    // CoLA: the sentence is column 4; a `"` is an ordinary character.
    assert_eq!(
        text(Cola, "train", 2),
        ("He said \"no\" twice.".to_string(), None)
    );
    // Empty sentence fields stay empty texts.
    assert_eq!(text(Cola, "dev", 2).0, "");
    assert_eq!(text(Sst2, "test", 1).0, "");
    // SST-2 keeps its trailing space.
    assert_eq!(
        text(Sst2, "train", 3).0,
        "the \" twist \" is the best thing in it "
    );
    // MRPC: a field that starts with `"` is not a quoted field.
    assert_eq!(
        text(Mrpc, "dev", 0).1.as_deref(),
        Some("\" The foodservice pie business does not fit our long-term growth strategy .")
    );
    assert!(
        text(Mrpc, "train", 1)
            .1
            .unwrap()
            .starts_with("Yucaipa bought")
    );
    assert_eq!(
        text(Stsb, "train", 2),
        (
            "\"Obama\" signs bill".to_string(),
            Some("Obama signs up".to_string())
        )
    );
    assert_eq!(
        text(Qqp, "test", 1),
        (
            "What are the top ten Consumer-to-Consumer E-commerce online?".to_string(),
            Some("What are the top ten Consumer-to-Business E-commerce online?".to_string())
        )
    );
    // MNLI: sentence1/sentence2 (columns 9 and 10), not the parses.
    assert_eq!(
        text(Mnli, "test_matched", 0).1.as_deref(),
        Some("Hierbas is a name worth looking out for.")
    );
    assert_eq!(
        text(Mnli, "test_mismatched", 1).0,
        "\"I'm going to call it in,\" he said."
    );
    assert_eq!(
        text(Qnli, "dev", 0),
        (
            "What came into force after the new constitution was herald?".to_string(),
            Some(
                "As of that day, the new constitution heralding the Second Republic came into force."
                    .to_string()
            )
        )
    );
    assert_eq!(
        text(Rte, "test", 2).0,
        "The \"Oxford Companion to Wine\" calls it a grape."
    );
    assert_eq!(text(Wnli, "dev", 2).1.as_deref(), Some("Sam was right."));
}

fn parse(task: GlueTask, split: &str, text: &str) -> Vec<SentenceExample> {
    parse_glue(text, Path::new("x.tsv"), task, split).unwrap()
}

#[test]
fn columns_are_found_by_name() {
    // SST-2 with its columns swapped, MNLI with only the columns it needs
    // (in another order), CRLF line ends.
    let sst = parse(
        GlueTask::Sst2,
        "dev",
        "label\tsentence\r\n0\tdull .\r\n1\tfun\r\n",
    );
    assert_eq!(
        sst.iter()
            .map(|e| (e.text_a.as_str(), e.label))
            .collect::<Vec<_>>(),
        [
            ("dull .", Some(Label::Class(0))),
            ("fun", Some(Label::Class(1)))
        ]
    );
    let mnli = parse(
        GlueTask::Mnli,
        "train",
        "gold_label\tsentence2\tindex\tsentence1\nneutral\tb\t7\ta\n",
    );
    assert_eq!(
        mnli,
        [SentenceExample {
            guid: "train-7".into(),
            text_a: "a".into(),
            text_b: Some("b".into()),
            label: Some(Label::Class(2)),
        }]
    );
}

fn error(task: GlueTask, split: &str, text: &str) -> String {
    parse_glue(text, Path::new("glue/X/dev.tsv"), task, split)
        .unwrap_err()
        .to_string()
}

#[test]
fn malformed_files_name_file_line_and_column() {
    // A fixture file with a lost column on its line 3.
    let broken = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/glue-malformed/MRPC");
    let e = read_glue(&broken, GlueTask::Mrpc, "train")
        .unwrap_err()
        .to_string();
    assert!(
        e.ends_with("glue-malformed/MRPC/train.tsv: line 3: 4 tab-separated fields, expected 5"),
        "{e}"
    );
    let e = error(
        GlueTask::Rte,
        "dev",
        "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n1\ta\tb\n",
    );
    assert_eq!(
        e,
        "glue/X/dev.tsv: line 3: 3 tab-separated fields, expected 4"
    );
    // A stray tab inside a sentence is one field too many.
    let e = error(GlueTask::Sst2, "train", "sentence\tlabel\ngood\tfun\t1\n");
    assert_eq!(
        e,
        "glue/X/dev.tsv: line 2: 3 tab-separated fields, expected 2"
    );
    let e = error(
        GlueTask::Rte,
        "dev",
        "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tmaybe\n",
    );
    assert_eq!(
        e,
        "glue/X/dev.tsv: line 2: column \"label\": unknown label \"maybe\" (expected one of entailment, not_entailment)"
    );
    let e = error(
        GlueTask::Mnli,
        "train",
        "index\tsentence1\tsentence2\tgold_label\n0\ta\tb\t-\n",
    );
    assert_eq!(
        e,
        "glue/X/dev.tsv: line 2: column \"gold_label\": unknown label \"-\" (expected one of contradiction, entailment, neutral)"
    );
    let header =
        "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore";
    let e = error(
        GlueTask::Stsb,
        "train",
        &format!("{header}\n0\tg\tf\ty\to\ts\ts\ta\tb\tabc\n"),
    );
    assert_eq!(
        e,
        "glue/X/dev.tsv: line 2: column \"score\": \"abc\" is not a similarity score in [0, 5]"
    );
    let e = error(
        GlueTask::Stsb,
        "train",
        &format!("{header}\n0\tg\tf\ty\to\ts\ts\ta\tb\t7\n"),
    );
    assert_eq!(
        e,
        "glue/X/dev.tsv: line 2: column \"score\": \"7\" is not a similarity score in [0, 5]"
    );
    let e = error(GlueTask::Qnli, "train", "index\tquestion\tpassage\tlabel\n");
    assert_eq!(
        e,
        "glue/X/dev.tsv: line 1: no column \"sentence\" (the header has: index, question, passage, label)"
    );
    let e = error(
        GlueTask::Cola,
        "train",
        "gj04\t1\t\tfine.\ngj04\t1\tno sentence\n",
    );
    assert_eq!(
        e,
        "glue/X/dev.tsv: line 2: 3 tab-separated fields, expected 4"
    );
    // CoLA's header-less label column is named by its 1-based position.
    let e = error(GlueTask::Cola, "train", "gj04\t2\t\tbad label.\n");
    assert_eq!(
        e,
        "glue/X/dev.tsv: line 1: column \"2\": unknown label \"2\" (expected one of 0, 1)"
    );
    assert_eq!(
        error(GlueTask::Rte, "dev", ""),
        "glue/X/dev.tsv: line 1: empty file (expected a header line)"
    );
    let missing = read_glue(Path::new("/nonexistent/RTE"), GlueTask::Rte, "dev")
        .unwrap_err()
        .to_string();
    assert!(missing.contains("/nonexistent/RTE/dev.tsv"), "{missing}");
    let split = read_glue(&dir(GlueTask::Rte), GlueTask::Rte, "dev_matched")
        .unwrap_err()
        .to_string();
    assert!(split.contains("has no split \"dev_matched\""), "{split}");
}

/// Rows in MRPC's train layout, with CRLF line ends; the tests add the
/// UTF-8 byte-order mark that the GLUE download's MRPC train and dev files
/// begin with (from `msr_paraphrase_train.txt`).
const MRPC_TRAIN: &str = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\r\n\
    1\t702876\t702977\tAmrozi accused his brother .\tReferring to him as \" the witness \" .\r\n\
    0\t2108705\t2108831\tYucaipa owned Dominick 's .\tYucaipa bought Dominick 's in 1995 .\r\n";

#[test]
fn a_leading_byte_order_mark_is_dropped() {
    let with_bom = parse(GlueTask::Mrpc, "train", &format!("\u{feff}{MRPC_TRAIN}"));
    assert_eq!(
        with_bom,
        [
            SentenceExample {
                guid: "train-2".into(),
                text_a: "Amrozi accused his brother .".into(),
                text_b: Some("Referring to him as \" the witness \" .".into()),
                label: Some(Label::Class(1)),
            },
            SentenceExample {
                guid: "train-3".into(),
                text_a: "Yucaipa owned Dominick 's .".into(),
                text_b: Some("Yucaipa bought Dominick 's in 1995 .".into()),
                label: Some(Label::Class(0)),
            },
        ]
    );
    // Without one the file reads the same; only one mark at the very start
    // is dropped (a second is part of the first column's name).
    assert_eq!(parse(GlueTask::Mrpc, "train", MRPC_TRAIN), with_bom);
    let e = error(
        GlueTask::Mrpc,
        "train",
        &format!("\u{feff}\u{feff}{MRPC_TRAIN}"),
    );
    assert!(e.contains("line 1: no column \"Quality\""), "{e}");
    // On disk, through read_glue, and for a header-less CoLA file.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("train.tsv"),
        format!("\u{feff}{MRPC_TRAIN}"),
    )
    .unwrap();
    assert_eq!(
        read_glue(dir.path(), GlueTask::Mrpc, "train").unwrap(),
        with_bom
    );
    let cola = parse(GlueTask::Cola, "train", "\u{feff}gj04\t1\t\tFine.\n");
    assert_eq!(cola[0].text_a, "Fine.");
}

#[test]
fn files_without_examples_are_refused_naming_the_file() {
    // Only a header (with or without blank lines after it).
    let header_only = "glue/X/dev.tsv: holds no examples (nothing after its header line)";
    assert_eq!(
        error(
            GlueTask::Mrpc,
            "train",
            "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
        ),
        header_only
    );
    assert_eq!(
        error(GlueTask::Sst2, "dev", "\u{feff}sentence\tlabel\r\n\r\n\n"),
        header_only
    );
    assert_eq!(
        error(GlueTask::Sst2, "test", "index\tsentence\n"),
        header_only
    );
    // Empty files: CoLA's header-less train file, a task with a header.
    let empty = "glue/X/dev.tsv: holds no examples (the file is empty)";
    assert_eq!(error(GlueTask::Cola, "train", ""), empty);
    assert_eq!(error(GlueTask::Cola, "dev", "\n\n"), empty);
    assert_eq!(
        error(GlueTask::Mrpc, "dev", "\u{feff}"),
        "glue/X/dev.tsv: line 1: empty file (expected a header line)"
    );
    // On disk: a 0-byte file and a header-only one, each named.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("train.tsv"), "").unwrap();
    std::fs::write(
        dir.path().join("dev.tsv"),
        "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n",
    )
    .unwrap();
    for split in ["train", "dev"] {
        let e = read_glue(dir.path(), GlueTask::Mrpc, split)
            .unwrap_err()
            .to_string();
        let file = dir.path().join(format!("{split}.tsv"));
        assert!(e.starts_with(&file.display().to_string()), "{e}");
        assert!(
            e.contains("empty file") || e.contains("holds no examples"),
            "{e}"
        );
    }
}
