//! Where each rank of this process is in its run: set-up, a step, a
//! checkpoint, an evaluation. A rank that waits in a collective for ranks
//! that never come names them; what it can say of *where* they were is
//! this table (local ranks share the process) or, across processes, its
//! own place (the missing ranks had not reached it).

use std::fmt;
use std::sync::Mutex;

/// A part of a rank's run, coarse enough to be marked without cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Opening the run directory's files, building the model and the
    /// optimizer (before any step).
    SetUp,
    /// Reading the checkpoint it continues from.
    Resume,
    /// The evaluation before the first step (each rank its share).
    EvaluateBefore,
    /// Inside step `t` (forward, backward, the optimizer's collectives).
    Step(u64),
    /// Writing the checkpoint of step `t`.
    Checkpoint(u64),
    /// The evaluation after step `t` (each rank its share).
    Evaluate(u64),
    /// After the last step: the final evaluation and the export.
    Finish,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::SetUp => write!(
                f,
                "setting up (run directory files, model, optimizer) before step 1"
            ),
            Self::Resume => write!(f, "loading the checkpoint it resumes from"),
            Self::EvaluateBefore => write!(f, "evaluating before step 1"),
            Self::Step(t) => write!(f, "in step {t}"),
            Self::Checkpoint(t) => write!(f, "writing the checkpoint of step {t}"),
            Self::Evaluate(t) => write!(f, "evaluating after step {t}"),
            Self::Finish => write!(f, "finishing (final evaluation, export)"),
        }
    }
}

/// Each local rank's phase, by rank (one entry per process under MPI).
static PHASES: Mutex<Vec<Option<Phase>>> = Mutex::new(Vec::new());

/// Records that `rank` entered `phase`.
pub fn enter(rank: usize, phase: Phase) {
    let mut phases = PHASES.lock().unwrap_or_else(|p| p.into_inner());
    if phases.len() <= rank {
        phases.resize(rank + 1, None);
    }
    phases[rank] = Some(phase);
}

/// Where `rank` was last seen, if it has entered any phase.
pub fn of(rank: usize) -> Option<Phase> {
    PHASES
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(rank)
        .copied()
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latest_phase_of_each_rank_is_kept() {
        // Ranks far above any other test's, so parallel tests do not meet.
        enter(901, Phase::SetUp);
        enter(903, Phase::Step(4));
        enter(901, Phase::Checkpoint(5));
        assert_eq!(of(901), Some(Phase::Checkpoint(5)));
        assert_eq!(of(902), None);
        assert_eq!(of(903).unwrap().to_string(), "in step 4");
        assert_eq!(of(4000), None);
    }
}
