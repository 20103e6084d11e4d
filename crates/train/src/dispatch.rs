//! The one place a run config becomes its task: `[task] kind` (and, for
//! images, `[model] kind` through terse-models' registry) picks the task
//! type, which is built and handed to what the command does with it —
//! train it ([`crate::launch`]), evaluate or predict with a checkpoint.

use std::path::Path;

use terse_comm::Communicator;

use crate::tasks::{PretrainTask, SentenceTask, SquadTask, with_image_task};
use crate::{RunConfig, Task, TaskConfig, TrainError};

/// What a command does with a run's task once it is built.
pub trait TaskAction {
    /// What it returns.
    type Output;
    /// Does it with `task`.
    fn act<T: Task>(self, task: T) -> Result<Self::Output, TrainError>;

    /// Whether it trains: a task built for evaluation, prediction or export
    /// leaves out its training data (SQuAD's 88k training windows, which
    /// take longer to featurize than the dev set to evaluate).
    fn trains(&self) -> bool {
        true
    }
}

/// Builds the task `config` names and hands it to `action`. `comm` is the
/// process's communicator (data preparation done once per process, e.g.
/// pre-training shards written by rank 0); `predictions` is where a task
/// with a prediction file (SQuAD) writes it.
pub fn with_task<A: TaskAction>(
    config: &RunConfig,
    comm: &dyn Communicator,
    predictions: &Path,
    action: A,
) -> Result<A::Output, TrainError> {
    match &config.task {
        TaskConfig::Pretrain { .. } => action.act(PretrainTask::prepare(config, comm)?),
        TaskConfig::Glue { .. } => action.act(SentenceTask::prepare(config)?),
        TaskConfig::Squad { .. } => {
            let trains = action.trains();
            action.act(SquadTask::prepare(
                config,
                predictions.to_path_buf(),
                trains,
            )?)
        }
        TaskConfig::Image { .. } => with_image_task(config, action),
    }
}
