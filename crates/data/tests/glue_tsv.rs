//! The GLUE readers on fixture files written in each task's official layout
//! (`fixtures/glue/`, see its README): every split of all nine tasks parses
//! to the rows written there, labels map to HuggingFace's indices, and
//! malformed files fail naming the file, the line and the column.

use std::path::{Path, PathBuf};

use terse_data::glue::{GlueMetric, GlueTask, Label, SentenceExample, parse_glue, read_glue};

fn dir(task: GlueTask) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/glue")
        .join(task.dir_name())
}

fn read(task: GlueTask, split: &str) -> Vec<SentenceExample> {
    read_glue(&dir(task), task, split).unwrap_or_else(|e| panic!("{e}"))
}

fn classes(examples: &[SentenceExample]) -> Vec<Option<Label>> {
    examples.iter().map(|e| e.label).collect()
}

#[test]
fn every_split_of_every_task_parses() {
    let mut rows = 0;
    for task in GlueTask::ALL {
        for split in task.splits() {
            let examples = read(task, split);
            assert!(!examples.is_empty(), "{task:?} {split}");
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
    // The fixture files hold 45 records in all: python3 counting non-empty
    // lines minus one header per file (CoLA train/dev have none).
    assert_eq!(rows, 45);
}

#[test]
fn fields_and_labels_are_the_ones_written() {
    use Label::{Class, Score};
    // CoLA: header-less; label in column 2, sentence in column 4, a literal quote.
    let cola = read(GlueTask::Cola, "train");
    assert_eq!(
        classes(&cola),
        [Some(Class(1)), Some(Class(0)), Some(Class(1))]
    );
    assert_eq!(cola[2].text_a, "He said \"no\" twice.");
    assert_eq!(cola[1].guid, "train-2");
    // The empty sentence is kept as an empty text.
    assert_eq!(read(GlueTask::Cola, "dev")[1].text_a, "");
    assert_eq!(read(GlueTask::Cola, "test")[1].guid, "test-1");
    // SST-2 dev has its columns swapped: found by name.
    let sst = read(GlueTask::Sst2, "dev");
    assert_eq!(
        sst[0].text_a,
        "it 's a charming and often affecting journey . "
    );
    assert_eq!(classes(&sst), [Some(Class(1)), Some(Class(0))]);
    // MRPC: Quality is the label; the strings are columns 4 and 5.
    let mrpc = read(GlueTask::Mrpc, "train");
    assert_eq!(classes(&mrpc), [Some(Class(1)), Some(Class(0))]);
    assert!(
        mrpc[1]
            .text_b
            .as_deref()
            .unwrap()
            .starts_with("Yucaipa bought")
    );
    // STS-B scores.
    assert_eq!(
        classes(&read(GlueTask::Stsb, "train")),
        [Some(Score(5.0)), Some(Score(3.8))]
    );
    assert_eq!(read(GlueTask::Stsb, "dev")[1].label, Some(Score(4.75)));
    // QQP ids become guids.
    assert_eq!(read(GlueTask::Qqp, "train")[1].guid, "train-402555");
    assert_eq!(read(GlueTask::Qqp, "train")[1].label, Some(Class(1)));
    // MNLI: gold_label is the last column (12 in train, 16 in dev); labels
    // in HuggingFace's order contradiction 0, entailment 1, neutral 2.
    assert_eq!(
        classes(&read(GlueTask::Mnli, "train")),
        [Some(Class(2)), Some(Class(1))]
    );
    assert_eq!(read(GlueTask::Mnli, "dev_matched")[0].label, Some(Class(2)));
    assert_eq!(
        read(GlueTask::Mnli, "dev_mismatched")[0].label,
        Some(Class(0))
    );
    assert_eq!(
        read(GlueTask::Mnli, "test_matched")[0].text_b.as_deref(),
        Some("Hierbas is a name worth looking out for.")
    );
    // QNLI / RTE: entailment 0, not_entailment 1; WNLI 0/1.
    assert_eq!(read(GlueTask::Qnli, "dev")[0].label, Some(Class(0)));
    assert_eq!(
        classes(&read(GlueTask::Rte, "train")),
        [Some(Class(1)), Some(Class(0))]
    );
    assert_eq!(read(GlueTask::Wnli, "dev")[0].label, Some(Class(0)));
    // Metrics per task, as GLUE reports them.
    assert_eq!(GlueTask::Cola.metric(), GlueMetric::Matthews);
    assert_eq!(GlueTask::Qqp.metric(), GlueMetric::F1AndAccuracy);
    assert_eq!(GlueTask::Stsb.metric(), GlueMetric::Correlation);
    assert_eq!(GlueTask::Mnli.metric(), GlueMetric::Accuracy);
    assert_eq!(GlueTask::parse("SST-2").unwrap(), GlueTask::Sst2);
    assert!(
        GlueTask::parse("squad")
            .unwrap_err()
            .to_string()
            .contains("known: cola")
    );
}

fn error(task: GlueTask, split: &str, text: &str) -> String {
    parse_glue(text, Path::new("glue/X/dev.tsv"), task, split)
        .unwrap_err()
        .to_string()
}

#[test]
fn malformed_files_name_file_line_and_column() {
    let e = error(
        GlueTask::Rte,
        "dev",
        "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n1\ta\tb\n",
    );
    assert_eq!(
        e,
        "glue/X/dev.tsv: line 3: 3 tab-separated fields, expected 4"
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
    assert!(e.contains("\"7\" is not a similarity score"), "{e}");
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
    let e = error(GlueTask::Cola, "train", "gj04\t2\t\tbad label.\n");
    assert!(
        e.contains("line 1: column \"2\": unknown label \"2\""),
        "{e}"
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
