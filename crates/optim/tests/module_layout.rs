//! The flat layout on a real nested burn module (a transformer-style block
//! with Embedding, Linear, LayerNorm, nested structs and a Vec): paths,
//! offsets, values and ids survive a gather / write-back round trip, and the
//! written-back module trains on (a second backward pass reaches every parameter);
//! gradients copied and accumulated into the flat buffer bit for bit, with
//! zeros for a parameter the loss did not reach, on the host and on a
//! device (lavapipe); local ranks sharing one
//! copy of replicated parameters get the values of their own; a module
//! under fresh leaves (no copy) keeps its values and takes gradients of its
//! own; on a device, parameters at aligned offsets are views of the
//! (padded) flat buffer.

use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::nn::{Embedding, EmbeddingConfig, LayerNorm, LayerNormConfig, Linear, LinearConfig};
use burn::tensor::{Device, DeviceKind, Gradients, Int, Tensor, TensorData};
use std::time::Duration;

use terse_comm::{LocalComm, SingleRank};
use terse_optim::{
    AdamConfig, FlatModel, LrSchedule, OptimError, Optimizer, OptimizerConfig, ParamLayout,
    SgdConfig, with_fresh_leaves,
};

#[derive(Module, Debug)]
struct FeedForward {
    up: Linear,
    down: Linear,
}

#[derive(Module, Debug)]
struct Block {
    embedding: Embedding,
    heads: Vec<Linear>,
    norm: LayerNorm,
    feed_forward: FeedForward,
}

const VOCAB: usize = 11;
const HIDDEN: usize = 8;

fn block(device: &Device) -> Block {
    Block {
        embedding: EmbeddingConfig::new(VOCAB, HIDDEN).init(device),
        heads: (0..2)
            .map(|_| LinearConfig::new(HIDDEN, HIDDEN).init(device))
            .collect(),
        norm: LayerNormConfig::new(HIDDEN).init(device),
        feed_forward: FeedForward {
            up: LinearConfig::new(HIDDEN, 3 * HIDDEN).init(device),
            down: LinearConfig::new(3 * HIDDEN, HIDDEN).init(device),
        },
    }
}

impl Block {
    fn loss(&self, device: &Device) -> Tensor<1> {
        let tokens =
            Tensor::<2, Int>::from_data(TensorData::new(vec![1i64, 4, 9, 0, 2, 7], [2, 3]), device);
        let mut h = self.embedding.forward(tokens);
        let heads: Vec<Tensor<3>> = self.heads.iter().map(|l| l.forward(h.clone())).collect();
        for head in heads {
            h = h + head;
        }
        h = self.norm.forward(h);
        let out = self
            .feed_forward
            .down
            .forward(self.feed_forward.up.forward(h).tanh());
        (out.clone() * out).mean()
    }
}

/// Every float parameter's id and values, in visit order.
#[derive(Default)]
struct Snapshot(Vec<(ParamId, Vec<f32>, bool)>);

impl ModuleVisitor for Snapshot {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let tensor = param.val();
        let require_grad = tensor.is_require_grad();
        let values = tensor.into_data().iter::<f32>().collect();
        self.0.push((param.id, values, require_grad));
    }
}

fn snapshot(module: &Block) -> Snapshot {
    let mut s = Snapshot::default();
    module.visit(&mut s);
    s
}

const EXPECTED: [(&str, &[usize]); 10] = [
    ("embedding.weight", &[VOCAB, HIDDEN]),
    ("heads.0.weight", &[HIDDEN, HIDDEN]),
    ("heads.0.bias", &[HIDDEN]),
    ("heads.1.weight", &[HIDDEN, HIDDEN]),
    ("heads.1.bias", &[HIDDEN]),
    ("norm.gamma", &[HIDDEN]),
    ("norm.beta", &[HIDDEN]),
    ("feed_forward.up.weight", &[HIDDEN, 3 * HIDDEN]),
    ("feed_forward.up.bias", &[3 * HIDDEN]),
    ("feed_forward.down.weight", &[3 * HIDDEN, HIDDEN]),
];

#[test]
fn layout_has_paths_shapes_offsets_and_decay_in_visit_order() {
    let device = Device::flex().autodiff();
    let layout = ParamLayout::from_module(&block(&device));
    let segments = layout.segments();
    // 11 parameters: the last one, feed_forward.down.bias, is checked separately.
    assert_eq!(segments.len(), EXPECTED.len() + 1);
    let mut offset = 0;
    for (segment, (path, shape)) in segments.iter().zip(EXPECTED) {
        assert_eq!(segment.path, path);
        assert_eq!(segment.shape, shape);
        assert_eq!(segment.offset, offset);
        assert_eq!(segment.decay, shape.len() > 1, "{path}");
        offset += segment.len;
    }
    assert_eq!(segments[10].path, "feed_forward.down.bias");
    let total = VOCAB * HIDDEN
        + 2 * (HIDDEN * HIDDEN + HIDDEN)
        + 2 * HIDDEN
        + (HIDDEN * 3 * HIDDEN + 3 * HIDDEN)
        + (3 * HIDDEN * HIDDEN + HIDDEN);
    assert_eq!(layout.len(), total);
}

#[test]
fn gather_and_write_back_keep_values_ids_and_training() {
    let device = Device::flex().autodiff();
    let module = block(&device);
    let layout = ParamLayout::from_module(&module);
    let before = snapshot(&module);

    // Gathered values are the parameters, concatenated in layout order.
    let mut flat = FlatModel::gather(&module).unwrap();
    assert_eq!(flat.layout(), &layout);
    let concatenated: Vec<f32> = before.0.iter().flat_map(|(_, v, _)| v.clone()).collect();
    assert_eq!(flat.params().unwrap(), concatenated);

    // Write back 2x + 1 and check every value, id and flag.
    flat.params_mut()
        .unwrap()
        .iter_mut()
        .for_each(|v| *v = 2.0 * *v + 1.0);
    let updated = flat.params_to_host();
    let module = flat.write_into(module).unwrap();
    let after = snapshot(&module);
    assert_eq!(after.0.len(), before.0.len());
    for ((id_a, _, rg_a), (id_b, values, rg_b)) in before.0.iter().zip(&after.0) {
        assert_eq!(id_a, id_b, "ids are preserved");
        assert!(*rg_a && *rg_b, "require_grad is preserved");
        assert!(!values.is_empty());
    }
    let after_flat: Vec<f32> = after.0.iter().flat_map(|(_, v, _)| v.clone()).collect();
    assert_eq!(after_flat, updated);

    // A second forward/backward after write-back reaches every parameter.
    let mut grads: Gradients = module.loss(&device).backward();
    flat.add_grads(&module, &mut grads, true).unwrap();
    for segment in layout.segments() {
        let norm: f32 = flat.grad().unwrap()[segment.range()]
            .iter()
            .map(|g| g * g)
            .sum();
        assert!(norm > 0.0, "no gradient reached `{}`", segment.path);
    }
}

#[test]
fn local_ranks_share_one_copy_of_replicated_parameters() {
    for n in [2, 3] {
        let results = LocalComm::run(n, Duration::from_secs(60), |comm| {
            let device = Device::flex().autodiff();
            let module = block(&device);
            let mut flat = FlatModel::gather(&module).unwrap();
            // The same values on every rank, as a replicated step leaves them.
            for (i, v) in flat.params_mut().unwrap().iter_mut().enumerate() {
                *v = 0.05 * ((i % 7) as f32 - 3.0);
            }
            let own = flat.write_into(module.clone()).unwrap();
            let shared = flat.write_into_replicated(module, comm).unwrap();
            let (a, b) = (snapshot(&own), snapshot(&shared));
            assert_eq!(a.0.len(), b.0.len());
            for ((id_a, a, rg_a), (id_b, b, rg_b)) in a.0.iter().zip(&b.0) {
                assert_eq!((id_a, rg_a), (id_b, rg_b), "ids and require_grad kept");
                assert_eq!(a, b, "the values of the rank's own copy");
            }
            // The parameters, slices of one shared tensor, train on: the
            // gradients through them are those through the rank's own copy.
            let mut gradient = |module: &Block| {
                let mut grads: Gradients = module.loss(&device).backward();
                flat.add_grads(module, &mut grads, true).unwrap();
                flat.grad().unwrap().to_vec()
            };
            let (through_own, through_shared) = (gradient(&own), gradient(&shared));
            assert!(through_own.iter().any(|&g| g != 0.0));
            through_own == through_shared
        });
        for (rank, r) in results.into_iter().enumerate() {
            assert!(r.unwrap(), "{n} ranks, rank {rank}: the same gradients");
        }
    }
    // One rank: the same as write_into.
    let device = Device::flex().autodiff();
    let module = block(&device);
    let flat = FlatModel::gather(&module).unwrap();
    let own = snapshot(&flat.write_into(module.clone()).unwrap());
    let one = snapshot(
        &flat
            .write_into_replicated(module, &SingleRank::new())
            .unwrap(),
    );
    assert_eq!(
        own.0.iter().map(|p| &p.1).collect::<Vec<_>>(),
        one.0.iter().map(|p| &p.1).collect::<Vec<_>>()
    );
}

#[test]
fn fresh_leaves_keep_values_and_ids_and_take_gradients_of_their_own() {
    let device = Device::flex().autodiff();
    let module = block(&device);
    let replica = with_fresh_leaves(module.clone());
    let (a, b) = (snapshot(&module), snapshot(&replica));
    assert_eq!(a.0, b.0, "ids, values and require_grad kept");
    // A backward through the replica reaches its own leaves, not the
    // original's, with the same values.
    let mut flat = FlatModel::gather(&module).unwrap();
    let mut through_replica = replica.loss(&device).backward();
    flat.add_grads(&module, &mut through_replica, true).unwrap();
    assert!(flat.grad().unwrap().iter().all(|&g| g == 0.0));
    flat.add_grads(&replica, &mut through_replica, true)
        .unwrap();
    let from_replica = flat.grad().unwrap().to_vec();
    let mut through_original = module.loss(&device).backward();
    flat.add_grads(&module, &mut through_original, true)
        .unwrap();
    assert!(from_replica.iter().any(|&g| g != 0.0));
    assert_eq!(flat.grad().unwrap(), &from_replica[..]);
}

/// One optimizer step on a module, as the trainer takes it: the gradients
/// into a flat host buffer, a step of the host parameters, written back.
fn step<M: Module>(optimizer: &mut Optimizer, module: M, grads: &mut Gradients) -> M {
    let mut flat = FlatModel::gather(&module).unwrap();
    assert_eq!(flat.layout(), optimizer.layout());
    flat.add_grads(&module, grads, true).unwrap();
    flat.step(optimizer, &SingleRank::new()).unwrap();
    flat.write_into(module).unwrap()
}

#[test]
fn optimizer_steps_a_module_and_keeps_it_trainable() {
    let device = Device::flex().autodiff();
    device.seed(3);
    let mut module = block(&device);
    let layout = ParamLayout::from_module(&module);
    let config = OptimizerConfig::Adam(AdamConfig::default());
    let mut optimizer = Optimizer::new(
        config,
        LrSchedule::Constant { lr: 1e-2 },
        layout,
        &SingleRank::new(),
    )
    .unwrap();
    let first = module.loss(&device).into_scalar::<f32>();
    for _ in 0..20 {
        let mut grads = module.loss(&device).backward();
        module = step(&mut optimizer, module, &mut grads);
    }
    let last = module.loss(&device).into_scalar::<f32>();
    assert!(last < 0.5 * first, "loss went from {first} to {last}");
}

#[test]
fn write_back_refuses_a_module_of_another_shape() {
    let device = Device::flex();
    let flat = FlatModel::gather(&block(&device)).unwrap();
    let other = LinearConfig::new(HIDDEN, HIDDEN).init(&device);
    match flat.write_into(other) {
        Err(OptimError::LayoutMismatch { index: 0, detail }) => {
            assert!(
                detail.contains("embedding.weight") && detail.contains("`weight`"),
                "{detail}"
            )
        }
        other => panic!("expected a layout mismatch, got {other:?}"),
    }
}

/// An embedding of more than one parallel chunk (40,000 values) and a
/// linear head: the gradient copies split segments into chunks.
#[derive(Module, Debug)]
struct Wide {
    embedding: Embedding,
    head: Linear,
}

impl Wide {
    fn new(device: &Device) -> Self {
        Self {
            embedding: EmbeddingConfig::new(5000, HIDDEN).init(device),
            head: LinearConfig::new(HIDDEN, HIDDEN).init(device),
        }
    }

    fn hidden(&self, device: &Device) -> Tensor<3> {
        let tokens: Vec<i64> = (0..64).map(|i| (i * 997 % 5000) as i64).collect();
        let tokens = Tensor::<2, Int>::from_data(TensorData::new(tokens, [4, 16]), device);
        self.embedding.forward(tokens)
    }

    /// Reaches every parameter.
    fn loss(&self, device: &Device) -> Tensor<1> {
        let out = self.head.forward(self.hidden(device)).tanh();
        (out.clone() * out).mean()
    }

    /// Reaches the embedding only.
    fn embedding_loss(&self, device: &Device) -> Tensor<1> {
        let h = self.hidden(device);
        (h.clone() * h).sum()
    }
}

/// Each trainable parameter's gradient in `grads` (zeros where none),
/// concatenated in visit order: the reference the flat buffer must equal.
struct ReferenceGrads<'a> {
    grads: &'a Gradients,
    out: Vec<f32>,
}

impl ModuleVisitor for ReferenceGrads<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let tensor = param.val();
        let n: usize = tensor.dims().iter().product();
        match tensor.grad(self.grads) {
            Some(grad) => self.out.extend(grad.into_data().iter::<f32>()),
            None => self.out.extend(std::iter::repeat_n(0.0, n)),
        }
    }
}

fn reference_grads<M: Module>(module: &M, grads: &Gradients) -> Vec<f32> {
    let mut visitor = ReferenceGrads {
        grads,
        out: Vec::new(),
    };
    module.visit(&mut visitor);
    visitor.out
}

#[test]
fn gradients_are_copied_and_accumulated_exactly_with_zeros_where_none_reached() {
    let device = Device::flex().autodiff();
    gradients_are_written_exactly(&device, FlatModel::gather);
}

/// lavapipe (Vulkan on the CPU) with autodiff; `XDG_RUNTIME_DIR` must be set.
fn lavapipe() -> Device {
    assert!(
        std::env::var_os("XDG_RUNTIME_DIR").is_some(),
        "set XDG_RUNTIME_DIR (e.g. /tmp)"
    );
    Device::wgpu(DeviceKind::Cpu).autodiff()
}

/// The same on a cubecl device, where each gradient is written into its
/// range of the device's flat gradient in place (lavapipe: Vulkan on the
/// CPU; `XDG_RUNTIME_DIR` must be set).
#[test]
fn gradients_on_a_device_are_written_into_the_flat_buffer_exactly() {
    let device = lavapipe();
    gradients_are_written_exactly(&device, FlatModel::gather_on_device);
}

fn gradients_are_written_exactly(
    device: &Device,
    gather: fn(&Wide) -> Result<FlatModel, OptimError>,
) {
    device.seed(5);
    let module = Wide::new(device);
    let mut flat = gather(&module).unwrap();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();

    let full = reference_grads(&module, &module.loss(device).backward());
    let embedding_only = reference_grads(&module, &module.embedding_loss(device).backward());
    let embedding_len = 5000 * HIDDEN;
    assert!(embedding_only[embedding_len..].iter().all(|&g| g == 0.0));
    assert!(embedding_only[..embedding_len].iter().any(|&g| g != 0.0));

    // First micro-batch: the gradients, bit for bit.
    let mut grads = module.loss(device).backward();
    flat.add_grads(&module, &mut grads, true).unwrap();
    assert_eq!(bits(&flat.grad_to_host()), bits(&full));

    // Second: added element by element; the head, which this loss does
    // not reach, keeps the first micro-batch's gradient.
    let mut grads = module.embedding_loss(device).backward();
    flat.add_grads(&module, &mut grads, false).unwrap();
    let sum: Vec<f32> = full
        .iter()
        .zip(&embedding_only)
        .map(|(a, b)| a + b)
        .collect();
    assert_eq!(bits(&flat.grad_to_host()), bits(&sum));

    // Overwritten by a loss that misses the head: zeros there.
    let mut grads = module.embedding_loss(device).backward();
    flat.add_grads(&module, &mut grads, true).unwrap();
    assert_eq!(bits(&flat.grad_to_host()), bits(&embedding_only));
}

/// Parameters whose offsets and lengths are multiples of 128 f32 (512 B,
/// CUDA's alignment and more than lavapipe's), then one of 5, then one
/// whose offset that one leaves unaligned.
#[derive(Module, Debug)]
struct Aligned {
    first: Param<Tensor<1>>,
    second: Param<Tensor<1>>,
    odd: Param<Tensor<1>>,
    after: Param<Tensor<1>>,
}

impl Aligned {
    fn new(device: &Device) -> Self {
        let param = |len: usize, base: f32| {
            let values: Vec<f32> = (0..len).map(|i| base + i as f32).collect();
            Param::from_tensor(Tensor::from_data(TensorData::new(values, [len]), device))
        };
        Self {
            first: param(3 * 128, 1000.0),
            second: param(2 * 128, 2000.0),
            odd: param(5, 3000.0),
            after: param(128, 4000.0),
        }
    }

    fn loss(&self) -> Tensor<1> {
        (self.first.val().sum() + self.second.val().sum())
            + (self.odd.val().sum() + self.after.val().sum())
    }

    /// Each parameter's values, in field order.
    fn values(&self) -> Vec<Vec<f32>> {
        [&self.first, &self.second, &self.odd, &self.after]
            .map(|p| p.val().into_data().try_into_vec::<f32>().unwrap())
            .to_vec()
    }
}

/// On a device the written-back parameters are slices of the flat
/// parameter buffer, which is padded to the device's alignment: a
/// parameter whose offset and length are aligned is a view of it, so a
/// step that updates the buffer in place shows in the module written back
/// before it; the others are copies (burn copies unaligned slices) and
/// keep the values they had. Without the padding the buffer's odd total
/// length makes every slice a copy.
#[test]
fn aligned_parameters_on_a_device_are_views_of_the_flat_buffer() {
    let device = lavapipe();
    let module = Aligned::new(&device);
    let before = module.values();
    let mut flat = FlatModel::gather_on_device(&module).unwrap();
    let written = flat.write_into(module).unwrap();
    assert_eq!(written.values(), before, "written back unchanged");

    // A plain SGD step: every parameter moves by -lr · 1 in the buffer.
    let mut optimizer = Optimizer::new(
        OptimizerConfig::Sgd(SgdConfig {
            momentum: 0.0,
            weight_decay: 0.0,
            nesterov: false,
        }),
        LrSchedule::Constant { lr: 0.5 },
        flat.layout().clone(),
        &SingleRank::new(),
    )
    .unwrap();
    let mut grads = written.loss().backward();
    flat.add_grads(&written, &mut grads, true).unwrap();
    flat.step(&mut optimizer, &SingleRank::new()).unwrap();
    let stepped: Vec<Vec<f32>> = before
        .iter()
        .map(|v| v.iter().map(|x| x - 0.5).collect())
        .collect();
    assert_eq!(flat.params_to_host(), stepped.concat(), "the step");

    let seen = written.values();
    let views = [true, true, false, false];
    for (i, name) in ["first", "second", "odd", "after"].iter().enumerate() {
        let (expected, what) = match views[i] {
            true => (&stepped[i], "a view (sees the step)"),
            false => (&before[i], "a copy (keeps its values)"),
        };
        assert_eq!(&seen[i], expected, "{name} should be {what}");
    }

    // Written back again: every parameter has the step.
    let again = flat.write_into(written).unwrap();
    assert_eq!(again.values(), stepped);
}
