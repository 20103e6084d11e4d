//! [`FlatModel`]: the one owner of the module ↔ flat-buffer mapping. The
//! optimizer sees a module as one flat vector of its trainable parameters
//! in a [`ParamLayout`]'s order, and one gradient vector beside it; this
//! type holds both with their layout, gathers the parameters once (again
//! only when a checkpoint replaced them), adds each backward pass's
//! gradients into the reused gradient buffer, and writes the stepped
//! parameters back into the module. The trainer, the benchmarks and the
//! tests all go through it.
//!
//! Both vectors live on the host: on a GPU device each step copies the
//! gradient down and the parameters up (issue 28 moves them to the device).

use burn::module::Module;
use burn::tensor::Gradients;

use crate::gather::{add_grads_to_host, gather_params, tensor_to_host, write_back_host};
use crate::{OptimError, ParamLayout};

/// A module's trainable parameters and gradient as flat host vectors.
#[derive(Debug, Clone)]
pub struct FlatModel {
    layout: ParamLayout,
    params: Vec<f32>,
    grad: Vec<f32>,
}

impl FlatModel {
    /// The trainable parameters of `module`, gathered in its own layout,
    /// with a zero gradient.
    pub fn gather<M: Module>(module: &M) -> Result<Self, OptimError> {
        let layout = ParamLayout::from_module(module);
        let params = tensor_to_host(gather_params(&layout, module)?)?;
        let grad = vec![0.0; layout.len()];
        Ok(Self {
            layout,
            params,
            grad,
        })
    }

    /// Gathers the parameters of `module` again (a checkpoint replaced
    /// them); it must have this layout.
    pub fn regather<M: Module>(&mut self, module: &M) -> Result<(), OptimError> {
        self.params = tensor_to_host(gather_params(&self.layout, module)?)?;
        Ok(())
    }

    /// The parameters' order, shapes and segments.
    pub fn layout(&self) -> &ParamLayout {
        &self.layout
    }

    /// The parameters, in layout order.
    pub fn params(&self) -> &[f32] {
        &self.params
    }

    /// The parameters, to set in place.
    pub fn params_mut(&mut self) -> &mut [f32] {
        &mut self.params
    }

    /// The gradient, in layout order.
    pub fn grad(&self) -> &[f32] {
        &self.grad
    }

    /// The gradient, to scale or clip in place.
    pub fn grad_mut(&mut self) -> &mut [f32] {
        &mut self.grad
    }

    /// The parameters and the gradient at once, for an optimizer step.
    pub fn params_and_grad(&mut self) -> (&mut [f32], &mut [f32]) {
        (&mut self.params, &mut self.grad)
    }

    /// Adds the gradients of `module`'s parameters out of `grads` into the
    /// gradient buffer; `first` overwrites it instead (the first
    /// micro-batch of a step). A parameter the loss did not reach adds
    /// zeros.
    pub fn add_grads<M: Module>(
        &mut self,
        module: &M,
        grads: &mut Gradients,
        first: bool,
    ) -> Result<(), OptimError> {
        add_grads_to_host(&self.layout, module, grads, &mut self.grad, first)
    }

    /// Writes the parameters into `module` (each a fresh tensor on the
    /// device of the parameter it replaces, keeping its id and autodiff
    /// setting).
    pub fn write_into<M: Module>(&self, module: M) -> Result<M, OptimError> {
        write_back_host(&self.layout, module, &self.params)
    }
}
