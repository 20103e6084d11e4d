//! One optimizer step from a loss, as every training run takes it:
//! backward, a divergence check (a loss that is not a number ends the run
//! with an error rather than writing NaN into the weights), the optimizer's
//! step, and the progress bar's count and live loss.

use burn::module::Module;
use burn::tensor::Tensor;
use indicatif::ProgressBar;
use terse_comm::Communicator;
use terse_optim::Optimizer;

use crate::TrainError;

/// Steps `model` down `loss`; returns the new model and the loss value.
pub(crate) fn descend<M: Module>(
    model: M,
    loss: Tensor<1>,
    optimizer: &mut Optimizer,
    comm: &dyn Communicator,
    bar: &ProgressBar,
) -> Result<(M, f32), TrainError> {
    let grads = loss.backward();
    let loss = loss.into_scalar::<f32>();
    if !loss.is_finite() {
        return Err(TrainError::Diverged {
            step: optimizer.step_count() + 1,
            loss,
        });
    }
    let model = optimizer.step_module(model, &grads, comm)?.0;
    bar.inc(1);
    bar.set_message(format!("loss {loss:.4}"));
    Ok((model, loss))
}
