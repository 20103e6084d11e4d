//! The pretrained MiniLM through terse's BERT against HuggingFace
//! `transformers`: its safetensors load with no missing and no unused
//! encoder tensors, and the last hidden states and pooled outputs on real
//! sentences (padded, with pairs) match the reference computed once with
//! PyTorch (`models/tests/fixtures/make_hf_fixtures.py`) within 1e-4.
//! Then export: a BERT saved by terse under HuggingFace names loads in
//! `transformers`, whose outputs (`check_hf_export.py`, committed) terse
//! reproduces, and saving again gives the same tensors under the same names;
//! the same for a three-class classifier exported as fine-tuning exports it.
//!
//! Needs the MiniLM files (fetched into the cache on first use, 84 MB).

use std::path::{Path, PathBuf};

use burn::tensor::{Device, Tensor, TensorData};
use safetensors::SafeTensors;
use terse_models::bert::{
    BertConfig, BertForPreTraining, BertForQuestionAnswering, BertForSequenceClassification,
    BertInput, BertModel, classifier_config_keys, load_hf, save_hf, save_hf_with_head,
};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/tests/fixtures")
}

struct Arrays {
    bytes: Vec<u8>,
}

impl Arrays {
    fn open(path: &Path) -> Self {
        Arrays {
            bytes: std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
        }
    }

    fn get(&self, name: &str) -> (Vec<usize>, Vec<u8>) {
        let st = SafeTensors::deserialize(&self.bytes).unwrap();
        let view = st.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        (view.shape().to_vec(), view.data().to_vec())
    }

    /// Array `name` read as little-endian values of `N` bytes each.
    fn decoded<T, const N: usize>(
        &self,
        name: &str,
        from_le_bytes: fn([u8; N]) -> T,
    ) -> (Vec<usize>, Vec<T>) {
        let (shape, data) = self.get(name);
        let values = data
            .chunks_exact(N)
            .map(|b| from_le_bytes(b.try_into().unwrap()))
            .collect();
        (shape, values)
    }

    fn i64s(&self, name: &str) -> (Vec<usize>, Vec<i64>) {
        self.decoded(name, i64::from_le_bytes)
    }

    fn f32s(&self, name: &str) -> (Vec<usize>, Vec<f32>) {
        self.decoded(name, f32::from_le_bytes)
    }

    fn input(&self, device: &Device) -> BertInput {
        let (shape, ids) = self.i64s("input_ids");
        let (_, types) = self.i64s("token_type_ids");
        let (_, mask) = self.i64s("attention_mask");
        BertInput::from_rows(ids, types, mask, [shape[0], shape[1]], device)
    }
}

fn max_abs_diff<const D: usize>(got: Tensor<D>, want: &(Vec<usize>, Vec<f32>)) -> f32 {
    assert_eq!(got.dims().to_vec(), want.0);
    let got: Vec<f32> = got.into_data().iter::<f32>().collect();
    got.iter()
        .zip(&want.1)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max)
}

#[test]
fn minilm_matches_transformers() {
    let files = terse_data::minilm().unwrap();
    let device = Device::flex();
    let config = BertConfig::from_hf_json(&files.config).unwrap();
    assert_eq!(
        (
            config.num_hidden_layers,
            config.hidden_size,
            config.num_attention_heads
        ),
        (6, 384, 12)
    );
    let mut model: BertModel = config.init(&device);
    let report = load_hf(&mut model, &files.model).unwrap();
    assert!(report.missing.is_empty(), "missing: {:?}", report.missing);
    assert!(
        report.unused.iter().all(|u| u.ends_with("position_ids")),
        "unused: {:?}",
        report.unused
    );
    assert_eq!(
        report.loaded.len(),
        103,
        "every tensor of the file but position_ids"
    );

    let reference = Arrays::open(&fixtures().join("minilm_hidden.safetensors"));
    let out = model.forward(reference.input(&device));
    let hidden = max_abs_diff(out.hidden, &reference.f32s("last_hidden_state"));
    let pooled = max_abs_diff(out.pooled.unwrap(), &reference.f32s("pooler_output"));
    println!("MiniLM vs transformers: last hidden max |diff| {hidden:.2e}, pooled {pooled:.2e}");
    assert!(hidden <= 1e-4, "last hidden state differs by {hidden}");
    assert!(pooled <= 1e-4, "pooled output differs by {pooled}");
}

/// The pretrained encoder under a task head: the `bert.` prefix is added,
/// only the head is missing, and the pooler (which HuggingFace's QA model
/// does not have) is reported unused.
#[test]
fn minilm_loads_under_the_span_qa_head() {
    let files = terse_data::minilm().unwrap();
    let device = Device::flex();
    let config = BertConfig::from_hf_json(&files.config).unwrap();
    let mut qa = BertForQuestionAnswering::new(&config, &device);
    let report = load_hf(&mut qa, &files.model).unwrap();
    let mut missing = report.missing.clone();
    missing.sort();
    assert_eq!(missing, ["qa_outputs.bias", "qa_outputs.weight"]);
    assert!(report.missing_encoder("bert.").is_empty());
    let mut unused = report.unused.clone();
    unused.sort();
    assert_eq!(
        unused,
        [
            "bert.embeddings.position_ids",
            "bert.pooler.dense.bias",
            "bert.pooler.dense.weight"
        ]
    );
    let reference = Arrays::open(&fixtures().join("minilm_hidden.safetensors"));
    let hidden = qa.bert.forward(reference.input(&device)).hidden;
    let diff = max_abs_diff(hidden, &reference.f32s("last_hidden_state"));
    assert!(diff <= 1e-4, "{diff}");
}

fn tensors(path: &Path) -> Vec<(String, Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut all: Vec<_> = st
        .tensors()
        .into_iter()
        .map(|(name, view)| (name, view.shape().to_vec(), view.data().to_vec()))
        .collect();
    all.sort_by(|a, b| a.0.cmp(&b.0));
    all
}

#[test]
fn an_exported_bert_loads_in_transformers_with_the_same_outputs() {
    let dir = fixtures().join("export");
    let device = Device::flex();
    let config = BertConfig::from_hf_json(&dir.join("config.json")).unwrap();
    let mut model = BertForPreTraining::new(&config, &device);
    let report = load_hf(&mut model, &dir.join("model.safetensors")).unwrap();
    assert!(report.missing.is_empty(), "missing: {:?}", report.missing);
    assert!(report.unused.is_empty(), "unused: {:?}", report.unused);

    let hf = Arrays::open(&dir.join("hf_outputs.safetensors"));
    let inputs = Arrays::open(&dir.join("inputs.safetensors"));
    let input = inputs.input(&device);
    let [batch, seq] = input.input_ids.dims();
    let encoder = model.bert.forward(input.clone());
    let hidden = max_abs_diff(encoder.hidden, &hf.f32s("last_hidden_state"));
    let pooled = max_abs_diff(encoder.pooled.unwrap(), &hf.f32s("pooler_output"));
    // All positions through the tied MLM decoder, as transformers computes them.
    let every = Tensor::from_data(
        TensorData::new((0..(batch * seq) as i64).collect(), [batch * seq]),
        &device,
    );
    let out = model.forward(input, every);
    let (shape, logits) = hf.f32s("prediction_logits");
    let vocab = shape[2];
    let mlm = max_abs_diff(out.mlm_logits, &(vec![batch * seq, vocab], logits));
    let nsp = max_abs_diff(out.nsp_logits, &hf.f32s("seq_relationship_logits"));
    println!(
        "export vs transformers: hidden {hidden:.2e}, pooled {pooled:.2e}, MLM {mlm:.2e}, NSP {nsp:.2e}"
    );
    for (what, diff) in [
        ("hidden", hidden),
        ("pooled", pooled),
        ("mlm", mlm),
        ("nsp", nsp),
    ] {
        assert!(diff <= 1e-4, "{what} differs by {diff}");
    }

    // Saving the loaded model again writes the same tensors under the same
    // names, replacing what an earlier export left in the directory (a run
    // repeated in its run directory).
    let scratch = tempfile::tempdir().unwrap();
    let out_dir = scratch.path();
    std::fs::write(out_dir.join("model.safetensors"), b"an earlier export").unwrap();
    save_hf(&model, &config, out_dir).unwrap();
    assert_eq!(
        tensors(&out_dir.join("model.safetensors")),
        tensors(&dir.join("model.safetensors"))
    );
}

/// A fine-tuned classifier with three named labels, exported as a fine-tuning
/// run exports it (`save_hf_with_head` with `classifier_config_keys`), loads
/// through `transformers`' `AutoModelForSequenceClassification` with strict
/// keys and its three labels (`check_hf_export.py`, committed with its
/// outputs), and gives the logits transformers gives.
#[test]
fn a_three_class_export_loads_in_transformers_with_the_same_logits() {
    let dir = fixtures().join("export-classifier");
    let device = Device::flex();
    let config = BertConfig::from_hf_json(&dir.join("config.json")).unwrap();
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let labels: Vec<&str> = (0..written["num_labels"].as_u64().unwrap())
        .map(|i| written["id2label"][i.to_string()].as_str().unwrap())
        .collect();
    assert_eq!(labels, ["contradiction", "entailment", "neutral"]);
    let mut model = BertForSequenceClassification::new(&config, labels.len(), &device);
    let report = load_hf(&mut model, &dir.join("model.safetensors")).unwrap();
    assert!(report.missing.is_empty(), "missing: {:?}", report.missing);
    assert!(report.unused.is_empty(), "unused: {:?}", report.unused);

    let hf = Arrays::open(&dir.join("hf_outputs.safetensors"));
    let inputs = Arrays::open(&dir.join("inputs.safetensors"));
    let logits = model.forward(inputs.input(&device));
    let want = hf.f32s("logits");
    assert_eq!(want.0, [2, 3]);
    let diff = max_abs_diff(logits, &want);
    println!("3-class export vs transformers: logits {diff:.2e}");
    assert!(diff <= 1e-4, "logits differ by {diff}");

    // Exporting again as a fine-tuning run does writes what transformers
    // loaded: the same tensors and the same config.json.
    let scratch = tempfile::tempdir().unwrap();
    save_hf_with_head(
        &model,
        &config,
        &classifier_config_keys(&labels),
        scratch.path(),
    )
    .unwrap();
    assert_eq!(
        tensors(&scratch.path().join("model.safetensors")),
        tensors(&dir.join("model.safetensors"))
    );
    let again: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(scratch.path().join("config.json")).unwrap())
            .unwrap();
    assert_eq!(again, written);
}
