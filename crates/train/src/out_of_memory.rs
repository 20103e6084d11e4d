//! A device that runs out of memory, said in one line as PyTorch says it
//! ("CUDA out of memory. Tried to allocate …") instead of a panic with
//! cubecl's error chain and a backtrace.
//!
//! cubecl does not fail where an allocation fails: the kernels are queued,
//! the failure is carried by the buffers that needed the memory, and the
//! next read of device memory reports it — which burn's `into_data` turns
//! into a panic whose message holds the chain as text (burn's
//! `ExecutionError` keeps only a string). Two of cubecl's errors mean the
//! run asked for more memory than the device has: `IoError::BufferTooBig`
//! (one buffer larger than the device allows, whatever else is free) and
//! `IoError::OutOfMemory` (the device has no room left now; CUDA's and
//! Vulkan's storage report this). [`catch`] runs a rank's run and turns a
//! panic carrying either into an [`OutOfMemory`] error (the trainer's
//! `TrainError::DeviceOutOfMemory`), naming the phase (step, evaluation,
//! …), the size asked for and what to lower; any other panic unwinds as
//! before. Its panic message is not printed: the error says it.

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, PanicHookInfo};
use std::sync::Once;

use crate::rank_phase;

/// What the device could not allocate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shortage {
    /// One buffer of this many bytes is larger than any the device allows.
    BufferTooBig(u64),
    /// No room was left for an allocation of this many bytes.
    OutOfMemory(u64),
}

impl Shortage {
    /// The shortage cubecl's error text (anywhere in `message`) reports:
    /// the `Display` of `IoError::BufferTooBig` / `OutOfMemory` in cubecl
    /// 0.11 (a unit test formats both, so another wording fails it).
    pub fn find(message: &str) -> Option<Self> {
        let bytes_after = |marker: &str| {
            let at = message.find(marker)? + marker.len();
            let digits: String = message[at..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            digits.parse::<u64>().ok()
        };
        bytes_after("can't allocate buffer of size: ")
            .map(Self::BufferTooBig)
            .or_else(|| bytes_after("out of device memory allocating ").map(Self::OutOfMemory))
    }

    fn bytes(self) -> u64 {
        match self {
            Self::BufferTooBig(bytes) | Self::OutOfMemory(bytes) => bytes,
        }
    }
}

impl std::fmt::Display for Shortage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let size = gigabytes(self.bytes());
        match self {
            Self::BufferTooBig(_) => write!(
                f,
                "tried to allocate one buffer of {size}, larger than any the device allows"
            ),
            Self::OutOfMemory(_) => write!(f, "out of memory: tried to allocate {size}"),
        }
    }
}

/// `bytes` in GiB from 1 GiB on, else in MiB.
pub(crate) fn gigabytes(bytes: u64) -> String {
    if bytes >= 1 << 30 {
        format!("{:.2} GiB", bytes as f64 / f64::from(1u32 << 30))
    } else {
        format!("{:.1} MiB", bytes as f64 / f64::from(1u32 << 20))
    }
}

/// Where the shortage happened and what the run asked for there.
#[derive(Debug)]
pub struct OutOfMemory {
    /// The shortage.
    pub shortage: Shortage,
    /// The rank's phase (`rank_phase`'s words: "in step 1", …).
    pub phase: String,
    /// Whether it happened inside a step (the micro-batch's memory).
    pub in_step: bool,
    /// Whether it happened in an evaluation (its batches beside the model
    /// and the optimizer's state).
    pub evaluating: bool,
    /// The device (`train.device`).
    pub device: String,
    /// The device's memory in all, where its runtime states it.
    pub capacity: Option<u64>,
    /// `train.micro_batch`.
    pub micro_batch: usize,
}

impl std::fmt::Display for OutOfMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}, on {}", self.phase, self.device)?;
        if let Some(capacity) = self.capacity {
            write!(f, " ({} in all)", gigabytes(capacity))?;
        }
        write!(f, ": {}", self.shortage)?;
        if self.in_step {
            write!(
                f,
                ". Lower train.micro_batch (now {}): train.global_batch stays, each step \
                 accumulates more micro-batches (`--set train.micro_batch=N`)",
                self.micro_batch
            )
        } else if self.evaluating {
            write!(
                f,
                ". The evaluation's batches did not fit beside the model and the optimizer's \
                 state: the run's checkpoints are saved, and `terse eval` scores one holding \
                 no optimizer state; `--set train.eval_every=0` leaves out the evaluations \
                 during the run (the final one still runs)"
            )
        } else {
            write!(
                f,
                ". Outside a step, the model and the optimizer's state alone did not fit: a \
                 smaller model, or a device with more memory"
            )
        }
    }
}

thread_local! {
    /// Whether this thread runs inside [`catch`], which reports a shortage
    /// itself (the panic hook then stays quiet about it).
    static CATCHING: Cell<bool> = const { Cell::new(false) };
}

/// Runs `run` (rank `rank`'s run on `device` with micro-batches of
/// `micro_batch`), turning a panic that carries a device memory shortage
/// into its error `E` made from an [`OutOfMemory`], with the device's
/// memory in all from `capacity` (asked only then).
pub fn catch<R, E: From<Box<OutOfMemory>>>(
    rank: usize,
    device: &str,
    micro_batch: usize,
    capacity: impl FnOnce() -> Option<u64>,
    run: impl FnOnce() -> Result<R, E>,
) -> Result<R, E> {
    quiet_hook();
    let was = CATCHING.replace(true);
    let result = std::panic::catch_unwind(AssertUnwindSafe(run));
    CATCHING.set(was);
    match result {
        Ok(result) => result,
        Err(payload) => match message(payload.as_ref()).and_then(Shortage::find) {
            Some(shortage) => {
                let phase = rank_phase::of(rank);
                Err(E::from(Box::new(OutOfMemory {
                    shortage,
                    in_step: matches!(phase, Some(rank_phase::Phase::Step(_))),
                    evaluating: matches!(
                        phase,
                        Some(rank_phase::Phase::Evaluate(_) | rank_phase::Phase::EvaluateBefore)
                    ),
                    phase: phase.map_or_else(|| "before the run".to_string(), |p| p.to_string()),
                    device: device.to_string(),
                    capacity: capacity(),
                    micro_batch,
                })))
            }
            None => std::panic::resume_unwind(payload),
        },
    }
}

/// A panic's message, where it has one.
fn message(payload: &(dyn std::any::Any + Send)) -> Option<&str> {
    payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
}

/// Installs, once, a panic hook that prints nothing for a shortage on a
/// thread inside [`catch`] and defers to the previous hook otherwise.
fn quiet_hook() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info: &PanicHookInfo<'_>| {
            let reported = CATCHING.get()
                && message(info.payload()).is_some_and(|m| Shortage::find(m).is_some());
            if !reported {
                previous(info);
            }
        }));
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use cubecl::server::IoError;

    /// The line names the device's memory in all where its runtime states
    /// it (CUDA's `cuDeviceTotalMem`), as PyTorch's "GPU 0 has a total
    /// capacity of …" does, and leaves it out where none is stated.
    #[test]
    fn the_line_states_the_device_s_memory_where_known() {
        let line = |capacity| {
            OutOfMemory {
                shortage: Shortage::OutOfMemory(3 << 30),
                phase: "in step 7".into(),
                in_step: true,
                evaluating: false,
                device: "cuda:1".into(),
                capacity,
                micro_batch: 64,
            }
            .to_string()
        };
        assert!(
            line(Some(85_031_714_816)).starts_with(
                "in step 7, on cuda:1 (79.19 GiB in all): out of memory: tried to allocate 3.00 GiB. \
                 Lower train.micro_batch (now 64)"
            ),
            "{}",
            line(Some(85_031_714_816))
        );
        assert!(line(None).starts_with("in step 7, on cuda:1: out of memory"));
        // Out of a step, the advice fits the phase.
        let outside = |evaluating| {
            OutOfMemory {
                shortage: Shortage::OutOfMemory(3 << 30),
                phase: "evaluating after step 7".into(),
                in_step: false,
                evaluating,
                device: "cuda:1".into(),
                capacity: None,
                micro_batch: 64,
            }
            .to_string()
        };
        assert!(outside(true).contains("--set train.eval_every=0"));
        assert!(outside(false).contains("the model and the optimizer's state alone"));
    }

    /// cubecl's own errors, formatted as burn's panic carries them.
    #[test]
    fn finds_cubecl_s_two_shortages() {
        let too_big = IoError::BufferTooBig {
            size: 6_905_053_120,
            backtrace: Default::default(),
        };
        let no_room = IoError::OutOfMemory {
            size: 3 << 20,
            backtrace: Default::default(),
        };
        let chain = |e: &IoError| format!("Error while reading data: …\nCaused by:\n  {e}\n");
        assert_eq!(
            Shortage::find(&chain(&too_big)),
            Some(Shortage::BufferTooBig(6_905_053_120))
        );
        assert_eq!(
            Shortage::find(&chain(&no_room)),
            Some(Shortage::OutOfMemory(3 << 20))
        );
        assert_eq!(Shortage::find("index out of bounds: the len is 3"), None);
        assert_eq!(
            Shortage::BufferTooBig(6_905_053_120).to_string(),
            "tried to allocate one buffer of 6.43 GiB, larger than any the device allows"
        );
        assert_eq!(
            Shortage::OutOfMemory(3 << 20).to_string(),
            "out of memory: tried to allocate 3.0 MiB"
        );
    }

    #[test]
    fn a_shortage_becomes_the_error_and_other_panics_unwind() {
        // A rank no other test marks (the phase table is the process's).
        let caught = catch(
            97,
            "lavapipe",
            64,
            || None,
            || -> Result<(), Box<OutOfMemory>> {
                rank_phase::enter(97, rank_phase::Phase::Step(3));
                panic!("reading: can't allocate buffer of size: 2147483648\nNo backtrace available")
            },
        )
        .unwrap_err();
        assert_eq!(
            caught.to_string(),
            "in step 3, on lavapipe: tried to allocate one buffer of 2.00 GiB, larger than any \
             the device allows. Lower train.micro_batch (now 64): train.global_batch stays, \
             each step accumulates more micro-batches (`--set train.micro_batch=N`)"
        );
        let other = std::panic::catch_unwind(|| {
            let _ = catch(
                98,
                "lavapipe",
                64,
                || None,
                || -> Result<(), Box<OutOfMemory>> { panic!("something else") },
            );
        });
        assert!(other.is_err());
        assert!(!CATCHING.get());
    }
}
