//! Pre-training examples from the real State of the Union addresses with
//! the real BERT vocabulary: the masking and next-sentence rates BERT
//! prescribes, byte-identical shards for the same seed, a round trip
//! through the shard reader, the shard layout byte for byte against
//! a file written independently by Python, and corrupted shards refused.

use std::path::Path;

use terse_data::pretrain::{
    MaskedLm, PretrainConfig, PretrainExample, RankShare, ShardSet, build_shards, create_examples,
    masking_vocab, read_sotu, tokenize_documents, tokenize_documents_with, write_shard,
};
use terse_data::{DataError, WordPiece, dataset, minilm};

mod tiny_shard;

use tiny_shard::tiny_examples;

/// A fresh scratch directory, removed when the returned guard drops.
fn scratch() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

fn tokenizer() -> WordPiece {
    WordPiece::from_tokenizer_json(&minilm().unwrap().tokenizer).unwrap()
}

#[test]
fn masking_and_nsp_rates_over_the_sotu_addresses() {
    let tokenizer = tokenizer();
    let special = tokenizer.special();
    // All 233 addresses (1790–2021): ~2.3M word pieces, far over 100k.
    let documents = read_sotu(&dataset("sotu").unwrap()).unwrap();
    assert_eq!(documents.len(), 233);
    let start = std::time::Instant::now();
    let tokenized = tokenize_documents(&documents, &tokenizer).unwrap();
    let tokenizing = start.elapsed().as_secs_f64();
    let config = PretrainConfig {
        dupe_factor: 1,
        seed: 12345,
        ..PretrainConfig::default()
    };
    let start = std::time::Instant::now();
    let examples = create_examples(&tokenized, &config, masking_vocab(&tokenizer)).unwrap();
    let creating = start.elapsed().as_secs_f64();

    let (mut tokens, mut selected, mut as_mask, mut unchanged, mut random) = (0, 0, 0, 0, 0);
    let mut random_next = 0;
    for e in &examples {
        assert!(e.input_ids.len() <= 128 && e.masked.positions.len() <= 20);
        // Only real tokens can be masked: [CLS] and [SEP] never.
        tokens += e.input_ids.len() - 3;
        selected += e.masked.positions.len();
        for (&p, &label) in e.masked.positions.iter().zip(&e.masked.labels) {
            assert!(label != special.cls && label != special.sep);
            let now = e.input_ids[p as usize];
            // A random replacement equal to the original (p = 1/30522)
            // counts as unchanged: a 3e-6 shift, far inside the bounds.
            if now == special.mask {
                as_mask += 1;
            } else if now == label {
                unchanged += 1;
            } else {
                random += 1;
            }
        }
        random_next += usize::from(e.is_random_next);
    }
    let share = |a: usize, b: usize| a as f64 / b as f64;
    let corpus_tokens: usize = tokenized.iter().flatten().map(Vec::len).sum();
    eprintln!(
        "{} examples from {corpus_tokens} corpus word pieces; {tokens} tokens in examples; \
         selected {:.4}, [MASK] {:.4}, unchanged {:.4}, random {:.4}, random next {:.4}; \
         tokenizing {tokenizing:.2} s, creating {creating:.2} s ({:.0} examples/s)",
        examples.len(),
        share(selected, tokens),
        share(as_mask, selected),
        share(unchanged, selected),
        share(random, selected),
        share(random_next, examples.len()),
        examples.len() as f64 / creating,
    );
    assert!(tokens >= 100_000, "{tokens}");
    assert!(examples.len() >= 15_000, "{}", examples.len());
    // Selected share: round(0.15 · len) of len − 3 maskable tokens, so 15%
    // up to rounding and the three special tokens (19 of 125 = 15.2% for a
    // full sequence; short ones deviate more, but are ~10% of examples).
    assert!((share(selected, tokens) - 0.15).abs() < 0.01);
    // 80/10/10: with n ≥ 15,000 · 15 selected positions, the sd of a 10%
    // share is √(0.09 / 225,000) = 0.0006 and of the 80% share 0.0008, so
    // ±0.01 is over 12 sd: a failure means a wrong rule, not bad luck.
    assert!((share(as_mask, selected) - 0.8).abs() < 0.01);
    assert!((share(unchanged, selected) - 0.1).abs() < 0.01);
    assert!((share(random, selected) - 0.1).abs() < 0.01);
    // NSP: n ≥ 15,000 pairs, sd √(0.25 / 15,000) = 0.0041; ±0.02 is 4.9 sd.
    assert!((share(random_next, examples.len()) - 0.5).abs() < 0.02);
}

fn read_all(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "shard"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect()
}

#[test]
fn same_seed_same_bytes_and_the_reader_returns_what_was_written() {
    let tokenizer = tokenizer();
    let all_documents = read_sotu(&dataset("sotu").unwrap()).unwrap();
    let documents = &all_documents[200..210];
    let config = PretrainConfig {
        dupe_factor: 2,
        seed: 7,
        ..PretrainConfig::default()
    };
    let (a_tmp, b_tmp, c_tmp) = (scratch(), scratch(), scratch());
    let (a, b, c) = (a_tmp.path(), b_tmp.path(), c_tmp.path());
    let summary = build_shards(documents, &tokenizer, &config, a, 3).unwrap();
    build_shards(documents, &tokenizer, &config, b, 3).unwrap();
    let other_seed = PretrainConfig {
        seed: 8,
        ..config.clone()
    };
    build_shards(documents, &tokenizer, &other_seed, c, 3).unwrap();
    assert_eq!(read_all(a), read_all(b));
    assert_ne!(read_all(a), read_all(c));
    // Tokenization, the one threaded step, gives the same ids on 1 and 3
    // threads (40 addresses: 5 blocks of 8 handed out as threads come free).
    let early = &all_documents[..40];
    let one_thread = tokenize_documents_with(early, &tokenizer, 1).unwrap();
    assert_eq!(one_thread.len(), 40);
    assert_eq!(
        one_thread,
        tokenize_documents_with(early, &tokenizer, 3).unwrap()
    );
    assert_eq!(summary.shards.len(), 3);
    assert!(a.join("pretrain.json").exists());

    // The set reads back exactly the examples creation made, in order
    // (dealt round-robin: shard s holds examples s, s + 3, …).
    let examples = create_examples(
        &tokenize_documents(documents, &tokenizer).unwrap(),
        &config,
        masking_vocab(&tokenizer),
    )
    .unwrap();
    assert_eq!(examples.len(), summary.examples);
    let set = ShardSet::open(a).unwrap();
    assert_eq!(set.len(), examples.len());
    let mut index = 0;
    for s in 0..3 {
        for (k, expected) in examples.iter().skip(s).step_by(3).enumerate() {
            assert_eq!(&set.get(index).unwrap(), expected, "shard {s}, example {k}");
            index += 1;
        }
    }
}

#[test]
fn the_layout_matches_an_independent_writer_byte_for_byte() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pretrain");
    let expected = std::fs::read(fixture.join("tiny.shard")).unwrap();
    let dir_tmp = scratch();
    let dir = dir_tmp.path();
    let written = dir.join("tiny.shard");
    write_shard(&written, &tiny_examples(), 8, 2, 30_522).unwrap();
    assert_eq!(std::fs::read(&written).unwrap(), expected);
    let set = ShardSet::open(&fixture).unwrap();
    assert_eq!(set.len(), 2);
    assert_eq!(set.get(0).unwrap(), tiny_examples()[0]);
    assert_eq!(set.get(1).unwrap(), tiny_examples()[1]);
    assert_eq!(set.get(1).unwrap().token_type_ids(), [0, 0, 0, 1, 1, 1, 1]);
}

#[test]
fn corrupted_shards_are_refused_naming_the_file_and_record() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pretrain/tiny.shard");
    let good = std::fs::read(fixture).unwrap();
    let dir_tmp = scratch();
    let dir = dir_tmp.path();
    let path = dir.join("bad.shard");
    let message = |bytes: &[u8]| -> String {
        std::fs::write(&path, bytes).unwrap();
        match terse_data::pretrain::Shard::open(&path) {
            Err(e) => e.to_string(),
            Ok(shard) => shard
                .get(1)
                .map(|_| String::new())
                .unwrap_or_else(|e| e.to_string()),
        }
    };
    // The good shard with byte `at` set to `byte`.
    let altered = |at: usize, byte: u8| {
        let mut bytes = good.clone();
        bytes[at] = byte;
        bytes
    };
    let truncated = message(&good[..100]);
    assert!(
        truncated.contains("bad.shard") && truncated.contains("truncated"),
        "{truncated}"
    );
    assert!(message(&altered(0, b'X')).contains("bad magic"));
    // Version 1 (no checksum) at bytes 8..12.
    let error = message(&altered(8, 1));
    assert!(
        error.ends_with("bad.shard: format version 1, expected 2"),
        "{error}"
    );
    // An alteration that stays within every valid range (record 0's second
    // token, 7592 at 64 + 8 + 2, becomes 7593) is caught by the checksum.
    let error = message(&altered(74, good[74].wrapping_add(1)));
    assert!(
        error.contains("bad.shard: checksum") && error.contains("the file changed"),
        "{error}"
    );
    // The record checks below guard the reader against a writer's bug: each
    // damaged file gets a checksum that matches, as such a writer would give.
    let with_crc = |mut bytes: Vec<u8>| {
        let crc = crc32c::crc32c(&bytes[64..]);
        bytes[40..44].copy_from_slice(&crc.to_le_bytes());
        bytes
    };
    // The header claims 3 examples (bytes 32..40) but holds 2 records of
    // 8 + 8·2 + 2·(2 + 2) = 32 bytes: 128 bytes, not 64 + 96 = 160.
    let error = message(&altered(32, 3));
    assert!(
        error.contains("128 bytes, but the header promises 3 records of 32 bytes after 64"),
        "{error}"
    );
    // An NSP byte other than 0 or 1 (record 1's byte 6, at 96 + 6).
    let error = message(&with_crc(altered(102, 2)));
    assert!(
        error.contains("record 1: length 7, segment A 3, 2 masked, NSP byte 2"),
        "{error}"
    );
    // Record 1 starts at 64 + 32: claim 9 tokens in an 8-token record.
    let error = message(&with_crc(altered(96, 9)));
    assert!(error.contains("bad.shard: record 1: length 9"), "{error}");
    // A masked position beyond the sequence (position slot at 96 + 8 + 16).
    let error = message(&with_crc(altered(120, 7)));
    assert!(error.contains("record 1: masked position 7"), "{error}");
    assert!(matches!(
        ShardSet::open(&dir.join("nowhere")),
        Err(DataError::Io { .. })
    ));
}

/// Example `k` of a synthetic set: distinguishable by its second token.
fn numbered(k: u32) -> PretrainExample {
    PretrainExample {
        input_ids: vec![101, 1000 + k, 102, 2000 + k, 102],
        segment_a_len: 3,
        masked: MaskedLm {
            positions: vec![3],
            labels: vec![3000 + k],
        },
        is_random_next: k % 2 == 1,
    }
}

#[test]
fn rank_shares_cover_every_example_once_and_shuffle_per_epoch() {
    // Shards of 4, 0 and 6 examples (an empty one in the middle): 10 in all.
    // The directory's prefix is how the error below is seen to name it.
    let dir_tmp = tempfile::TempDir::with_prefix("terse-pretrain-ranks-").unwrap();
    let dir = dir_tmp.path();
    let all: Vec<PretrainExample> = (0..10).map(numbered).collect();
    write_shard(&dir.join("a.shard"), &all[..4], 8, 2, 30_522).unwrap();
    write_shard(&dir.join("b.shard"), &[], 8, 2, 30_522).unwrap();
    write_shard(&dir.join("c.shard"), &all[4..], 8, 2, 30_522).unwrap();
    let set = ShardSet::open(dir).unwrap();
    assert_eq!(set.len(), 10);
    for (i, expected) in all.iter().enumerate() {
        assert_eq!(&set.get(i).unwrap(), expected, "example {i}");
    }
    let error = set.get(10).unwrap_err().to_string();
    assert!(
        error.contains("terse-pretrain-ranks")
            && error.contains("example 10 out of range (the set has 10)"),
        "{error}"
    );

    for world in 1..=4 {
        let mut seen = vec![0; 10];
        for rank in 0..world {
            let share = RankShare::new(&set, rank, world).unwrap();
            // ⌈(10 − rank) / world⌉: world 3 gives 4, 3, 3; world 4 gives 3, 3, 2, 2.
            assert_eq!(share.len(), (10 - rank).div_ceil(world));
            assert_eq!(share.steps(), 10 / world);
            for k in 0..share.len() {
                let i = share.global_index(k);
                assert_eq!(i % world, rank);
                seen[i] += 1;
                assert_eq!(share.get(k).unwrap(), all[i]);
            }
            assert!(share.get(share.len()).is_err());
            let order = share.epoch_order(5, 0);
            let mut sorted = order.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..share.len()).collect::<Vec<_>>());
            assert_eq!(order, share.epoch_order(5, 0));
        }
        assert_eq!(seen, [1; 10], "world {world}");
    }
    // 10! orders of the single share: another epoch or seed giving the same
    // one has probability 1/10! ≈ 2.8e-7.
    let share = RankShare::new(&set, 0, 1).unwrap();
    assert_ne!(share.epoch_order(5, 0), share.epoch_order(5, 1));
    assert_ne!(share.epoch_order(5, 0), share.epoch_order(6, 0));
    let error = RankShare::new(&set, 2, 2).unwrap_err().to_string();
    assert_eq!(
        error,
        "rank share: rank 2 of a world of 2: need rank < world"
    );
}

#[test]
fn large_vocabularies_take_four_byte_ids() {
    let dir_tmp = scratch();
    let dir = dir_tmp.path();
    let mut wide = numbered(0);
    wide.input_ids[1] = 99_999;
    wide.masked.labels[0] = 70_000;
    write_shard(
        &dir.join("w.shard"),
        std::slice::from_ref(&wide),
        8,
        2,
        100_000,
    )
    .unwrap();
    // 64-byte header + one record of 8 + 8 ids · 4 + 2 · (2 + 4) bytes.
    assert_eq!(
        std::fs::metadata(dir.join("w.shard")).unwrap().len(),
        64 + 52
    );
    assert_eq!(ShardSet::open(dir).unwrap().get(0).unwrap(), wide);
}

#[test]
fn the_writer_refuses_what_the_reader_would() {
    let dir_tmp = scratch();
    let dir = dir_tmp.path();
    let path = dir.join("r.shard");
    let refused = |e: PretrainExample| -> String {
        let error = write_shard(&path, &[numbered(0), e], 8, 2, 30_522)
            .unwrap_err()
            .to_string();
        // Nothing is left behind, not even the temporary file.
        assert!(std::fs::read_dir(dir).unwrap().next().is_none());
        error
    };
    let mut e = numbered(1);
    e.masked.positions[0] = 5;
    assert!(refused(e).ends_with("r.shard: example 1: masked position 5 ≥ length 5"),);
    let mut e = numbered(1);
    e.input_ids[1] = 30_522;
    assert!(refused(e).ends_with("example 1: token id 30522 ≥ vocabulary size 30522"));
    let mut e = numbered(1);
    e.segment_a_len = 5;
    assert!(refused(e).contains("example 1: segment A length 5 outside 2..5"));
    let mut e = numbered(1);
    e.input_ids.extend([7; 4]);
    assert!(refused(e).contains("example 1: length 9 (at most 8)"));
    let mut e = numbered(1);
    e.masked.labels.push(4);
    assert!(refused(e).contains("1 masked positions and 2 labels"));
}
