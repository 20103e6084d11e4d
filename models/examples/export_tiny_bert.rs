//! Writes the export fixture of `tests/minilm_hf.rs`: a small seeded
//! `BertForPreTraining` saved by terse under HuggingFace names (every
//! parameter perturbed, so a LayerNorm weight/bias swap or a missed
//! transpose shows) and the inputs to run it on. Then
//! `models/tests/fixtures/check_hf_export.py` loads it in `transformers`
//! and writes `hf_outputs.safetensors` next to it:
//!
//! ```text
//! cargo run -p terse-models --example export_tiny_bert -- models/tests/fixtures/export
//! /tmp/hfvenv/bin/python models/tests/fixtures/check_hf_export.py models/tests/fixtures/export
//! ```
//!
//! With `--classifier`, the model is a `BertForSequenceClassification` with
//! three named labels (SNLI's), its `config.json` carrying the keys a
//! fine-tuning export writes (`classifier_config_keys`), so the script loads
//! it through `AutoModelForSequenceClassification` and writes its logits:
//!
//! ```text
//! cargo run -p terse-models --example export_tiny_bert -- --classifier models/tests/fixtures/export-classifier
//! /tmp/hfvenv/bin/python models/tests/fixtures/check_hf_export.py models/tests/fixtures/export-classifier
//! ```

use std::collections::HashMap;

use burn::module::{Module, ModuleMapper, Param};
use burn::tensor::{Device, Distribution, Tensor};
use terse_models::bert::{
    BertConfig, BertForPreTraining, BertForSequenceClassification, classifier_config_keys, save_hf,
    save_hf_with_head,
};

struct Jitter;

impl ModuleMapper for Jitter {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let (id, tensor, mapper) = param.consume();
        let noise = tensor.random_like(Distribution::Uniform(-0.2, 0.2));
        Param::from_mapped_value(id, tensor + noise, mapper)
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (classifier, dir) = match args.as_slice() {
        [flag, dir] if flag == "--classifier" => (true, std::path::PathBuf::from(dir)),
        [dir] => (false, std::path::PathBuf::from(dir)),
        _ => panic!("usage: export_tiny_bert [--classifier] DIR"),
    };
    let device = Device::flex();
    device.seed(2024);
    let config = BertConfig {
        vocab_size: 200,
        hidden_size: 32,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        intermediate_size: 64,
        max_position_embeddings: 64,
        ..BertConfig::base()
    };
    if classifier {
        let labels = ["contradiction", "entailment", "neutral"];
        let model =
            BertForSequenceClassification::new(&config, labels.len(), &device).map(&mut Jitter);
        save_hf_with_head(&model, &config, &classifier_config_keys(&labels), &dir)
            .expect("saving the model");
    } else {
        let model = BertForPreTraining::new(&config, &device).map(&mut Jitter);
        save_hf(&model, &config, &dir).expect("saving the model");
    }

    // Two sequences of 10, the second a pair with two padding tokens.
    let ids: Vec<i64> = vec![
        2, 17, 45, 99, 150, 7, 3, 88, 12, 3, //
        2, 60, 61, 3, 120, 121, 122, 3, 0, 0,
    ];
    let types: Vec<i64> = vec![0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0];
    let mask: Vec<i64> = vec![1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0];
    let bytes = |v: &[i64]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let (ids, types, mask) = (bytes(&ids), bytes(&types), bytes(&mask));
    fn view(data: &[u8]) -> safetensors::tensor::TensorView<'_> {
        safetensors::tensor::TensorView::new(safetensors::Dtype::I64, vec![2, 10], data).unwrap()
    }
    let tensors = vec![
        ("input_ids", view(&ids)),
        ("token_type_ids", view(&types)),
        ("attention_mask", view(&mask)),
    ];
    safetensors::serialize_to_file(
        tensors,
        None::<HashMap<String, String>>,
        &dir.join("inputs.safetensors"),
    )
    .expect("writing the inputs");
    println!("wrote {}", dir.display());
}
