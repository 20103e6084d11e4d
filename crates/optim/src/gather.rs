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

use std::mem::MaybeUninit;
use std::ops::Range;
use std::slice;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::{Device, Gradients, Tensor, TensorData};

use rayon::prelude::*;

use crate::layout::{Segment, is_trainable};
use crate::parallel::CHUNK;
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
        taken: Vec::new(),
        error: None,
    };
    module.visit(&mut visitor);
    if let Some(error) = visitor.error {
        return Err(error);
    }
    // The copies run after the visit, split into chunks over the pool: the
    // visit itself is serial, and one segment (the word embeddings) holds
    // most of BERT's parameters. Each element is written once either way.
    let mut outs = crate::parallel::split_segments_mut(layout, out);
    let jobs: Vec<(&mut [f32], Option<&[f32]>)> = outs
        .iter_mut()
        .zip(&visitor.taken)
        .map(|(out, data)| {
            let values = data
                .as_ref()
                .map(|d| d.as_slice::<f32>().expect("checked in the visit"));
            (std::mem::take(out), values)
        })
        .collect();
    jobs.into_par_iter().for_each(|(out, values)| match values {
        None if overwrite => out.par_chunks_mut(CHUNK).for_each(|o| o.fill(0.0)),
        None => {}
        Some(values) => out
            .par_chunks_mut(CHUNK)
            .zip(values.par_chunks(CHUNK))
            .for_each(|(o, v)| {
                if overwrite {
                    o.copy_from_slice(v);
                } else {
                    o.iter_mut().zip(v).for_each(|(o, v)| *o += v);
                }
            }),
    });
    Ok(())
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
    // Every segment copied first, in chunks over the pool (the map below is
    // serial); the mapper then takes the copies in layout order.
    let mut copies = layout
        .segments()
        .par_iter()
        .map(|segment| parallel_copy(&flat[segment.range()]))
        .collect::<Vec<_>>()
        .into_iter();
    let mut mapper = WriteBack::new(|range: Range<usize>, device: &Device| {
        let values = copies.next().expect("one copy per segment");
        assert_eq!(values.len(), range.len());
        Tensor::from_data(TensorData::new(values, [range.len()]), device)
    });
    Ok(module.map(&mut mapper))
}

/// Each trainable parameter of `module` replaced by its range of `flat`
/// (all its trainable parameters in layout order): a slice, which shares
/// `flat`'s storage on the host as on a device. Ids and autodiff settings
/// are kept.
pub(crate) fn write_back_slices<M: Module>(
    layout: &ParamLayout,
    module: M,
    flat: &Tensor<1>,
) -> Result<M, OptimError> {
    check_layout(layout, &module)?;
    // A device buffer may run past the layout: padding, never sliced.
    let len = flat.dims()[0];
    if len < layout.len() {
        check_length("flat parameters", layout, len)?;
    }
    Ok(module.map(&mut WriteBack::new(|range, _| flat.clone().slice(range))))
}

/// The device of `module`'s first trainable parameter (without autodiff),
/// `None` when it has none.
pub(crate) fn params_device<M: Module>(module: &M) -> Option<Device> {
    struct First(Option<Device>);
    impl ModuleVisitor for First {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let tensor = param.val();
            if self.0.is_none() && is_trainable(&tensor) {
                self.0 = Some(tensor.device().inner());
            }
        }
    }
    let mut first = First(None);
    module.visit(&mut first);
    first.0
}

/// A copy of `src`, written in chunks over the pool without zeroing first.
fn parallel_copy(src: &[f32]) -> Vec<f32> {
    let mut copy = Vec::with_capacity(src.len());
    copy_to_uninit(&mut copy.spare_capacity_mut()[..src.len()], src);
    // SAFETY: `copy_to_uninit` initialised all `src.len()` elements.
    unsafe { copy.set_len(src.len()) };
    copy
}

/// `src` written into `dst` (as long), in chunks over the pool.
pub(crate) fn copy_to_uninit(dst: &mut [MaybeUninit<f32>], src: &[f32]) {
    assert_eq!(dst.len(), src.len(), "copy lengths");
    dst.par_chunks_mut(CHUNK)
        .zip(src.par_chunks(CHUNK))
        .for_each(|(dst, src)| {
            for (d, &s) in dst.iter_mut().zip(src) {
                d.write(s);
            }
        });
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
    /// Each segment's gradient in layout order (`None`: the loss did not
    /// reach it), copied out after the visit.
    taken: Vec<Option<TensorData>>,
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
        let Some(grad) = tensor.grad_remove(self.grads) else {
            self.taken.push(None);
            return;
        };
        let data = grad.into_data();
        if let Err(e) = data.as_slice::<f32>() {
            self.error = Some(OptimError::TensorData {
                path: segment.path.clone(),
                detail: format!("{e:?}"),
            });
            return;
        }
        self.taken.push(Some(data));
    }
}

/// Replaces each trainable parameter, in layout order (checked
/// beforehand), by `segment(range, device)` in its shape: its range of the
/// flat vector as a rank-1 tensor (without autodiff) on the parameter's
/// device. Ids and autodiff settings are kept.
struct WriteBack<F> {
    segment: F,
    offset: usize,
}

impl<F: FnMut(Range<usize>, &Device) -> Tensor<1>> WriteBack<F> {
    fn new(segment: F) -> Self {
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

/// `module` with every trainable parameter a new autodiff leaf over the
/// same values (no copy: on the host the storage is shared), so a backward
/// pass through it is a graph of its own. Ids and autodiff settings are
/// kept.
pub fn with_fresh_leaves<M: Module>(module: M) -> M {
    struct FreshLeaves;
    impl ModuleMapper for FreshLeaves {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
            let (id, tensor, mapper) = param.consume();
            if !is_trainable(&tensor) {
                return Param::from_mapped_value(id, tensor, mapper);
            }
            let values = tensor.clone().inner();
            Param::from_mapped_value(id, as_leaf_like(&tensor, values), mapper)
        }
    }
    module.map(&mut FreshLeaves)
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
