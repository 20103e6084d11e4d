//! `cargo xtask reproduce`: re-run one of the papers' experiments.
//!
//! Each name is one claim from the papers in `papers/` (a table, a figure, a
//! reduction factor); it will run the configs behind it and write its table,
//! plots and machine info under `results/`. Training results are issue 9;
//! communication and timing measurements are issue 10. Until then each name
//! parses and fails with [`NotImplemented`].

use anyhow::Result;
use clap::ValueEnum;

use crate::not_implemented::{ISSUE_9, ISSUE_10, NotImplemented, Tracking, cli_name};

/// Arguments of `cargo xtask reproduce`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct Args {
    /// The experiment to reproduce
    #[arg(value_enum)]
    pub name: Experiment,
}

/// An experiment from the papers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Experiment {
    /// 1-bit Adam vs Adam (Tang et al.): BERT pre-training loss curves
    OnebitAdam,
    /// 1-bit LAMB vs LAMB (Li et al.): large-batch BERT pre-training loss curves
    OnebitLamb,
    /// SLAMB (Xu et al.): final accuracy across compression ratios
    SlambRatio,
    /// Tarasov & Ershov: 1-bit Adam/LAMB divergence with ε outside the sqrt, and the fix
    EpsFix,
    /// SQuAD/GLUE scores from checkpoints pre-trained with each optimizer agree
    FinetuneParity,
    /// Bytes each optimizer sends per step against the papers' reduction factors
    CommVolume,
    /// Throughput of each optimizer as network bandwidth shrinks
    Bandwidth,
    /// Step time split into forward, backward, communication and optimizer
    StepProfile,
}

impl Experiment {
    /// The issue that will implement this experiment.
    pub fn tracking(self) -> Tracking {
        match self {
            Experiment::OnebitAdam
            | Experiment::OnebitLamb
            | Experiment::SlambRatio
            | Experiment::EpsFix
            | Experiment::FinetuneParity => Tracking::In(ISSUE_9),
            Experiment::CommVolume | Experiment::Bandwidth | Experiment::StepProfile => {
                Tracking::In(ISSUE_10)
            }
        }
    }
}

/// Runs `reproduce`: not implemented yet.
pub fn run(args: &Args) -> Result<()> {
    let command = format!("reproduce {}", cli_name(&args.name));
    Err(NotImplemented::new(command, args.name.tracking()).into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing;

    #[test]
    fn each_experiment_names_its_issue() {
        let expected = [
            ("onebit-adam", 9),
            ("onebit-lamb", 9),
            ("slamb-ratio", 9),
            ("eps-fix", 9),
            ("finetune-parity", 9),
            ("comm-volume", 10),
            ("bandwidth", 10),
            ("step-profile", 10),
        ];
        assert_eq!(expected.len(), Experiment::value_variants().len());
        for (name, issue) in expected {
            let err = testing::not_implemented(&["reproduce", name]);
            assert_eq!(err.command, format!("reproduce {name}"));
            assert_eq!(err.tracking.issue().number, issue, "{name}");
            assert!(
                err.to_string()
                    .starts_with(&format!("`reproduce {name}` is not"))
            );
        }
    }

    #[test]
    fn rejects_unknown_or_missing_experiment() {
        testing::rejection(&["reproduce"]);
        let message = testing::rejection(&["reproduce", "onebit-sgd"]);
        for valid in ["onebit-adam", "eps-fix", "comm-volume", "step-profile"] {
            assert!(message.contains(valid), "{valid} not listed:\n{message}");
        }
    }
}
