//! Parameter counts of the presets against the published numbers, and a
//! backward pass through each model family giving a finite gradient for
//! every parameter.

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::{Device, Distribution, Gradients, Int, Tensor, TensorData};
use terse_models::bert::{
    BertConfig, BertForPreTraining, BertForQuestionAnswering, BertForSequenceClassification,
    BertInput, BertPreset, LayerNormPlacement,
};
use terse_models::{ResnetConfig, ResnetDepth, VggConfig, VggDepth, VggHead, trainable_parameters};

fn device() -> Device {
    Device::flex().autodiff()
}

fn resnet(depth: ResnetDepth, in_channels: usize, classes: usize) -> ResnetConfig {
    ResnetConfig {
        depth,
        in_channels,
        classes,
        small_stem: false,
    }
}

fn vgg(depth: VggDepth, batch_norm: bool, head: VggHead, classes: usize) -> VggConfig {
    VggConfig {
        depth,
        batch_norm,
        head,
        in_channels: 3,
        classes,
    }
}

#[test]
fn published_parameter_counts() {
    let d = device();
    let bert = |p: BertPreset| trainable_parameters(&p.config().init(&d));
    assert_eq!(
        bert(BertPreset::Base),
        109_482_240,
        "BERT-base with pooler (109.5M)"
    );
    assert_eq!(
        bert(BertPreset::Large),
        335_141_888,
        "BERT-large with pooler (335M)"
    );
    let count = |c: ResnetConfig| trainable_parameters(&c.init(&d));
    assert_eq!(
        count(resnet(ResnetDepth::Resnet18, 3, 1000)),
        11_689_512,
        "ResNet-18"
    );
    assert_eq!(
        count(resnet(ResnetDepth::Resnet50, 3, 1000)),
        25_557_032,
        "ResNet-50"
    );
    let vgg16 = vgg(VggDepth::Vgg16, false, VggHead::Imagenet, 1000);
    assert_eq!(trainable_parameters(&vgg16.init(&d)), 138_357_544, "VGG-16");
}

/// Counts parameters without a gradient, or with a non-finite one.
struct GradCheck<'a> {
    grads: &'a Gradients,
    params: usize,
    missing: usize,
    non_finite: usize,
}

impl ModuleVisitor for GradCheck<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let tensor = param.val();
        if !tensor.is_require_grad() {
            return; // running statistics
        }
        self.params += 1;
        match tensor.grad(self.grads) {
            None => self.missing += 1,
            Some(g) => {
                if g.into_data().iter::<f32>().any(|v| !v.is_finite()) {
                    self.non_finite += 1;
                }
            }
        }
    }
}

fn assert_finite_grads<M: Module>(name: &str, model: &M, loss: Tensor<1>) {
    let value = loss.clone().into_scalar::<f32>();
    assert!(value.is_finite(), "{name}: loss {value}");
    let grads = loss.backward();
    let mut check = GradCheck {
        grads: &grads,
        params: 0,
        missing: 0,
        non_finite: 0,
    };
    model.visit(&mut check);
    assert!(check.params > 0, "{name}: no parameters");
    assert_eq!(
        (check.missing, check.non_finite),
        (0, 0),
        "{name}: of {} parameters, {} without a gradient, {} non-finite",
        check.params,
        check.missing,
        check.non_finite
    );
}

fn ints<const D: usize>(values: Vec<i64>, shape: [usize; D], d: &Device) -> Tensor<D, Int> {
    Tensor::from_data(TensorData::new(values, shape), d)
}

fn bert_input(d: &Device) -> BertInput {
    let (b, t) = (2, 12);
    let ids: Vec<i64> = (0..b * t).map(|i| (i as i64 * 37) % 500 + 1).collect();
    let types: Vec<i64> = (0..b * t).map(|i| i64::from(i % t >= 6)).collect();
    // The second sequence has two padding tokens.
    let mask: Vec<i64> = (0..b * t).map(|i| i64::from(i < b * t - 2)).collect();
    BertInput::from_rows(ids, types, mask, [b, t], d)
}

#[test]
fn every_bert_head_gives_finite_gradients_everywhere() {
    let d = device();
    d.seed(3);
    for placement in [LayerNormPlacement::Post, LayerNormPlacement::Pre] {
        let config = BertConfig {
            vocab_size: 500,
            layer_norm: placement,
            ..BertPreset::Tiny.config()
        };
        let model = BertForPreTraining::new(&config, &d);
        let out = model.forward(bert_input(&d), ints(vec![1, 5, 13, 20], [4], &d));
        assert_eq!(out.mlm_logits.dims(), [4, 500]);
        let loss = model.loss(
            &out,
            ints(vec![7, 8, 9, 10], [4], &d),
            ints(vec![0, 1], [2], &d),
        );
        assert_finite_grads(&format!("pre-training {placement:?}"), &model, loss);

        let model = BertForQuestionAnswering::new(&config, &d);
        let (start, end) = model.forward(bert_input(&d));
        assert_eq!(start.dims(), [2, 12]);
        let loss = model.loss(
            start,
            end,
            ints(vec![2, 3], [2], &d),
            ints(vec![4, 9], [2], &d),
        );
        assert_finite_grads(&format!("span QA {placement:?}"), &model, loss);

        let model = BertForSequenceClassification::new(&config, 3, &d);
        let logits = model.forward(bert_input(&d));
        let loss = model.classification_loss(logits, ints(vec![0, 2], [2], &d));
        assert_finite_grads(&format!("classification {placement:?}"), &model, loss);

        let model = BertForSequenceClassification::new(&config, 1, &d);
        let scores = model.forward(bert_input(&d));
        let targets = Tensor::<1>::from_data(TensorData::new(vec![0.5f32, 3.0], [2]), &d);
        let loss = model.regression_loss(scores, targets);
        assert_finite_grads(&format!("regression {placement:?}"), &model, loss);
    }
}

#[test]
fn resnets_and_vggs_give_finite_gradients_on_both_input_sizes() {
    let d = device();
    d.seed(5);
    let ce = burn::nn::loss::CrossEntropyLossConfig::new().init(&d);
    let labels = ints(vec![1, 7], [2], &d);
    for (channels, size) in [(1usize, 28usize), (3, 32)] {
        let x = Tensor::<4>::random(
            [2, channels, size, size],
            Distribution::Normal(0.0, 1.0),
            &d,
        );
        for depth in [
            ResnetDepth::Resnet20,
            ResnetDepth::Resnet18,
            ResnetDepth::Resnet50,
        ] {
            let model = resnet(depth, channels, 10).init(&d);
            let logits = model.forward(x.clone());
            assert_eq!(logits.dims(), [2, 10]);
            let loss = ce.forward(logits, labels.clone());
            assert_finite_grads(&format!("{depth:?} {size}x{size}"), &model, loss);
        }
        for batch_norm in [false, true] {
            let config = VggConfig {
                in_channels: channels,
                ..vgg(VggDepth::Vgg11, batch_norm, VggHead::Cifar, 10)
            };
            let model = config.init(&d);
            let loss = ce.forward(model.forward(x.clone()), labels.clone());
            assert_finite_grads(
                &format!("VGG-11 bn={batch_norm} {size}x{size}"),
                &model,
                loss,
            );
        }
    }
}

/// Every preset and vision model against PyTorch's counts
/// (`fixtures/param_counts.json`, from `fixtures/make_hf_fixtures.py`).
/// Counting is lazy: no weights are allocated, BERT-xlarge included.
#[test]
fn parameter_counts_equal_pytorch() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/param_counts.json"
    );
    let counts: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let want = |group: &str, name: &str, field: &str| {
        counts[group][name][field]
            .as_u64()
            .unwrap_or_else(|| panic!("{group}.{name}.{field} in {path}")) as usize
    };
    let d = device();
    for preset in BertPreset::ALL {
        let name = preset.name();
        let config = preset.config();
        assert_eq!(
            trainable_parameters(&config.init(&d)),
            want("bert", name, "BertModel"),
            "{name}"
        );
        assert_eq!(
            trainable_parameters(&BertForPreTraining::new(&config, &d)),
            want("bert", name, "BertForPreTraining"),
            "{name} pre-training"
        );
        if matches!(preset, BertPreset::Tiny | BertPreset::Base) {
            assert_eq!(
                trainable_parameters(&BertForQuestionAnswering::new(&config, &d)),
                want("bert", name, "BertForQuestionAnswering"),
                "{name} QA"
            );
            assert_eq!(
                trainable_parameters(&BertForSequenceClassification::new(&config, 2, &d)),
                want("bert", name, "BertForSequenceClassification_2"),
                "{name} classification"
            );
        }
    }
    let resnets = [
        ("resnet18", ResnetDepth::Resnet18, 1000),
        ("resnet34", ResnetDepth::Resnet34, 1000),
        ("resnet50", ResnetDepth::Resnet50, 1000),
        ("resnet101", ResnetDepth::Resnet101, 1000),
        ("resnet152", ResnetDepth::Resnet152, 1000),
        ("cifar_resnet20", ResnetDepth::Resnet20, 10),
        ("cifar_resnet56", ResnetDepth::Resnet56, 10),
        ("cifar_resnet110", ResnetDepth::Resnet110, 10),
    ];
    for (name, depth, classes) in resnets {
        let got = trainable_parameters(&resnet(depth, 3, classes).init(&d));
        assert_eq!(got, want("vision", name, "params"), "{name}");
    }
    let vggs = [
        ("vgg11", VggDepth::Vgg11),
        ("vgg13", VggDepth::Vgg13),
        ("vgg16", VggDepth::Vgg16),
        ("vgg19", VggDepth::Vgg19),
    ];
    for (name, depth) in vggs {
        for bn in [false, true] {
            let key = if bn {
                format!("{name}_bn")
            } else {
                name.to_string()
            };
            let got = trainable_parameters(&vgg(depth, bn, VggHead::Imagenet, 1000).init(&d));
            assert_eq!(got, want("vision", &key, "params"), "{key}");
        }
    }
    for bn in [false, true] {
        let key = if bn { "cifar_vgg16_bn" } else { "cifar_vgg16" };
        let got = trainable_parameters(&vgg(VggDepth::Vgg16, bn, VggHead::Cifar, 10).init(&d));
        assert_eq!(got, want("vision", key, "params"), "{key}");
    }
}
