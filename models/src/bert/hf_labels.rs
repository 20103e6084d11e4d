//! A HuggingFace classifier's class order: its `config.json` names the
//! classes of its head's rows (`id2label`), and that order need not be the
//! one a terse task numbers them in (`run_glue`'s MNLI is entailment,
//! neutral, contradiction; terse's, `GlueTask::labels`, contradiction,
//! entailment, neutral). Loaded as it is, a head trained to perfection
//! would score every example as another class.

use std::path::Path;

use burn::nn::Linear;
use burn::tensor::{Int, Tensor, TensorData};

use super::{HfBert, HfLoadReport, load_hf};
use crate::ModelError;

/// The head's weight, under terse's name (HuggingFace's too): the head was
/// loaded from the file when it is among the loaded tensors.
const HEAD_WEIGHT: &str = "classifier.weight";

/// [`load_hf`], then a sequence classifier's head, when the file brought
/// one, put into the order of `labels` (the task's class names by terse
/// index; none for regression) by the names its `config.json` gives its
/// rows, matched ignoring case. A head whose classes are not the task's is
/// refused; one whose rows name no classes (`LABEL_0`, …) keeps its order.
pub fn load_hf_labelled<M: HfBert>(
    model: &mut M,
    path: &Path,
    labels: &[&str],
) -> Result<HfLoadReport, ModelError> {
    let report = load_hf(model, path)?;
    // A head the file lacked starts fresh: it has no order to follow.
    let head_loaded = report.loaded.iter().any(|name| name == HEAD_WEIGHT);
    if head_loaded && let Some(head) = model.classifier_mut() {
        let config = path.with_file_name("config.json");
        if let Some(order) = label_order(&config, &id2label(&config)?, labels)? {
            permute_outputs(head, &order);
        }
    }
    Ok(report)
}

/// `id2label` of the `config.json` at `path`, in id order; empty when it
/// has none (a config with no head).
fn id2label(path: &Path) -> Result<Vec<String>, ModelError> {
    let bad = |detail: String| ModelError::Format {
        path: path.to_path_buf(),
        detail,
    };
    let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let ids = match json.get("id2label") {
        None | Some(serde_json::Value::Null) => return Ok(Vec::new()),
        Some(ids) => ids,
    };
    let map = ids
        .as_object()
        .ok_or_else(|| bad(format!("id2label is {ids}, not an object")))?;
    (0..map.len())
        .map(|i| {
            map.get(&i.to_string())
                .and_then(serde_json::Value::as_str)
                .map(str::to_owned)
                .ok_or_else(|| bad(format!("id2label {ids} names no class {i}")))
        })
        .collect()
}

/// Whether `names` name no classes: HuggingFace's placeholders (`LABEL_0`,
/// `LABEL_1`, …, what `PretrainedConfig` writes when given none) or bare
/// ids (GLUE's binary tasks, whose TSVs label by number in the order
/// `datasets` names them). Such an order matches any other.
fn unnamed<S: AsRef<str>>(names: &[S]) -> bool {
    names.iter().enumerate().all(|(i, name)| {
        let (name, i) = (name.as_ref(), i.to_string());
        name == i || name.strip_prefix("LABEL_") == Some(i.as_str())
    })
}

/// For each of the task's `labels`, the row of the head that scores it,
/// given the classes of the head's rows (`checkpoint`, from `id2label` of
/// `config`): none when the rows are in the task's order already or either
/// side names no classes. Names match ignoring case (HuggingFace's
/// sentiment heads say `NEGATIVE`).
fn label_order(
    config: &Path,
    checkpoint: &[String],
    labels: &[&str],
) -> Result<Option<Vec<usize>>, ModelError> {
    if unnamed(checkpoint) || unnamed(labels) {
        return Ok(None);
    }
    let rows: Option<Vec<usize>> = labels
        .iter()
        .map(|label| {
            checkpoint
                .iter()
                .position(|name| name.eq_ignore_ascii_case(label))
        })
        .collect();
    // Every class of the task found, and no row left over: a permutation.
    let Some(rows) = rows.filter(|rows| rows.len() == checkpoint.len()) else {
        return Err(ModelError::Format {
            path: config.to_path_buf(),
            detail: format!(
                "the checkpoint's classifier scores the labels {checkpoint:?} (id2label), not \
                 the task's {labels:?} (ignoring case)"
            ),
        });
    };
    let in_order = rows.iter().enumerate().all(|(i, &row)| i == row);
    Ok((!in_order).then_some(rows))
}

/// Puts `head`'s outputs in `order`: output `i` becomes the loaded output
/// `order[i]`. burn's `Linear` holds its weight `[hidden, labels]`, the
/// transpose of HuggingFace's `classifier.weight` `[labels, hidden]`
/// (burn-store transposes it on load), so a class is a column of the
/// weight and an entry of `classifier.bias` `[labels]`.
fn permute_outputs(head: &mut Linear, order: &[usize]) {
    let device = head.weight.val().device();
    let rows: Vec<i64> = order.iter().map(|&row| row as i64).collect();
    let indices = Tensor::<1, Int>::from_data(TensorData::new(rows, [order.len()]), &device);
    head.weight = head
        .weight
        .clone()
        .map(|weight| select_leaf(weight, 1, indices.clone()));
    head.bias = head
        .bias
        .clone()
        .map(|bias| bias.map(|bias| select_leaf(bias, 0, indices)));
}

/// `tensor`'s entries `indices` along `dim`, as a new leaf with `tensor`'s
/// gradient setting: a parameter must stay one the optimizer updates, not
/// become a result of the selection.
fn select_leaf<const D: usize>(
    tensor: Tensor<D>,
    dim: usize,
    indices: Tensor<1, Int>,
) -> Tensor<D> {
    let grad = tensor.is_require_grad();
    tensor.select(dim, indices).detach().set_require_grad(grad)
}

#[cfg(test)]
mod tests {
    use burn::module::Param;
    use burn::nn::LinearConfig;
    use burn::tensor::Device;

    use super::*;

    const MNLI_HF: [&str; 3] = ["entailment", "neutral", "contradiction"];
    const MNLI_TERSE: [&str; 3] = ["contradiction", "entailment", "neutral"];

    fn order(checkpoint: &[&str], labels: &[&str]) -> Result<Option<Vec<usize>>, ModelError> {
        let checkpoint: Vec<String> = checkpoint.iter().map(|&name| name.to_owned()).collect();
        label_order(Path::new("ckpt/config.json"), &checkpoint, labels)
    }

    /// A head over 2 hidden units whose HuggingFace rows are `rows`, bias
    /// `bias`, on a device that trains.
    fn head(rows: [[f32; 2]; 3], bias: [f32; 3], device: &Device) -> Linear {
        let mut head = LinearConfig::new(2, 3).init(device);
        // burn's layout: [hidden, labels], the rows transposed.
        let weight: Vec<f32> = (0..2).flat_map(|h| rows.map(|row| row[h])).collect();
        head.weight = Param::from_tensor(Tensor::<2>::from_data(
            TensorData::new(weight, [2, 3]),
            device,
        ));
        head.bias = Some(Param::from_tensor(Tensor::<1>::from_data(
            TensorData::new(bias.to_vec(), [3]),
            device,
        )));
        head
    }

    /// The head's rows in HuggingFace's layout, and its bias.
    fn rows_and_bias(head: &Linear) -> (Vec<f32>, Vec<f32>) {
        let rows = head.weight.val().transpose().into_data();
        let bias = head.bias.as_ref().expect("a bias").val().into_data();
        (rows.iter::<f32>().collect(), bias.iter::<f32>().collect())
    }

    #[test]
    fn an_hf_mnli_head_is_put_in_terse_order() {
        // Terse's contradiction is the checkpoint's row 2, entailment row 0,
        // neutral row 1.
        let rows_of = order(&MNLI_HF, &MNLI_TERSE)
            .unwrap()
            .expect("a permutation");
        assert_eq!(rows_of, [2, 0, 1]);
        let device = Device::flex().autodiff();
        let hf_rows = [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]];
        let mut head = head(hf_rows, [0.0, 1.0, 2.0], &device);
        permute_outputs(&mut head, &rows_of);
        let (rows, bias) = rows_and_bias(&head);
        assert_eq!(rows, [2.0, 2.0, 0.0, 0.0, 1.0, 1.0]);
        assert_eq!(bias, [2.0, 0.0, 1.0]);
        // Still parameters that train.
        assert!(head.weight.val().is_require_grad());
        assert!(head.bias.unwrap().val().is_require_grad());
        // Names match ignoring case; terse's own export is in order.
        let upper = ["ENTAILMENT", "Neutral", "contradiction"];
        assert_eq!(order(&upper, &MNLI_TERSE).unwrap(), Some(vec![2, 0, 1]));
        assert_eq!(order(&MNLI_TERSE, &MNLI_TERSE).unwrap(), None);
    }

    #[test]
    fn placeholder_or_numeric_names_keep_the_order() {
        let placeholders = ["LABEL_0", "LABEL_1", "LABEL_2"];
        assert_eq!(order(&placeholders, &MNLI_TERSE).unwrap(), None);
        // A count other than the task's is left to the load's shape check.
        assert_eq!(order(&["LABEL_0", "LABEL_1"], &MNLI_TERSE).unwrap(), None);
        // GLUE's binary tasks label by number, as `datasets` orders its
        // names (SST-2: negative, positive).
        assert_eq!(order(&["negative", "positive"], &["0", "1"]).unwrap(), None);
        assert_eq!(order(&["0", "1"], &["negative", "positive"]).unwrap(), None);
        // Regression, and a config without id2label.
        assert_eq!(order(&["LABEL_0"], &[]).unwrap(), None);
        assert_eq!(order(&[], &MNLI_TERSE).unwrap(), None);
        // Placeholders out of place are names.
        assert!(order(&["LABEL_1", "LABEL_0"], &["a", "b"]).is_err());
    }

    #[test]
    fn a_class_the_task_lacks_is_refused_naming_both() {
        let e = order(&["entailment", "neutral", "refuted"], &MNLI_TERSE)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "ckpt/config.json: the checkpoint's classifier scores the labels [\"entailment\", \
             \"neutral\", \"refuted\"] (id2label), not the task's [\"contradiction\", \
             \"entailment\", \"neutral\"] (ignoring case)"
        );
        // Two classes of three, and a class left over.
        assert!(order(&["entailment", "neutral"], &MNLI_TERSE).is_err());
        let four = ["entailment", "neutral", "contradiction", "unrelated"];
        assert!(order(&four, &MNLI_TERSE).is_err());
    }

    #[test]
    fn id2label_is_read_in_id_order() {
        let dir = std::env::temp_dir().join(format!("terse-id2label-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("config.json");
        std::fs::write(
            &path,
            r#"{"id2label": {"1": "neutral", "0": "entailment", "2": "contradiction"}}"#,
        )
        .unwrap();
        assert_eq!(id2label(&path).unwrap(), MNLI_HF);
        std::fs::write(&path, r#"{"hidden_size": 8}"#).unwrap();
        assert!(id2label(&path).unwrap().is_empty());
        std::fs::write(&path, r#"{"id2label": {"0": "a", "2": "b"}}"#).unwrap();
        let e = id2label(&path).unwrap_err().to_string();
        assert!(e.ends_with("names no class 1"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
