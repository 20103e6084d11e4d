//! Collation into BERT's tensors: padded rows, masks, token types and flat
//! masked positions written out by hand for two small examples, and the
//! property padding exists for — a padded batch gives every example the
//! MLM, NSP and span logits it gets alone (tiny BERT, dropout off, 1e-5).

use burn::tensor::{Device, Int, Tensor};
use terse_data::SquadFeature;
use terse_data::glue::{ClassificationFeature, Label};
use terse_models::bert::{BertConfig, BertForPreTraining, BertForQuestionAnswering, BertPreset};
use terse_train::{classification_batch, pretrain_batch, squad_batch};

// The two examples of the data crate's tiny shard, written out there once.
#[path = "../../data/tests/tiny_shard/mod.rs"]
mod tiny_shard;

use tiny_shard::tiny_examples as examples;

fn ints<const D: usize>(t: Tensor<D, Int>) -> Vec<i64> {
    t.into_data().iter::<i64>().collect()
}

fn floats<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().iter::<f32>().collect()
}

fn tiny() -> BertConfig {
    BertConfig {
        hidden_dropout_prob: 0.0,
        attention_probs_dropout_prob: 0.0,
        ..BertPreset::Tiny.config()
    }
}

#[test]
fn pretraining_batch_by_hand() {
    let device = Device::flex();
    let batch = pretrain_batch(&examples(), 0, &device).unwrap();
    // Longest row: 7 tokens; row 0 gets one [PAD] (id 0) and mask 0 there.
    assert_eq!(batch.input.input_ids.dims(), [2, 7]);
    let ids: Vec<i64> = ints(batch.input.input_ids.clone());
    assert_eq!(
        ids,
        [
            101, 7592, 103, 102, 2003, 102, 0, 101, 1037, 102, 1038, 1039, 103, 102
        ]
    );
    let mask: Vec<i64> = ints(batch.input.attention_mask.clone());
    assert_eq!(mask, [1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1]);
    let types: Vec<i64> = ints(batch.input.token_type_ids.clone());
    assert_eq!(types, [0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1]);
    // Flat positions b·7 + t: (0, 2) → 2; (1, 1) → 8; (1, 5) → 12.
    assert_eq!(ints(batch.masked_positions), [2, 8, 12]);
    assert_eq!(ints(batch.mlm_labels), [2088, 1037, 1040]);
    assert_eq!(ints(batch.nsp_labels), [0, 1]);
    assert!(pretrain_batch(&[], 0, &device).is_err());
}

#[test]
fn padding_changes_no_logit() {
    let device = Device::flex();
    let model = BertForPreTraining::new(&tiny(), &device);
    let all = examples();
    let both = pretrain_batch(&all, 0, &device).unwrap();
    let out = model.forward(both.input, both.masked_positions);
    let mlm = floats(out.mlm_logits);
    let nsp = floats(out.nsp_logits);
    let vocab = tiny().vocab_size;
    let mut alone_mlm = Vec::new();
    let mut alone_nsp = Vec::new();
    for e in &all {
        let one = pretrain_batch(std::slice::from_ref(e), 0, &device).unwrap();
        let out = model.forward(one.input, one.masked_positions);
        alone_mlm.extend(floats(out.mlm_logits));
        alone_nsp.extend(floats(out.nsp_logits));
    }
    assert_eq!(mlm.len(), 3 * vocab);
    let worst = |a: &[f32], b: &[f32]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max)
    };
    assert!(
        worst(&mlm, &alone_mlm) < 1e-5,
        "{}",
        worst(&mlm, &alone_mlm)
    );
    assert!(
        worst(&nsp, &alone_nsp) < 1e-5,
        "{}",
        worst(&nsp, &alone_nsp)
    );

    // Span QA: the same for start/end logits over each feature's own tokens.
    let qa = BertForQuestionAnswering::new(&tiny(), &device);
    let feature = |ids: Vec<u32>, start| SquadFeature {
        example: 0,
        token_type_ids: (0..ids.len()).map(|i| u32::from(i >= 3)).collect(),
        offsets: vec![None; ids.len()],
        max_context: vec![false; ids.len()],
        start_position: start,
        end_position: start + 1,
        input_ids: ids,
    };
    let features = [
        feature(vec![101, 2054, 102, 3000, 3001, 102], 3),
        feature(vec![101, 2054, 2003, 102, 3002, 3003, 3004, 3005, 102], 0),
    ];
    let batch = squad_batch(&features, 0, &device).unwrap();
    assert_eq!(ints(batch.start_positions), [3, 0]);
    assert_eq!(ints(batch.end_positions), [4, 1]);
    let (start, _) = qa.forward(batch.input);
    let start = floats(start);
    let alone = squad_batch(&features[..1], 0, &device).unwrap();
    let (start_alone, _) = qa.forward(alone.input);
    // Row 0 of the padded [2, 9] batch, first 6 positions.
    assert!(worst(&start[..6], &floats(start_alone)) < 1e-5);
}

#[test]
fn classification_labels_must_agree() {
    let device = Device::flex();
    let feature = |label| ClassificationFeature {
        input_ids: vec![101, 2000, 102],
        token_type_ids: vec![0, 0, 0],
        label,
    };
    let batch = classification_batch(
        &[
            feature(Some(Label::Class(1))),
            feature(Some(Label::Class(0))),
        ],
        0,
        &device,
    )
    .unwrap();
    assert_eq!(ints(batch.classes.unwrap()), [1, 0]);
    assert!(batch.scores.is_none());
    let batch = classification_batch(&[feature(Some(Label::Score(4.5)))], 0, &device).unwrap();
    assert_eq!(floats(batch.scores.unwrap()), [4.5]);
    let batch = classification_batch(&[feature(None)], 0, &device).unwrap();
    assert!(batch.classes.is_none() && batch.scores.is_none());
    let error = classification_batch(&[feature(Some(Label::Class(1))), feature(None)], 0, &device)
        .unwrap_err()
        .to_string();
    assert!(error.contains("mixes"), "{error}");
}
