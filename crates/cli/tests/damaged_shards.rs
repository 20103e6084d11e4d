//! A cached pre-training shard damaged between runs, through the `terse`
//! binary: one byte altered (within valid ranges: only its CRC-32C can
//! tell), or the file cut short. The next run names the shard, makes the
//! examples again and trains on exactly what an undamaged cache gives.
//!
//! The run's cache is private (`TERSE_CACHE` in a scratch directory, the
//! downloaded datasets linked in from the real cache), so the test damages
//! no shard another test reads.

mod common;

use common::losses;

use std::path::{Path, PathBuf};
use std::process::Command;

/// `terse pretrain` of BERT-Tiny for 2 steps with `cache` as its cache.
fn run(cache: &Path, run_dir: &Path) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_terse"))
        .env("TERSE_CACHE", cache)
        .args(["pretrain", "--no-progress", "--config"])
        .arg("configs/pretrain-bert-tiny.toml")
        .args(["--set", "train.steps=2", "--set", "train.eval_every=0"])
        .arg("--run-dir")
        .arg(run_dir)
        .current_dir(common::workspace())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{stderr}");
    stderr
}

/// A run into `run_dir` after `shard` was damaged (`what`, for the
/// printout): it names the shard, makes the examples again and trains on
/// the same ones as the undamaged run (`reference`'s losses).
fn remade(cache: &Path, shard: &Path, run_dir: &Path, what: &str, reference: &[f64]) {
    let message = run(cache, run_dir);
    println!("{what}: {}", warning(&message));
    assert!(
        message.contains(&shard.display().to_string())
            && message.contains("making the examples again"),
        "{message}"
    );
    assert_eq!(losses(run_dir), reference, "trained on other examples");
}

/// The one cached shard file of the private cache.
fn shard(cache: &Path) -> PathBuf {
    let shards: Vec<PathBuf> = std::fs::read_dir(cache.join("shards"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        // Beside each shard directory: its builders' lock file.
        .filter(|path| path.is_dir())
        .flat_map(|dir| std::fs::read_dir(dir).unwrap())
        .map(|f| f.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "shard"))
        .collect();
    assert_eq!(shards.len(), 1, "{shards:?}");
    shards.into_iter().next().unwrap()
}

#[test]
fn a_damaged_or_truncated_shard_is_named_and_made_again() {
    let scratch = tempfile::tempdir().unwrap();
    let cache = scratch.path().join("cache");
    std::fs::create_dir_all(&cache).unwrap();
    // The datasets come from the real cache (fetched there once, checked by
    // their SHA-256 on use); the shards are made here.
    let real = terse_data::fetch::cache_dir();
    for dir in ["datasets", "downloads"] {
        std::fs::create_dir_all(real.join(dir)).unwrap();
        std::os::unix::fs::symlink(real.join(dir), cache.join(dir)).unwrap();
    }
    let first = scratch.path().join("first");
    let made = run(&cache, &first);
    assert!(made.contains("making pre-training examples"), "{made}");
    let shard = shard(&cache);
    let reference = losses(&first);
    assert_eq!(reference.len(), 2);

    // One byte of a token id altered, well inside the records: a valid
    // shard in every other respect.
    let mut bytes = std::fs::read(&shard).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x01;
    std::fs::write(&shard, &bytes).unwrap();
    let altered = scratch.path().join("altered");
    remade(&cache, &shard, &altered, "an altered byte", &reference);

    // Cut short.
    let bytes = std::fs::read(&shard).unwrap();
    std::fs::write(&shard, &bytes[..bytes.len() / 3]).unwrap();
    let truncated = scratch.path().join("truncated");
    remade(&cache, &shard, &truncated, "cut to a third", &reference);
    assert_eq!(std::fs::read(&shard).unwrap().len(), bytes.len());
}

fn warning(stderr: &str) -> &str {
    stderr
        .lines()
        .find(|l| l.contains("making the examples again"))
        .unwrap_or("(none)")
}
