//! The command that continues a stopped run, for the line a run stopped by
//! Ctrl-C or SIGTERM ends with: the command as typed, without `--overwrite`
//! (which would delete the checkpoint just written) or an earlier
//! `--resume [CHECKPOINT]`, plus `--resume`.

/// Where a launcher (`cargo xtask`) puts the command its user typed (a
/// shell line), so the line names that command and not the `terse` binary
/// it started.
pub const LAUNCHED_AS_ENV: &str = "TERSE_LAUNCHED_AS";

/// The command line `argv` (program first) as a shell line that continues
/// the run.
pub fn resume_command(argv: &[String]) -> String {
    let mut kept = Vec::new();
    let mut args = argv.iter().peekable();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--overwrite" => {}
            "--resume" => {
                // Its optional checkpoint: the stop wrote a newer one.
                if args.peek().is_some_and(|next| !next.starts_with('-')) {
                    args.next();
                }
            }
            other if other.starts_with("--resume=") => {}
            _ => kept.push(arg.clone()),
        }
    }
    kept.push("--resume".into());
    shell_words::join(kept)
}

/// The line for this process: from the launcher's command, else from this
/// process's own.
pub fn for_this_process() -> String {
    let launched_as = std::env::var(LAUNCHED_AS_ENV)
        .ok()
        .and_then(|line| shell_words::split(&line).ok())
        .filter(|argv| !argv.is_empty());
    resume_command(&launched_as.unwrap_or_else(|| std::env::args().collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(args: &[&str]) -> String {
        let argv: Vec<String> = ["terse"]
            .iter()
            .chain(args)
            .map(|a| a.to_string())
            .collect();
        resume_command(&argv)
    }

    #[test]
    fn drops_overwrite_and_an_earlier_resume_and_quotes_what_needs_it() {
        assert_eq!(
            line(&["pretrain", "bert-tiny", "--overwrite", "--steps", "30"]),
            "terse pretrain bert-tiny --steps 30 --resume"
        );
        assert_eq!(
            line(&[
                "pretrain",
                "--resume",
                "runs/x/checkpoints/step-8",
                "--steps",
                "30"
            ]),
            "terse pretrain --steps 30 --resume"
        );
        assert_eq!(
            line(&["pretrain", "--resume", "--set", "train.seed=2"]),
            "terse pretrain --set train.seed=2 --resume"
        );
        assert_eq!(
            line(&["train", "mlp", "--set", "optimizer={ name = \"adam\" }"]),
            "terse train mlp --set 'optimizer={ name = \"adam\" }' --resume"
        );
    }
}
