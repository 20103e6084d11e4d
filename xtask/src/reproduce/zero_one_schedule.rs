//! 0/1 Adam's step kinds counted from its schedule alone, for the
//! reproduction's claims and its step-time measurement (apart from both,
//! which import it; and apart from terse's implementation, which the
//! counts check).

/// The steps of each kind a run of `steps` steps takes, by ALGORITHMS.md
/// "0/1 Adam" (written here again, apart from terse's implementation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    /// Variance steps with the gradient allreduced exactly in fp32.
    pub exact: u64,
    /// Variance steps with the gradient 1-bit compressed.
    pub compressed: u64,
    /// Local steps that end with a 1-bit allreduce.
    pub syncs: u64,
    /// Local steps that send nothing.
    pub silent: u64,
}

impl Schedule {
    /// Counts the kinds, DeepSpeed's step count being `t + 1`.
    pub fn of(steps: u64, var_freeze_step: u64, kappa: u64, scaler: u64, clipper: u64) -> Self {
        let mut out = Schedule {
            exact: 0,
            compressed: 0,
            syncs: 0,
            silent: 0,
        };
        let (mut interval, mut counter) = (1u64, 0u64);
        let (mut local_interval, mut local_counter) = (1u64, 0u64);
        for t in 1..=steps {
            let s = t + 1;
            if t <= var_freeze_step {
                if s % interval == 0 {
                    out.exact += 1;
                    counter += 1;
                    if counter == kappa {
                        counter = 0;
                        interval *= 2;
                    }
                } else {
                    out.compressed += 1;
                }
            } else {
                if s % local_interval == 0 {
                    out.syncs += 1;
                } else {
                    out.silent += 1;
                }
                local_counter += 1;
                if local_counter == scaler {
                    local_counter = 0;
                    local_interval = clipper.min(2 * local_interval);
                }
            }
        }
        out
    }

    /// Steps that communicate: the rounds.
    pub fn rounds(&self) -> u64 {
        self.exact + self.compressed + self.syncs
    }
}
