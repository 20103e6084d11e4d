//! The command that continues a stopped run, for the line a run stopped by
//! Ctrl-C or SIGTERM ends with: the command as typed, without `--overwrite`
//! (which would delete the checkpoint just written) or an earlier
//! `--resume [CHECKPOINT]`, plus `--resume`.

/// Where a launcher (`cargo xtask`) puts the command its user typed, its
/// words joined by [`WORD_SEPARATOR`], so the line names that command and
/// not the `terse` binary it started.
pub const LAUNCHED_AS_ENV: &str = "TERSE_LAUNCHED_AS";

/// ASCII's unit separator: no argument a user types contains it, so the
/// words need no quoting on their way through the environment.
pub const WORD_SEPARATOR: char = '\u{1f}';

/// `word` as a shell reads it back: as is when it holds only characters the
/// shell leaves alone, else in single quotes.
fn quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

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
    kept.iter().map(|w| quote(w)).collect::<Vec<_>>().join(" ")
}

/// The line for this process: from the launcher's command, else from this
/// process's own.
pub fn for_this_process() -> String {
    let argv: Vec<String> = match std::env::var(LAUNCHED_AS_ENV) {
        Ok(words) if !words.is_empty() => words.split(WORD_SEPARATOR).map(String::from).collect(),
        _ => std::env::args().collect(),
    };
    resume_command(&argv)
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
        assert_eq!(line(&["train", "it's"]), "terse train 'it'\\''s' --resume");
    }
}
