//! Counting trainable parameters: burn's `num_params` also counts running
//! statistics (BatchNorm's mean and variance are visited as float tensors),
//! which PyTorch and the papers do not. Shapes are read lazily, so counting
//! a freshly built model (even BERT-xlarge) allocates no weights.

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::Tensor;

#[derive(Default)]
struct Trainable {
    names: Vec<String>,
    count: usize,
}

impl ModuleVisitor for Trainable {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.names.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.names.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let running = matches!(
            self.names.last().map(String::as_str),
            Some("running_mean" | "running_var")
        );
        if !running {
            self.count += param.lazy_shape().num_elements();
        }
    }
}

/// Elements of the parameters that take gradients (BatchNorm's running
/// statistics excluded).
pub fn trainable_parameters<M: Module>(module: &M) -> usize {
    let mut visitor = Trainable::default();
    module.visit(&mut visitor);
    visitor.count
}
