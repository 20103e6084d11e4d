//! From the data crate's examples to the tensors BERT's heads take: rows
//! padded with `[PAD]` to the longest in the batch (padding costs compute,
//! and the attention mask keeps it from changing any result), the attention
//! mask, token types, and each head's targets — masked positions flattened
//! to `b·seq + t` for the pre-training head, which evaluates the decoder only
//! there.

use std::borrow::Cow;

use burn::tensor::{Device, Int, Tensor, TensorData};
use terse_data::SquadFeature;
use terse_data::glue::{ClassificationFeature, Label};
use terse_data::pretrain::PretrainExample;
use terse_models::bert::BertInput;

use crate::TrainError;

/// What padding needs of an example: its token ids and their types
/// (borrowed where the example stores them, built where it derives them).
trait TokenRow {
    fn tokens(&self) -> (&[u32], Cow<'_, [u32]>);
}

impl TokenRow for PretrainExample {
    fn tokens(&self) -> (&[u32], Cow<'_, [u32]>) {
        (&self.input_ids, Cow::Owned(self.token_type_ids()))
    }
}

impl TokenRow for ClassificationFeature {
    fn tokens(&self) -> (&[u32], Cow<'_, [u32]>) {
        (&self.input_ids, Cow::Borrowed(&self.token_type_ids))
    }
}

impl TokenRow for SquadFeature {
    fn tokens(&self) -> (&[u32], Cow<'_, [u32]>) {
        (&self.input_ids, Cow::Borrowed(&self.token_type_ids))
    }
}

/// Padded ids, types and mask, row-major `[batch, seq]`.
fn pad_rows(
    examples: &[impl TokenRow],
    pad_id: u32,
    device: &Device,
) -> Result<(BertInput, usize), TrainError> {
    let rows: Vec<(&[u32], Cow<'_, [u32]>)> = examples.iter().map(TokenRow::tokens).collect();
    let seq = rows.iter().map(|(ids, _)| ids.len()).max().unwrap_or(0);
    if rows.is_empty() || seq == 0 {
        return Err(TrainError::Batch(
            "an empty batch or an empty sequence".into(),
        ));
    }
    let batch = rows.len();
    let (mut ids, mut types, mut mask) = (
        Vec::with_capacity(batch * seq),
        Vec::with_capacity(batch * seq),
        Vec::with_capacity(batch * seq),
    );
    for (row, row_types) in &rows {
        if row_types.len() != row.len() {
            return Err(TrainError::Batch(format!(
                "{} token types for {} tokens",
                row_types.len(),
                row.len()
            )));
        }
        for t in 0..seq {
            ids.push(i64::from(row.get(t).copied().unwrap_or(pad_id)));
            types.push(i64::from(row_types.get(t).copied().unwrap_or(0)));
            mask.push(i64::from(t < row.len()));
        }
    }
    Ok((
        BertInput::from_rows(ids, types, mask, [batch, seq], device),
        seq,
    ))
}

fn ints(values: Vec<i64>, device: &Device) -> Tensor<1, Int> {
    let n = values.len();
    Tensor::from_data(TensorData::new(values, [n]), device)
}

/// A masked-LM + next-sentence batch.
#[derive(Debug, Clone)]
pub struct PretrainBatch {
    /// The model input `[batch, seq]`.
    pub input: BertInput,
    /// Masked positions, flattened to `b·seq + t` `[masked]`.
    pub masked_positions: Tensor<1, Int>,
    /// The original ids there `[masked]`.
    pub mlm_labels: Tensor<1, Int>,
    /// 1 where segment B is a random next `[batch]`.
    pub nsp_labels: Tensor<1, Int>,
}

/// Collates pre-training examples.
pub fn pretrain_batch(
    examples: &[PretrainExample],
    pad_id: u32,
    device: &Device,
) -> Result<PretrainBatch, TrainError> {
    let (input, seq) = pad_rows(examples, pad_id, device)?;
    let (mut positions, mut labels) = (Vec::new(), Vec::new());
    for (b, e) in examples.iter().enumerate() {
        for (&p, &label) in e.masked.positions.iter().zip(&e.masked.labels) {
            positions.push((b * seq + usize::from(p)) as i64);
            labels.push(i64::from(label));
        }
    }
    let nsp = examples
        .iter()
        .map(|e| i64::from(e.is_random_next))
        .collect();
    Ok(PretrainBatch {
        input,
        masked_positions: ints(positions, device),
        mlm_labels: ints(labels, device),
        nsp_labels: ints(nsp, device),
    })
}

/// A sentence(-pair) classification or regression batch.
#[derive(Debug, Clone)]
pub struct ClassificationBatch {
    /// The model input.
    pub input: BertInput,
    /// Class targets `[batch]` (classification with labels).
    pub classes: Option<Tensor<1, Int>>,
    /// Score targets `[batch]` (regression with labels).
    pub scores: Option<Tensor<1>>,
}

/// Collates classification inputs; labels must be all classes, all scores,
/// or all absent.
pub fn classification_batch(
    features: &[ClassificationFeature],
    pad_id: u32,
    device: &Device,
) -> Result<ClassificationBatch, TrainError> {
    let (input, _) = pad_rows(features, pad_id, device)?;
    let labels: Vec<Option<Label>> = features.iter().map(|f| f.label).collect();
    let (mut classes, mut scores) = (Vec::new(), Vec::new());
    for label in &labels {
        match label {
            Some(Label::Class(c)) => classes.push(i64::from(*c)),
            Some(Label::Score(s)) => scores.push(*s),
            None => {}
        }
    }
    let mixed = [classes.len(), scores.len()]
        .iter()
        .filter(|&&n| n > 0)
        .count()
        > 1
        || (!classes.is_empty() && classes.len() != features.len())
        || (!scores.is_empty() && scores.len() != features.len());
    if mixed {
        return Err(TrainError::Batch(
            "a batch mixes class labels, scores and unlabelled examples".into(),
        ));
    }
    let n = scores.len();
    Ok(ClassificationBatch {
        input,
        classes: (!classes.is_empty()).then(|| ints(classes, device)),
        scores: (n > 0).then(|| Tensor::from_data(TensorData::new(scores, [n]), device)),
    })
}

/// A span-QA batch.
#[derive(Debug, Clone)]
pub struct SquadBatch {
    /// The model input.
    pub input: BertInput,
    /// Answer start token per feature (0 = `[CLS]`: not in this window).
    pub start_positions: Tensor<1, Int>,
    /// Answer end token per feature.
    pub end_positions: Tensor<1, Int>,
}

/// Collates SQuAD features.
pub fn squad_batch(
    features: &[SquadFeature],
    pad_id: u32,
    device: &Device,
) -> Result<SquadBatch, TrainError> {
    let (input, _) = pad_rows(features, pad_id, device)?;
    Ok(SquadBatch {
        input,
        start_positions: ints(
            features.iter().map(|f| f.start_position as i64).collect(),
            device,
        ),
        end_positions: ints(
            features.iter().map(|f| f.end_position as i64).collect(),
            device,
        ),
    })
}
