//! HuggingFace interop: BERT weights load from `BertModel`,
//! `BertForPreTraining`, `BertForQuestionAnswering` or
//! `BertForSequenceClassification` safetensors by renaming keys (burn-store
//! transposes the linear weights and maps LayerNorm's weight/bias), and save
//! under HuggingFace's names with a `config.json`, so `transformers` loads
//! them back.

use std::path::Path;

use burn::module::Module;
use burn::nn::Linear;
use burn::store::{BurnToPyTorchAdapter, ModuleSnapshot, PyTorchToBurnAdapter, SafetensorsStore};

use super::{
    BertConfig, BertForPreTraining, BertForQuestionAnswering, BertForSequenceClassification,
    BertModel, LayerNormPlacement,
};
use crate::ModelError;

/// A BERT model whose weights have HuggingFace names.
pub trait HfBert: Module + ModuleSnapshot + Sized {
    /// Where the encoder sits in HuggingFace's class (`""` or `"bert."`).
    const ENCODER_PREFIX: &'static str;
    /// HuggingFace's class name, for `config.json`'s `architectures`.
    const ARCHITECTURE: &'static str;
    /// The encoder.
    fn encoder(&self) -> &BertModel;
    /// The sequence classifier's head, whose outputs are classes in an
    /// order a checkpoint's `config.json` names (`load_hf_labelled` puts
    /// them in the task's); none for the models without one.
    fn classifier_mut(&mut self) -> Option<&mut Linear> {
        None
    }
}

impl HfBert for BertModel {
    const ENCODER_PREFIX: &'static str = "";
    const ARCHITECTURE: &'static str = "BertModel";
    fn encoder(&self) -> &BertModel {
        self
    }
}

impl HfBert for BertForPreTraining {
    const ENCODER_PREFIX: &'static str = "bert.";
    const ARCHITECTURE: &'static str = "BertForPreTraining";
    fn encoder(&self) -> &BertModel {
        &self.bert
    }
}

impl HfBert for BertForQuestionAnswering {
    const ENCODER_PREFIX: &'static str = "bert.";
    const ARCHITECTURE: &'static str = "BertForQuestionAnswering";
    fn encoder(&self) -> &BertModel {
        &self.bert
    }
}

impl HfBert for BertForSequenceClassification {
    const ENCODER_PREFIX: &'static str = "bert.";
    const ARCHITECTURE: &'static str = "BertForSequenceClassification";
    fn encoder(&self) -> &BertModel {
        &self.bert
    }
    fn classifier_mut(&mut self) -> Option<&mut Linear> {
        Some(&mut self.classifier)
    }
}

/// What loading matched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HfLoadReport {
    /// Tensors loaded (terse names).
    pub loaded: Vec<String>,
    /// Tensors of the model the file did not have (they keep their
    /// initial values: e.g. a task head on top of a pretrained encoder).
    pub missing: Vec<String>,
    /// Tensors in the file the model has no place for (e.g. `position_ids`
    /// buffers, or heads the model does not have).
    pub unused: Vec<String>,
}

impl HfLoadReport {
    /// Missing tensors inside the encoder (embeddings, layers, pooler):
    /// loading a pretrained encoder must leave none.
    pub fn missing_encoder(&self, prefix: &str) -> Vec<&str> {
        self.missing
            .iter()
            .map(String::as_str)
            .filter(|m| {
                let m = m.strip_prefix(prefix).unwrap_or(m);
                m.starts_with("embeddings.")
                    || m.starts_with("encoder.")
                    || m.starts_with("pooler.")
            })
            .collect()
    }
}

/// Loads HuggingFace safetensors into `model`: keys of any of the four
/// classes are accepted (the `bert.` prefix is added or removed), shapes are
/// checked, and missing or unused tensors are reported rather than silently
/// ignored. A classifier's head keeps the file's class order, whatever its
/// `config.json` names: a task's classifier loads with `load_hf_labelled`.
pub fn load_hf<M: HfBert>(model: &mut M, path: &Path) -> Result<HfLoadReport, ModelError> {
    let prefix = M::ENCODER_PREFIX;
    let mut store = SafetensorsStore::from_file(path)
        .with_from_adapter(PyTorchToBurnAdapter)
        .with_key_remapping(r"^bert\.", "")
        .with_key_remapping(r"^(embeddings|encoder|pooler)\.", format!("{prefix}$1."))
        .with_key_remapping(r"\.LayerNorm\.", ".layer_norm.")
        .with_key_remapping(r"\.attention\.self\.", ".attention.self_attention.")
        .allow_partial(true);
    let result = model
        .load_from(&mut store)
        .map_err(|e| ModelError::Format {
            path: path.to_path_buf(),
            detail: e.to_string(),
        })?;
    if !result.errors.is_empty() {
        return Err(ModelError::Format {
            path: path.to_path_buf(),
            detail: format!("{:?}", result.errors),
        });
    }
    Ok(HfLoadReport {
        loaded: result.applied,
        missing: result.missing.into_iter().map(|(path, _)| path).collect(),
        unused: result.unused,
    })
}

/// Saves `model` into `dir` as HuggingFace does (`model.safetensors` under
/// HuggingFace names, `config.json`), so that
/// `transformers.<Class>.from_pretrained(dir)` loads it. Only Post-LN BERT
/// exists in `transformers`: a Pre-LN model is refused.
pub fn save_hf<M: HfBert>(model: &M, config: &BertConfig, dir: &Path) -> Result<(), ModelError> {
    save_hf_with_head(model, config, &serde_json::Map::new(), dir)
}

/// `config.json` keys of a sequence classifier over `names` (in label
/// order); no names: a one-output regression head.
pub fn classifier_config_keys(names: &[&str]) -> serde_json::Map<String, serde_json::Value> {
    let mut head = serde_json::Map::new();
    if names.is_empty() {
        head.insert("num_labels".into(), 1.into());
        head.insert("problem_type".into(), "regression".into());
        return head;
    }
    let id2label: serde_json::Map<String, serde_json::Value> = names
        .iter()
        .enumerate()
        .map(|(i, name)| (i.to_string(), (*name).into()))
        .collect();
    let label2id: serde_json::Map<String, serde_json::Value> = names
        .iter()
        .enumerate()
        .map(|(i, name)| ((*name).to_string(), i.into()))
        .collect();
    head.insert("num_labels".into(), names.len().into());
    head.insert("id2label".into(), id2label.into());
    head.insert("label2id".into(), label2id.into());
    head.insert("problem_type".into(), "single_label_classification".into());
    head
}

/// [`save_hf`] with the head's keys added to `config.json` (a classifier's
/// `num_labels`, `id2label`, `label2id`, `problem_type`: without them
/// `transformers` builds a 2-label head and refuses a 3-label one's weights).
pub fn save_hf_with_head<M: HfBert>(
    model: &M,
    config: &BertConfig,
    head: &serde_json::Map<String, serde_json::Value>,
    dir: &Path,
) -> Result<(), ModelError> {
    if config.layer_norm == LayerNormPlacement::Pre
        || model.encoder().encoder.final_layer_norm.is_some()
    {
        return Err(ModelError::Config {
            field: "layer_norm",
            reason: "HuggingFace's BERT is Post-LN; a Pre-LN model has no HuggingFace form".into(),
        });
    }
    std::fs::create_dir_all(dir).map_err(|source| ModelError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let path = dir.join("model.safetensors");
    // An export replaces the previous one (a run repeated or extended in
    // the same directory); burn writes a temporary file and renames it over
    // the old one, so a reader never sees half a file.
    let mut store = SafetensorsStore::from_file(&path)
        .overwrite(true)
        .with_to_adapter(BurnToPyTorchAdapter)
        .with_key_remapping(r"\.layer_norm\.", ".LayerNorm.")
        .with_key_remapping(r"\.self_attention\.", ".self.")
        .metadata("format", "pt");
    model
        .save_into(&mut store)
        .map_err(|e| ModelError::Format {
            path: path.clone(),
            detail: e.to_string(),
        })?;
    // burn writes through a temporary file created owner-only (0600); an
    // export is for sharing, readable as any file the user writes.
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).map_err(
            |source| ModelError::Io {
                path: path.clone(),
                source,
            },
        )?;
    }
    let config_path = dir.join("config.json");
    let mut json = config.to_hf_json(M::ARCHITECTURE);
    if let Some(fields) = json.as_object_mut() {
        fields.extend(head.clone());
    }
    let text = serde_json::to_string_pretty(&json).expect("a JSON value serialises");
    // Written beside and renamed over, as the weights are.
    let partial = dir.join("config.json.partial");
    std::fs::write(&partial, text)
        .and_then(|()| std::fs::rename(&partial, &config_path))
        .map_err(|source| ModelError::Io {
            path: config_path,
            source,
        })
}

/// Rewrites the export in `dir` in bf16 (`terse export --dtype bf16`): every
/// f32 tensor of `model.safetensors` rounded to the nearest bf16 (ties to
/// even, as PyTorch's `.to(torch.bfloat16)`), the file's metadata kept, and
/// `config.json` given `"torch_dtype": "bfloat16"` so that `transformers`
/// loads it as such. The training's checkpoints stay fp32.
pub fn export_in_bf16(dir: &Path) -> Result<(), ModelError> {
    let path = dir.join("model.safetensors");
    let format = |detail: String| ModelError::Format {
        path: path.clone(),
        detail,
    };
    let bytes = std::fs::read(&path).map_err(|source| ModelError::Io {
        path: path.clone(),
        source,
    })?;
    let (_, header) =
        safetensors::SafeTensors::read_metadata(&bytes).map_err(|e| format(e.to_string()))?;
    let file = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| format(e.to_string()))?;
    let mut tensors = Vec::new();
    for (name, view) in file.tensors() {
        let (dtype, data) = match view.dtype() {
            safetensors::Dtype::F32 => (safetensors::Dtype::BF16, f32_bytes_to_bf16(view.data())),
            other => (other, view.data().to_vec()),
        };
        tensors.push((name, dtype, view.shape().to_vec(), data));
    }
    let views = tensors
        .iter()
        .map(|(name, dtype, shape, data)| {
            safetensors::tensor::TensorView::new(*dtype, shape.clone(), data)
                .map(|view| (name.clone(), view))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format(e.to_string()))?;
    // Written beside and renamed over, as the fp32 export was.
    let partial = dir.join("model.safetensors.partial");
    safetensors::serialize_to_file(views, header.metadata().clone(), &partial)
        .map_err(|e| format(e.to_string()))?;
    std::fs::rename(&partial, &path).map_err(|source| ModelError::Io {
        path: path.clone(),
        source,
    })?;
    let config_path = dir.join("config.json");
    let io = |source| ModelError::Io {
        path: config_path.clone(),
        source,
    };
    let text = std::fs::read_to_string(&config_path).map_err(io)?;
    let mut json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| ModelError::Format {
            path: config_path.clone(),
            detail: e.to_string(),
        })?;
    json["torch_dtype"] = "bfloat16".into();
    let text = serde_json::to_string_pretty(&json).expect("a JSON value serialises");
    let partial = dir.join("config.json.partial");
    std::fs::write(&partial, text)
        .and_then(|()| std::fs::rename(&partial, &config_path))
        .map_err(io)
}

/// Little-endian f32s as little-endian bf16s, each rounded to nearest,
/// ties to even (`half`'s conversion).
fn f32_bytes_to_bf16(data: &[u8]) -> Vec<u8> {
    data.chunks_exact(4)
        .flat_map(|b| {
            let x = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            half::bf16::from_f32(x).to_bits().to_le_bytes()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f32_to_bf16_rounds_to_nearest_ties_to_even() {
        // Hand-derived: bf16 keeps f32's top 16 bits; 1 + 2^-8 lies half
        // way between 1 (even) and 1 + 2^-7, 1 + 3·2^-8 half way between
        // 1 + 2^-7 (odd) and 1 + 2^-6 (even), 1 + 2^-8 + 2^-20 just above
        // the half way point.
        let cases: [(f32, u16); 5] = [
            (1.0, 0x3f80),
            (1.0 + 2f32.powi(-8), 0x3f80),
            (1.0 + 3.0 * 2f32.powi(-8), 0x3f82),
            (1.0 + 2f32.powi(-8) + 2f32.powi(-20), 0x3f81),
            (-2.5, 0xc020),
        ];
        let bytes: Vec<u8> = cases.iter().flat_map(|(x, _)| x.to_le_bytes()).collect();
        let out = f32_bytes_to_bf16(&bytes);
        for (i, (x, bits)) in cases.iter().enumerate() {
            let got = u16::from_le_bytes([out[2 * i], out[2 * i + 1]]);
            assert_eq!(got, *bits, "{x}: {got:#06x}");
        }
    }

    #[test]
    fn a_three_class_head_names_its_labels_both_ways() {
        let head = classifier_config_keys(&["contradiction", "entailment", "neutral"]);
        let json = serde_json::Value::Object(head);
        assert_eq!(json["num_labels"], 3);
        assert_eq!(json["id2label"]["2"], "neutral");
        assert_eq!(json["label2id"]["entailment"], 1);
        assert_eq!(json["problem_type"], "single_label_classification");
        let regression = serde_json::Value::Object(classifier_config_keys(&[]));
        assert_eq!(regression["num_labels"], 1);
        assert_eq!(regression["problem_type"], "regression");
    }
}
