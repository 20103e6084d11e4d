//! The tied MLM decoder's weight gradient on a cubecl device (lavapipe)
//! comes out in the weight's stored layout, `[vocab, hidden]`, so the
//! flat gradient buffer takes it without a copy. Taken as `(xᵀ·∂L/∂y)ᵀ` it
//! was a transposed view, which every read (and the flat buffer's) first
//! copied whole: a 94 MB copy per BERT-base step. Its values are checked
//! against burn's ops in `device_layers.rs`.

use burn::tensor::{Tensor, TensorData};
use terse_fused as fused;
use terse_kernels::dispatches::DispatchCounter;

mod common;
use common::{contiguous_copies, lavapipe, values};

/// The only test in this binary: the dispatch counter counts the whole
/// process's launches.
#[test]
fn the_decoder_weight_gradient_is_read_without_a_copy() {
    let device = lavapipe().autodiff();
    let (rows, hidden, vocab) = (24, 16, 300);
    let tensor = |shape: [usize; 2], seed| {
        Tensor::<2>::from_data(
            TensorData::new(values(shape[0] * shape[1], seed), shape),
            &device,
        )
    };
    let x = tensor([rows, hidden], 31).require_grad();
    let table = tensor([vocab, hidden], 32).require_grad();
    let bias = Tensor::<1>::from_data(TensorData::new(values(vocab, 33), [vocab]), &device);
    let r = tensor([rows, vocab], 34);
    let y = fused::linear_transposed(x, table.clone(), bias);
    let grads = (y * r).sum().backward();

    let counter = DispatchCounter::start();
    let dw = table.grad(&grads).unwrap();
    assert_eq!(dw.dims(), [vocab, hidden]);
    let read = dw.into_data().try_to_vec::<f32>().unwrap();
    assert_eq!(read.len(), vocab * hidden);
    let copies = contiguous_copies(&counter);
    assert!(
        copies.is_empty(),
        "W's gradient was copied before it could be read: {copies:?}"
    );
}
