//! Data for terse.
//!
//! This crate will hold tokenization (WordPiece through `tokenizers`), BERT
//! pre-training example creation (MLM/NSP, sharded and memory-mapped), the SQuAD
//! and GLUE readers and featurization, and the image readers, with batching per
//! rank. Today it reads IDX image files (Fashion-MNIST from Debian's
//! `dataset-fashion-mnist`), fetches files into the cache with checksums
//! ([`fetch`]), provides the pretrained MiniLM ([`minilm`]) and BERT's
//! WordPiece tokenizer ([`WordPiece`]), and reads and featurizes SQuAD v1.1
//! ([`squad`]).
#![warn(missing_docs)]

mod datasets;
mod error;
mod fashion_mnist;
pub mod fetch;
pub mod glue;
mod idx;
pub mod images;
mod manifest;
mod minilm;
pub mod pretrain;
pub mod rng;
pub mod squad;
mod tar;
mod tokenizer;

pub use datasets::{Presence, dataset, dataset_dir, ensure, presence};
pub use error::DataError;
pub use fashion_mnist::{FASHION_MNIST_DEBIAN_DIR, FashionMnist};
pub use idx::{IdxImages, read_idx_images, read_idx_labels};
pub use manifest::{FileEntry, Manifest, Source, manifest, manifests};
pub use minilm::{MiniLm, minilm};
pub use squad::{
    SquadAnswer, SquadExample, SquadFeature, SquadFeatureConfig, SquadFeaturizer, parse_squad,
    read_squad,
};
pub use tokenizer::{Encoding, SpecialIds, WordPiece};
