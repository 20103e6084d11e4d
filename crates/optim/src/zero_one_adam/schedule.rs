//! 0/1 Adam's two schedules (ALGORITHMS.md "0/1 Adam"), kept as
//! DeepSpeed's `ZeroOneAdam` keeps them: which steps of the variance stage
//! update v from the exactly averaged gradient (every `var_interval`-th
//! step, the interval doubling after every `var_update_scaler` such
//! steps), and which local steps synchronise (every
//! `local_step_interval`-th step, the interval doubling every
//! `local_step_scaler` local steps up to `local_step_clipper`).
//!
//! Both test DeepSpeed's own step count, which is terse's `t + 1`:
//! DeepSpeed's first `step()` only allocates its buffers (nothing moves)
//! yet counts, so its first update is its step 2. Testing `t + 1` keeps
//! every schedule decision on the step DeepSpeed takes it (its replay
//! feeds DeepSpeed one extra first call).

/// The counters of both schedules: part of every checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ZeroOneSchedule {
    var_update_scaler: u64,
    local_step_scaler: u64,
    local_step_clipper: u64,
    /// v is updated on steps where DeepSpeed's count is a multiple of it.
    var_interval: u64,
    /// Variance updates since the interval last doubled.
    var_counter: u64,
    /// Local steps synchronise where DeepSpeed's count is a multiple of it.
    local_interval: u64,
    /// Local steps since the interval last doubled.
    local_counter: u64,
    /// v's updates so far (its bias correction's exponent).
    variance_updates: u64,
}

/// DeepSpeed's step count of terse's step `t`.
fn deepspeed_step(t: u64) -> u64 {
    t + 1
}

impl ZeroOneSchedule {
    /// Both intervals at 1, as DeepSpeed starts them.
    pub(crate) fn new(
        var_update_scaler: u64,
        local_step_scaler: u64,
        local_step_clipper: u64,
    ) -> Self {
        Self {
            var_update_scaler,
            local_step_scaler,
            local_step_clipper,
            var_interval: 1,
            var_counter: 0,
            local_interval: 1,
            local_counter: 0,
            variance_updates: 0,
        }
    }

    /// Whether variance-stage step `t` updates v from the exactly averaged
    /// gradient (otherwise the gradient is 1-bit allreduced and only m
    /// moves).
    pub(crate) fn variance_due(&self, t: u64) -> bool {
        deepspeed_step(t).is_multiple_of(self.var_interval)
    }

    /// After variance-stage step `t`: counts a variance update, doubling
    /// the interval after `var_update_scaler` of them.
    pub(crate) fn after_variance_step(&mut self, t: u64) {
        if self.variance_due(t) {
            self.variance_updates += 1;
            self.var_counter += 1;
            if self.var_counter == self.var_update_scaler {
                self.var_counter = 0;
                self.var_interval *= 2;
            }
        }
    }

    /// Whether local step `t` ends with a synchronisation.
    pub(crate) fn sync_due(&self, t: u64) -> bool {
        deepspeed_step(t).is_multiple_of(self.local_interval)
    }

    /// After a local step: counts it, doubling the interval (up to the
    /// clipper) after `local_step_scaler` of them.
    pub(crate) fn after_local_step(&mut self) {
        self.local_counter += 1;
        if self.local_counter == self.local_step_scaler {
            self.local_counter = 0;
            self.local_interval = self.local_step_clipper.min(self.local_interval * 2);
        }
    }

    /// How many times v has been updated.
    pub(crate) fn variance_updates(&self) -> u64 {
        self.variance_updates
    }

    /// The counters, for checkpoints: `[var_interval, var_counter,
    /// local_interval, local_counter, variance_updates]`.
    pub(crate) fn counters(&self) -> Vec<f64> {
        [
            self.var_interval,
            self.var_counter,
            self.local_interval,
            self.local_counter,
            self.variance_updates,
        ]
        .map(|c| c as f64)
        .to_vec()
    }

    /// Restores [`ZeroOneSchedule::counters`].
    pub(crate) fn restore(&mut self, values: &[f64]) -> Result<(), String> {
        let counters: Vec<u64> = values
            .iter()
            .map(|&v| (v >= 0.0 && v.fract() == 0.0).then_some(v as u64))
            .collect::<Option<_>>()
            .ok_or_else(|| format!("schedule counters {values:?} are not whole numbers"))?;
        let [
            var_interval,
            var_counter,
            local_interval,
            local_counter,
            variance_updates,
        ] = counters[..]
        else {
            return Err(format!("{} schedule counters, expected 5", values.len()));
        };
        if var_interval == 0 || local_interval == 0 {
            return Err(format!("a zero interval in schedule counters {values:?}"));
        }
        *self = Self {
            var_interval,
            var_counter,
            local_interval,
            local_counter,
            variance_updates,
            ..*self
        };
        Ok(())
    }

    /// The current interval between synchronisations.
    pub(crate) fn local_interval(&self) -> u64 {
        self.local_interval
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The steps of a variance stage of `steps` steps that update v.
    fn variance_steps(scaler: u64, steps: u64) -> Vec<u64> {
        let mut s = ZeroOneSchedule::new(scaler, 1, 1);
        (1..=steps)
            .filter(|&t| {
                let due = s.variance_due(t);
                s.after_variance_step(t);
                due
            })
            .collect()
    }

    /// Hand-derived from DeepSpeed's rule with κ = 2 and terse's t =
    /// DeepSpeed's s − 1: interval 1 for s = 2, 3 (t = 1, 2); interval 2:
    /// s = 4, 6 (t = 3, 5); interval 4: s = 8, 12 (t = 7, 11); interval 8:
    /// s = 16, 24 (t = 15, 23); interval 16: s = 32 (t = 31).
    #[test]
    fn variance_updates_follow_the_doubling_schedule() {
        assert_eq!(variance_steps(2, 40), [1, 2, 3, 5, 7, 11, 15, 23, 31]);
        // κ = 16: t = 1..=16 at interval 1, then every odd t (s even) 16
        // times (17..=47), then s ≡ 0 mod 4 (t = 51, 55, …).
        let sixteen = variance_steps(16, 60);
        assert_eq!(&sixteen[..16], &(1..=16).collect::<Vec<_>>()[..]);
        assert_eq!(
            &sixteen[16..32],
            &(17..=47).step_by(2).collect::<Vec<_>>()[..]
        );
        assert_eq!(&sixteen[32..], [51, 55, 59]);
    }

    /// Hand-derived: scaler 3, clipper 4, local steps from t = 10 (s = 11).
    /// Interval 1 for t = 10, 11, 12 (all sync); interval 2 for t = 13, 14,
    /// 15 (s = 14, 16 sync: t = 13, 15); interval 4 (clipped there on) from
    /// t = 16: s = 20, 24, 28 → t = 19, 23, 27.
    #[test]
    fn local_intervals_double_and_are_clipped() {
        let mut s = ZeroOneSchedule::new(1, 3, 4);
        let syncs: Vec<u64> = (10..=28)
            .filter(|&t| {
                let due = s.sync_due(t);
                s.after_local_step();
                due
            })
            .collect();
        assert_eq!(syncs, [10, 11, 12, 13, 15, 19, 23, 27]);
        assert_eq!(s.local_interval(), 4, "clipped at local_step_clipper");
    }

    #[test]
    fn counters_round_trip_and_bad_ones_are_refused() {
        let mut a = ZeroOneSchedule::new(2, 3, 16);
        for t in 1..=9 {
            a.after_variance_step(t);
            a.after_local_step();
        }
        let mut b = ZeroOneSchedule::new(2, 3, 16);
        b.restore(&a.counters()).unwrap();
        assert_eq!(a, b);
        assert!(b.restore(&[1.0, 0.0, 2.0, 0.0]).is_err());
        assert!(b.restore(&[0.0, 0.0, 2.0, 0.0, 3.0]).is_err());
        assert!(b.restore(&[1.5, 0.0, 2.0, 0.0, 3.0]).is_err());
    }
}
