//! The flat-buffer layout both optimizer benchmarks step over.

use terse_optim::ParamLayout;

/// BERT-base-like segment sizes: 768-row matrices and 768-element vectors,
/// about `d` elements in all (the last matrix is rounded up).
pub fn layout(d: usize) -> ParamLayout {
    let mut shapes = Vec::new();
    let mut total = 0;
    let mut i = 0;
    while total < d {
        let (rows, cols) = (768usize, 768usize.min((d - total).div_ceil(768)));
        shapes.push((format!("layer.{i}.weight"), vec![rows, cols]));
        total += rows * cols;
        if total < d {
            let n = 768.min(d - total);
            shapes.push((format!("layer.{i}.bias"), vec![n]));
            total += n;
        }
        i += 1;
    }
    ParamLayout::from_shapes(shapes)
}
