//! Moving parameters and gradients between a module and a flat host vector
//! in a [`ParamLayout`]'s order: the operations of [`crate::FlatModel`],
//! the one type every caller uses.
//!
//! The parameters are gathered once ([`gather_params`], at the start of a
//! run or after a resume): from then on the optimizer's host vector is the
//! master copy. Each step copies every gradient once, straight into its
//! segment of a reused host buffer ([`add_grads_to_host`]), and writes the
//! updated parameters back ([`write_back_host`]) with a [`ModuleMapper`]
//! that keeps each parameter's id, autodiff association, gradient
//! checkpointing and require-grad flag, so the next forward and backward
//! pass treat them as the same leaves. (Measured on BERT-base: a tensor
//! round trip — concatenate, copy to the host, slice a flat tensor — took
//! 1.4 s of a 5.7 s step.)
//!
//! Each function first checks that the module has exactly the layout's
//! parameters and names the first difference.

use std::ops::Range;
use std::slice;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::{Device, Gradients, Tensor, TensorData};

use crate::layout::{Segment, is_trainable};
use crate::{OptimError, ParamLayout};

/// The module's trainable parameters are the layout's, path and shape.
pub(crate) fn check_layout<M: Module>(layout: &ParamLayout, module: &M) -> Result<(), OptimError> {
    match layout.first_difference(&ParamLayout::from_module(module)) {
        Some((index, detail)) => Err(OptimError::LayoutMismatch { index, detail }),
        None => Ok(()),
    }
}

fn check_length(what: &'static str, layout: &ParamLayout, len: usize) -> Result<(), OptimError> {
    if len == layout.len() {
        return Ok(());
    }
    Err(OptimError::LengthMismatch {
        what,
        expected: layout.len(),
        actual: len,
    })
}

/// The trainable parameters of `module` as one flat tensor (without autodiff)
/// on the module's device, in `layout` order.
pub fn gather_params<M: Module>(layout: &ParamLayout, module: &M) -> Result<Tensor<1>, OptimError> {
    check_layout(layout, module)?;
    let mut gatherer = Gatherer { parts: Vec::new() };
    module.visit(&mut gatherer);
    let mut parts = gatherer.parts;
    Ok(match parts.len() {
        // A module without trainable parameters has no device to speak of;
        // an empty host tensor is as good as any.
        0 => Tensor::zeros([0], &burn::tensor::Device::flex()),
        1 => parts.remove(0),
        _ => Tensor::cat(parts, 0),
    })
}

/// Adds (or with `overwrite`, copies) the gradients of `module`'s trainable
/// parameters into `out` in `layout` order, taking them out of `grads`
/// (so that each moves to the host without a copy on flex). A parameter
/// that took no part in the loss contributes zeros.
pub fn add_grads_to_host<M: Module>(
    layout: &ParamLayout,
    module: &M,
    grads: &mut Gradients,
    out: &mut [f32],
    overwrite: bool,
) -> Result<(), OptimError> {
    check_length("host gradient buffer", layout, out.len())?;
    check_layout(layout, module)?;
    let mut visitor = HostGrads {
        grads,
        segments: layout.segments().iter(),
        out,
        overwrite,
        error: None,
    };
    module.visit(&mut visitor);
    visitor.error.map_or(Ok(()), Err)
}

/// Writes the host vector `flat` (in `layout` order) into `module`'s
/// trainable parameters, each a fresh tensor on its own device holding a
/// copy of its segment. On a mismatch the module is returned untouched
/// inside the error path (it is consumed only on success).
pub fn write_back_host<M: Module>(
    layout: &ParamLayout,
    module: M,
    flat: &[f32],
) -> Result<M, OptimError> {
    check_layout(layout, &module)?;
    check_length("flat parameters", layout, flat.len())?;
    let mut mapper = WriteBack::new(|range: Range<usize>, device: &Device| {
        let n = range.len();
        Tensor::from_data(TensorData::new(flat[range].to_vec(), [n]), device)
    });
    Ok(module.map(&mut mapper))
}

/// Copies a 1-D float tensor to a host vector of f32.
pub fn tensor_to_host(tensor: Tensor<1>) -> Result<Vec<f32>, OptimError> {
    tensor
        .into_data()
        .try_into_vec::<f32>()
        .map_err(|e| OptimError::TensorData {
            path: "flat".to_string(),
            detail: format!("{e:?}"),
        })
}

struct Gatherer {
    parts: Vec<Tensor<1>>,
}

impl ModuleVisitor for Gatherer {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let tensor = param.val();
        if is_trainable(&tensor) {
            let n = tensor.dims().iter().product::<usize>();
            self.parts.push(tensor.inner().reshape([n]));
        }
    }
}

/// Visits the trainable parameters in layout order (checked beforehand), so
/// each takes the next segment.
struct HostGrads<'a> {
    grads: &'a mut Gradients,
    segments: slice::Iter<'a, Segment>,
    out: &'a mut [f32],
    overwrite: bool,
    error: Option<OptimError>,
}

impl ModuleVisitor for HostGrads<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let tensor = param.val();
        if !is_trainable(&tensor) {
            return;
        }
        let segment = self.segments.next().expect("the layout was checked");
        if self.error.is_some() {
            return;
        }
        let out = &mut self.out[segment.range()];
        let Some(grad) = tensor.grad_remove(self.grads) else {
            if self.overwrite {
                out.fill(0.0);
            }
            return;
        };
        let data = grad.into_data();
        let values = match data.as_slice::<f32>() {
            Ok(values) => values,
            Err(e) => {
                self.error = Some(OptimError::TensorData {
                    path: segment.path.clone(),
                    detail: format!("{e:?}"),
                });
                return;
            }
        };
        if self.overwrite {
            out.copy_from_slice(values);
        } else {
            out.iter_mut().zip(values).for_each(|(o, v)| *o += v);
        }
    }
}

/// Replaces each trainable parameter, in layout order (checked
/// beforehand), by `segment(range, device)` in its shape: its range of the
/// flat vector as a rank-1 tensor (without autodiff) on the parameter's
/// device. Ids and autodiff settings are kept.
pub(crate) struct WriteBack<F> {
    segment: F,
    offset: usize,
}

impl<F: FnMut(Range<usize>, &Device) -> Tensor<1>> WriteBack<F> {
    pub(crate) fn new(segment: F) -> Self {
        Self { segment, offset: 0 }
    }
}

impl<F: FnMut(Range<usize>, &Device) -> Tensor<1>> ModuleMapper for WriteBack<F> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let (id, tensor, mapper) = param.consume();
        if !is_trainable(&tensor) {
            return Param::from_mapped_value(id, tensor, mapper);
        }
        let dims = tensor.dims();
        let n: usize = dims.iter().product();
        let range = self.offset..self.offset + n;
        self.offset += n;
        let values: Tensor<D> = (self.segment)(range, &tensor.device().inner()).reshape(dims);
        Param::from_mapped_value(id, as_leaf_like(&tensor, values), mapper)
    }
}

/// `values` (without autodiff) as a leaf like `old`: tracked by autodiff,
/// checkpointed and requiring gradients exactly when `old` was.
fn as_leaf_like<const D: usize>(old: &Tensor<D>, values: Tensor<D>) -> Tensor<D> {
    if !old.is_autodiff() {
        return values;
    }
    let mut leaf = Tensor::from_inner(values);
    if let Some(strategy) = old.gradient_checkpointing_strategy() {
        leaf = leaf.with_gradient_checkpointing_strategy(strategy);
    }
    if old.is_require_grad() {
        leaf = leaf.require_grad();
    }
    leaf
}
