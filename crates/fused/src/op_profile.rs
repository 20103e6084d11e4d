//! Where a training step's time goes, by class of op. The fused ops time
//! their own forward and backward passes into the calling thread's profile
//! when one is being recorded (`cargo xtask bench model` records one); the
//! step's remainder — residual adds, reshapes and the copies burn's
//! autodiff makes for them, gradient accumulation — is "other". Timings
//! nest: an op timed inside another class's region counts for its own class
//! only, so the classes add up to at most the step.
//!
//! Off by default: a disabled profile costs one thread-local read per op.

use std::cell::RefCell;
use std::time::Instant;

/// A class of op in the breakdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpClass {
    /// The linear layers' gemms (forward and both backward products).
    Matmul,
    /// The attention core: Q·Kᵀ, scale + mask + softmax + dropout, P·V.
    Attention,
    /// LayerNorm.
    Norm,
    /// Bias + GELU.
    Activation,
    /// Dropout outside attention.
    Dropout,
    /// Cross-entropy.
    Loss,
    /// Embedding lookups and their gradient scatter.
    Embedding,
    /// The optimizer's update of the flat parameter vector.
    Optimizer,
    /// Gathering parameters and gradients into the flat buffer and writing
    /// the parameters back (the trainer's round trip).
    FlatRoundTrip,
}

impl OpClass {
    /// Every class, in report order.
    pub const ALL: [OpClass; 9] = [
        OpClass::Matmul,
        OpClass::Attention,
        OpClass::Norm,
        OpClass::Activation,
        OpClass::Dropout,
        OpClass::Loss,
        OpClass::Embedding,
        OpClass::Optimizer,
        OpClass::FlatRoundTrip,
    ];

    /// The report's name for the class.
    pub fn name(self) -> &'static str {
        match self {
            OpClass::Matmul => "matmul",
            OpClass::Attention => "attention",
            OpClass::Norm => "norm",
            OpClass::Activation => "activation",
            OpClass::Dropout => "dropout",
            OpClass::Loss => "loss",
            OpClass::Embedding => "embedding",
            OpClass::Optimizer => "optimizer",
            OpClass::FlatRoundTrip => "flat_round_trip",
        }
    }
}

/// Seconds spent per class since [`start`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct OpTimes(pub [f64; OpClass::ALL.len()]);

impl OpTimes {
    /// Seconds spent in `class`.
    pub fn get(&self, class: OpClass) -> f64 {
        self.0[class as usize]
    }

    /// Seconds over all classes.
    pub fn total(&self) -> f64 {
        self.0.iter().sum()
    }
}

struct Recording {
    times: OpTimes,
    /// For each open region: its class and the time its nested regions took.
    open: Vec<(OpClass, f64)>,
}

thread_local! {
    static RECORDING: RefCell<Option<Recording>> = const { RefCell::new(None) };
}

/// Starts (or restarts) recording this thread's op times.
pub fn start() {
    RECORDING.with(|r| {
        *r.borrow_mut() = Some(Recording {
            times: OpTimes::default(),
            open: Vec::new(),
        })
    });
}

/// Stops recording and returns what was recorded (zeros if nothing was).
pub fn finish() -> OpTimes {
    RECORDING
        .with(|r| r.borrow_mut().take())
        .map_or_else(OpTimes::default, |r| r.times)
}

/// Runs `f`, counting its time (less that of regions nested in it) for
/// `class` when this thread is recording.
pub fn timed<R>(class: OpClass, f: impl FnOnce() -> R) -> R {
    let recording = RECORDING.with(|r| {
        let mut r = r.borrow_mut();
        let r = r.as_mut()?;
        r.open.push((class, 0.0));
        Some(())
    });
    if recording.is_none() {
        return f();
    }
    let start = Instant::now();
    let out = f();
    let elapsed = start.elapsed().as_secs_f64();
    RECORDING.with(|r| {
        if let Some(r) = r.borrow_mut().as_mut()
            && let Some((class, nested)) = r.open.pop()
        {
            r.times.0[class as usize] += elapsed - nested;
            if let Some(parent) = r.open.last_mut() {
                parent.1 += elapsed;
            }
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spin(seconds: f64) {
        let start = Instant::now();
        while start.elapsed().as_secs_f64() < seconds {}
    }

    #[test]
    fn nested_regions_count_for_their_own_class_only() {
        start();
        timed(OpClass::Attention, || {
            spin(0.02);
            timed(OpClass::Matmul, || spin(0.03));
        });
        let times = finish();
        let (attention, matmul) = (times.get(OpClass::Attention), times.get(OpClass::Matmul));
        assert!((0.03..0.045).contains(&matmul), "matmul {matmul}");
        assert!((0.02..0.035).contains(&attention), "attention {attention}");
        assert_eq!(times.get(OpClass::Norm), 0.0);
    }

    #[test]
    fn nothing_is_recorded_unless_started() {
        let _ = finish();
        timed(OpClass::Norm, || spin(0.001));
        assert_eq!(finish(), OpTimes::default());
    }
}
