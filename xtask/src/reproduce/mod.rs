//! `cargo xtask reproduce`: re-run one of the papers' experiments.
//!
//! Each name is one claim from the papers in `papers/` (a table, a figure, a
//! reduction factor). The training claims (issue 9) run their variants
//! through `terse` at a scale one machine finishes in well under an hour, with
//! N workers as local ranks, and write `results/<name>/`: table.md (the
//! numbers and whether each claim held), plot.png, metrics.jsonl (every
//! logged line, tagged by run), configs/ (each run's resolved config) and
//! machine.txt. `--quick` runs a few-minute version into `runs/` instead, a
//! smoke test of the pipeline (its loose checks pass on models that have
//! barely learned; the claims are the full runs'): the CI check. The
//! communication and timing measurements (`comm-volume`, `bandwidth`,
//! `step-profile`) run `optim_network` or `terse` one rank per host of a
//! shaped netlab network instead, and need root.

mod bandwidth;
mod comm_volume;
mod commit;
mod deepspeed_attribution;
mod deepspeed_settings;
mod eps_fix;
mod finetune_parity;
mod gates;
mod network;
mod onebit_adam;
mod onebit_lamb;
pub(crate) mod plot;
mod replay;
mod report;
pub(crate) mod runner;
mod same_settings;
mod scale_block;
mod shelf;
mod slamb_ratio;
mod step_profile;
mod zero_one_adam;
mod zero_one_schedule;
mod zero_one_step_time;

use std::cell::{OnceCell, RefCell};
use std::path::{Path, PathBuf};

use anyhow::{Result, bail};
use clap::ValueEnum;

use crate::cli_name::cli_name;
use report::Report;

/// Arguments of `cargo xtask reproduce`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct Args {
    /// The experiment to reproduce
    #[arg(value_enum)]
    pub name: Experiment,

    /// A few-minute smoke test of the pipeline (loose checks that pass on
    /// barely trained models; the claims are the full run's)
    /// (writes runs/reproduce/<name>-quick/, not results/)
    #[arg(long)]
    pub quick: bool,

    /// Train nothing: re-check the claims (and redraw the table and plots)
    /// from the committed results/<name>/metrics.jsonl and configs/, with
    /// the current claim code. The runs' machine.txt is kept.
    #[arg(long, conflicts_with = "quick")]
    pub from_results: bool,

    /// `--model`, `--device`, `--precision`, `--steps` (`onebit-adam` only).
    #[command(flatten)]
    pub scale: Scale,

    /// Print each variant's `terse` command line and run nothing: for
    /// running them on a machine without cargo (a GPU machine); their run
    /// directories, brought back with the `variant.txt` and `finished` marks
    /// the runner writes, are then reused by the same command without it
    #[arg(long, conflicts_with = "from_results")]
    pub print_commands: bool,
}

/// What `reproduce onebit-adam` trains, where the defaults are the
/// committed config's (BERT-Tiny, 1,000 steps, the CPU).
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct Scale {
    /// `onebit-adam` only: the BERT preset to pre-train instead of BERT-Tiny
    /// (`model.preset`, e.g. mini; terse checks the name); the results go to
    /// results/onebit-adam-<model>[-<device>][-<precision>][-<N>-steps]/
    #[arg(long, value_name = "PRESET")]
    pub model: Option<String>,

    /// `onebit-adam` only: where every variant trains (`train.device`: cpu,
    /// wgpu, wgpu:N, lavapipe, cuda, cuda:N)
    #[arg(long)]
    pub device: Option<String>,

    /// `onebit-adam` only: what every variant computes in
    /// (`train.precision`: fp32, tf32, bf16, fp16; the device must have it)
    #[arg(long)]
    pub precision: Option<String>,

    /// `onebit-adam` only: steps instead of 1,000 (the warmup, the freeze,
    /// the evaluations and the checkpoints keep their fractions of the run)
    #[arg(long, conflicts_with = "quick")]
    pub steps: Option<u64>,
}

impl Scale {
    fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// The suffix of the results directory: `-<model>`, `-<device>`,
    /// `-<precision>` and `-<N>-steps`, each where given.
    fn suffix(&self) -> String {
        let mut suffix = String::new();
        for part in [&self.model, &self.device, &self.precision]
            .into_iter()
            .flatten()
        {
            suffix.push('-');
            suffix.push_str(&part.replace(':', ""));
        }
        if let Some(steps) = self.steps {
            suffix.push_str(&format!("-{steps}-steps"));
        }
        suffix
    }
}

/// `--print-commands` stopped the experiment after printing its variants'
/// command lines: not a failure.
#[derive(Debug)]
pub struct PrintedCommands;

impl std::fmt::Display for PrintedCommands {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("printed the variants' command lines")
    }
}

impl std::error::Error for PrintedCommands {}

/// An experiment from the papers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Experiment {
    /// 1-bit Adam vs Adam, 1-bit Adam fp32 and naive 1-bit Adam: BERT pre-training loss
    OnebitAdam,
    /// 1-bit LAMB vs LAMB and basic 1-bit LAMB: large-batch BERT pre-training loss
    OnebitLamb,
    /// SLAMB at k = 0.5 … 0.01 beside LAMB and 1-bit LAMB: final loss and volume
    SlambRatio,
    /// Tarasov & Ershov: 1-bit Adam with ε outside the sqrt diverges, inside trains
    EpsFix,
    /// rt-polarity scores of Adam / 1-bit Adam and LAMB / 1-bit LAMB fine-tuning agree across seeds
    FinetuneParity,
    /// The same on SQuAD (F1; hours: its own experiment)
    FinetuneParitySquad,
    /// 1-bit LAMB, SLAMB k = 0.1 and 1-bit Adam against their references with DeepSpeed's settings, three seeds (hours: carried across sessions)
    DeepspeedSettings,
    /// Which of DeepSpeed's settings moved each of those claims: seed 1 with one setting at a time turned back to terse's (hours: carried across sessions)
    DeepspeedAttribution,
    /// 1-bit Adam with one scale per 2048 elements against one per chunk
    ScaleBlock,
    /// 0/1 Adam beside Adam and 1-bit Adam: loss, bytes and communication rounds
    ZeroOneAdam,
    /// Bytes each optimizer sends per step against the papers' reduction factors
    CommVolume,
    /// Throughput of each optimizer as network bandwidth shrinks
    Bandwidth,
    /// Step time split into forward, backward, communication and optimizer
    StepProfile,
}

impl Experiment {
    /// Whether a full run keeps each finished variant in its committed
    /// results until the whole experiment has run (`shelf`): the
    /// experiments longer than one session whose variants are read only for
    /// their metrics. `onebit-lamb` and the others that fine-tune from their
    /// variants' exported models are not among them: the shelf keeps no
    /// models.
    fn keeps_finished_variants(self) -> bool {
        matches!(
            self,
            Self::FinetuneParity
                | Self::FinetuneParitySquad
                | Self::DeepspeedSettings
                | Self::DeepspeedAttribution
        )
    }
}

/// One claim of a paper and whether this run bore it out.
pub struct Claim {
    /// The claim, with the numbers that decide it.
    pub text: String,
    /// Whether it held.
    pub verdict: Verdict,
}

/// What a run says about a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Holds,
    DoesNotHold,
    /// The run cannot tell: its reference did not learn clearly enough, or
    /// its evaluation set is too small for the difference in question.
    Undecided,
}

impl Claim {
    /// A claim that holds when `holds`.
    pub fn new(holds: bool, text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            verdict: if holds {
                Verdict::Holds
            } else {
                Verdict::DoesNotHold
            },
        }
    }

    /// A claim the run cannot decide.
    pub fn undecided(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            verdict: Verdict::Undecided,
        }
    }

    /// Whether it held.
    pub fn holds(&self) -> bool {
        self.verdict == Verdict::Holds
    }
}

/// What an experiment produced: the body of table.md and its claims.
pub struct Outcome {
    /// Title line of table.md.
    pub title: String,
    /// Markdown: the table(s) and notes.
    pub body: String,
    /// The claims checked.
    pub claims: Vec<Claim>,
}

/// Where an experiment runs and writes.
pub struct Context {
    /// The quick (CI) version.
    pub quick: bool,
    /// The `terse` executable, built on first use: `comm-volume` and
    /// `bandwidth` never need it, and building it costs minutes when the
    /// last build resolved the workspace's features differently.
    terse: OnceCell<PathBuf>,
    /// Parent of the variants' run directories.
    pub runs: PathBuf,
    /// `--from-results`: the committed results directory the runs are read
    /// back from instead of being run.
    pub replay: Option<PathBuf>,
    /// The output directory.
    pub report: Report,
    /// Where a full run of an experiment that keeps its finished variants
    /// in its results does so (`shelf`); `None` otherwise.
    pub shelf: Option<shelf::Shelf>,
    /// Variants reused from an earlier run in `runs/`, each with the
    /// commit it finished at (machine.txt).
    pub reused: RefCell<Vec<String>>,
    /// `--model`, `--device`, `--steps` (`onebit-adam`).
    pub scale: Scale,
    /// `--print-commands`: print the variants' command lines, run nothing.
    pub print_commands: bool,
}

impl Context {
    /// The run directory of another experiment in the same mode, for runs
    /// two experiments share (reused when its command line is identical).
    pub fn sibling(&self, experiment: &str) -> PathBuf {
        let name = if self.quick {
            format!("{experiment}-quick")
        } else {
            experiment.to_string()
        };
        self.runs.with_file_name(name)
    }

    /// The `terse` executable, built the first time it is asked for.
    pub fn terse(&self) -> Result<&Path> {
        if self.terse.get().is_none() {
            let built = crate::terse_binary::build()?;
            let _ = self.terse.set(built);
        }
        Ok(self.terse.get().expect("set above"))
    }

    /// `full` normally, `quick` under `--quick`.
    pub fn pick<T>(&self, full: T, quick: T) -> T {
        if self.quick { quick } else { full }
    }
}

/// Runs `reproduce`.
pub fn run(args: &Args) -> Result<()> {
    let scale = args.scale.clone();
    if !scale.is_default() && args.name != Experiment::OnebitAdam {
        bail!("--model, --device, --precision and --steps apply to `reproduce onebit-adam` only");
    }
    let name = format!("{}{}", cli_name(&args.name), scale.suffix());
    let mut command = format!(
        "reproduce {}{}",
        cli_name(&args.name),
        if args.quick { " --quick" } else { "" }
    );
    for (flag, value) in [
        ("--model", &scale.model),
        ("--device", &scale.device),
        ("--precision", &scale.precision),
    ] {
        if let Some(value) = value {
            command.push_str(&format!(" {flag} {value}"));
        }
    }
    if let Some(steps) = scale.steps {
        command.push_str(&format!(" --steps {steps}"));
    }
    let runs = Path::new("runs/reproduce").join(if args.quick {
        format!("{name}-quick")
    } else {
        name.clone()
    });
    let out = if args.quick {
        runs.join("report")
    } else {
        Path::new("results").join(&name)
    };
    if args.from_results && matches!(args.name, Experiment::CommVolume) {
        bail!(
            "--from-results: `{name}` has no plot and its table is its measurement; run it again"
        );
    }
    let ctx = Context {
        quick: args.quick,
        terse: OnceCell::new(),
        runs,
        replay: args.from_results.then(|| out.clone()),
        report: if args.from_results {
            Report::open(&out)?
        } else if args.print_commands {
            Report::untouched(&out)
        } else {
            Report::create(&out)?
        },
        reused: RefCell::new(Vec::new()),
        shelf: (!args.quick
            && !args.from_results
            && !args.print_commands
            && args.name.keeps_finished_variants())
        .then(|| shelf::Shelf::new(&out)),
        scale,
        print_commands: args.print_commands,
    };
    let outcome = match run_experiment(args.name, &ctx) {
        Err(e) if e.is::<PrintedCommands>() => return Ok(()),
        outcome => outcome?,
    };
    let mut table = format!("# {}\n\n`cargo xtask {command}`\n\n", outcome.title);
    if args.from_results {
        table.push_str(&format!(
            "Claims re-checked from the committed metrics by `cargo xtask {command} \
             --from-results` at commit {}; the runs themselves: machine.txt.\n\n",
            commit::commit()
        ));
    } else {
        let restored = ctx.shelf.as_ref().map(|s| s.restored()).unwrap_or_default();
        ctx.report
            .write_machine(&command, &restored, &ctx.reused.borrow())?;
        // The report now holds every variant.
        if let Some(shelf) = &ctx.shelf {
            shelf.remove()?;
        }
    }
    table.push_str("## Claims\n\n");
    for claim in &outcome.claims {
        let mark = match claim.verdict {
            Verdict::Holds => "holds",
            Verdict::DoesNotHold => "does NOT hold",
            Verdict::Undecided => "undecided",
        };
        table.push_str(&format!("- **{mark}**: {}\n", claim.text));
    }
    table.push('\n');
    table.push_str(&outcome.body);
    ctx.report.write("table.md", &table)?;
    println!("{table}");
    println!("reproduce: wrote {}", out.display());
    let failed: Vec<&Claim> = outcome.claims.iter().filter(|c| !c.holds()).collect();
    if args.quick && !failed.is_empty() {
        bail!(
            "{} claim(s) did not hold in the quick run: {}",
            failed.len(),
            failed
                .iter()
                .map(|c| c.text.as_str())
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
    Ok(())
}

fn run_experiment(name: Experiment, ctx: &Context) -> Result<Outcome> {
    match name {
        Experiment::OnebitAdam => onebit_adam::run(ctx),
        Experiment::OnebitLamb => onebit_lamb::run(ctx),
        Experiment::SlambRatio => slamb_ratio::run(ctx),
        Experiment::EpsFix => eps_fix::run(ctx),
        Experiment::FinetuneParity => finetune_parity::run(ctx),
        Experiment::FinetuneParitySquad => finetune_parity::run_squad(ctx),
        Experiment::DeepspeedSettings => deepspeed_settings::run(ctx),
        Experiment::DeepspeedAttribution => deepspeed_attribution::run(ctx),
        Experiment::ScaleBlock => scale_block::run(ctx),
        Experiment::ZeroOneAdam => zero_one_adam::run(ctx),
        Experiment::CommVolume => comm_volume::run(ctx),
        Experiment::Bandwidth => bandwidth::run(ctx),
        Experiment::StepProfile => step_profile::run(ctx),
    }
}

/// `x` with 4 significant digits.
pub fn num(x: f64) -> String {
    if x == 0.0 || !x.is_finite() {
        return format!("{x}");
    }
    let digits = (3 - x.abs().log10().floor() as i32).max(0) as usize;
    format!("{x:.digits$}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing;

    #[test]
    fn quick_flag_parses() {
        let crate::Command::Reproduce(args) =
            testing::command(&["reproduce", "onebit-adam", "--quick"])
        else {
            panic!("not reproduce");
        };
        assert!(args.quick);
        assert_eq!(args.name, Experiment::OnebitAdam);
    }

    #[test]
    fn rejects_unknown_or_missing_experiment() {
        testing::rejection(&["reproduce"]);
        let message = testing::rejection(&["reproduce", "onebit-sgd"]);
        for valid in ["onebit-adam", "eps-fix", "scale-block", "step-profile"] {
            assert!(message.contains(valid), "{valid} not listed:\n{message}");
        }
    }

    #[test]
    fn scale_flags_name_their_results_and_apply_to_onebit_adam_only() {
        let crate::Command::Reproduce(args) = testing::command(&[
            "reproduce",
            "onebit-adam",
            "--model",
            "mini",
            "--device",
            "wgpu:1",
            "--steps",
            "300",
        ]) else {
            panic!("not reproduce");
        };
        assert_eq!(args.scale.suffix(), "-mini-wgpu1-300-steps");
        assert_eq!(Scale::default().suffix(), "");
        // Refused before anything is built or written.
        for (name, flags) in [
            ("eps-fix", &["--model", "mini"][..]),
            ("onebit-lamb", &["--steps", "10"][..]),
        ] {
            let mut argv = vec!["reproduce", name];
            argv.extend(flags);
            let crate::Command::Reproduce(args) = testing::command(&argv) else {
                panic!("not reproduce");
            };
            let error = run(&args).unwrap_err().to_string();
            assert!(error.contains("`reproduce onebit-adam` only"), "{error}");
        }
        // A preset terse lacks is refused by terse itself, which knows the
        // list: tests/forwarding.rs.
        testing::rejection(&["reproduce", "onebit-adam", "--quick", "--steps", "5"]);
    }

    #[test]
    fn numbers_keep_four_significant_digits() {
        assert_eq!(num(10.3651234), "10.37");
        assert_eq!(num(0.0123456), "0.01235");
        assert_eq!(num(1234.4), "1234");
        assert_eq!(num(0.0), "0");
    }
}
