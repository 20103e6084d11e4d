//! The gradient made ready for the optimizer, after it was taken and
//! before the optimizer works in it: in fp16 every rank skips a step any
//! rank overflowed in, else the gradient is unscaled; then it is clipped
//! (`train.max_grad_norm`). On a device, what only the log needs stays
//! there until the update is queued (the squared norm), and clipping
//! without fp16 is judged and applied there (no read but the network's);
//! fp16's overflow check reads the norm, since every rank must agree on
//! skipping.

use terse_comm::Communicator;
use terse_optim::{FlatModel, QueuedSquares};

use crate::TrainError;
use crate::grad_clip::{clip_gradient, global_norm};
use crate::loss_scale::{self, LossScaler, LossScaling, Verdict};

/// What [`ready_gradient`] leaves for the step.
pub(crate) struct ReadyGradient {
    /// fp16: every rank skips this step.
    pub(crate) skip: bool,
    /// The gradient's squared norm, queued where it could be: this rank's
    /// (0 when skipped), or with [`Clipped::OnDevice`] the ranks' mean.
    pub(crate) squares: QueuedSquares,
    /// Whether and where it was clipped.
    pub(crate) clipped: Clipped,
}

/// Whether and where the gradient was clipped.
pub(crate) enum Clipped {
    /// Not clipped: the logged norm comes from the step's shared
    /// allreduce of the squared norms.
    No,
    /// Clipped on the host: its norm before clipping.
    OnHost(f64),
    /// Clipped on the device: the queued squares are the ranks' mean.
    OnDevice,
}

impl Clipped {
    /// The gradient's global norm before clipping, as logged, from the
    /// read `squares` and the step's `shared_mean` of the ranks' squares.
    pub(crate) fn norm(&self, squares: f32, shared_mean: f32) -> f64 {
        match self {
            Self::No => global_norm(shared_mean),
            Self::OnHost(norm) => *norm,
            Self::OnDevice => global_norm(squares),
        }
    }
}

/// Readies `flat`'s gradient for step `t` (see the module's text).
pub(crate) fn ready_gradient(
    flat: &mut FlatModel,
    scaler: Option<&mut LossScaler>,
    scaling: &LossScaling,
    max_grad_norm: Option<f64>,
    t: u64,
    comm: &dyn Communicator,
) -> Result<ReadyGradient, TrainError> {
    if scaler.is_none() {
        let ready = |squares, clipped| ReadyGradient {
            skip: false,
            squares,
            clipped,
        };
        match max_grad_norm {
            // Only logged: read once the update is queued.
            None => return Ok(ready(flat.queue_grad_sum_of_squares(), Clipped::No)),
            Some(max_norm) => {
                if let Some(mean) = flat.clip_grad_on_device(comm, max_norm)? {
                    return Ok(ready(mean, Clipped::OnDevice));
                }
            }
        }
    }
    let mut squares = flat.grad_sum_of_squares() as f32;
    let skip = match scaler {
        Some(scaler) => match loss_scale::judge(scaler, scaling, squares, t, comm)? {
            Verdict::Skip => {
                squares = 0.0;
                true
            }
            Verdict::Step { unscale } => {
                flat.scale_grad(unscale);
                squares *= unscale * unscale;
                false
            }
        },
        None => false,
    };
    let clipped = match max_grad_norm {
        Some(max_norm) if !skip => Clipped::OnHost(clip_gradient(
            |factor| flat.scale_grad(factor),
            squares,
            max_norm,
            comm,
        )?),
        _ => Clipped::No,
    };
    Ok(ReadyGradient {
        skip,
        squares: QueuedSquares::ready(squares.into()),
        clipped,
    })
}
