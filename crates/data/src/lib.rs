//! Data for terse: every dataset's files fetched and verified from its
//! manifest ([`dataset`], [`manifests`], [`fetch`]), BERT's WordPiece
//! tokenizer ([`WordPiece`]) and the pretrained MiniLM ([`minilm`]); BERT
//! pre-training examples in checksummed shards ([`pretrain`]); SQuAD v1.1
//! reading and featurization ([`squad`]); the GLUE readers, their stand-ins
//! and classification inputs ([`glue`]); image readers and augmentation
//! ([`images`], with the IDX reader and Fashion-MNIST at the root); and the
//! seeded random stream all of it draws from (`terse_rng`).
#![warn(missing_docs)]

mod cache_copy;
mod datasets;
mod error;
mod feature_cache;
pub mod fetch;
pub mod glue;
mod idx;
pub mod images;
mod manifest;
mod minilm;
pub mod pretrain;
mod progress;
pub mod squad;
mod tar;
mod tokenizer;

pub use cache_copy::copy_to_cache;
pub use datasets::{Presence, dataset, dataset_dir, dataset_files, ensure, ensure_files, presence};
pub use error::DataError;
pub use feature_cache::FeatureSource;
pub use glue::{
    ClassificationFeature, GlueMetric, GlueTask, Label, ReviewSource, SentenceExample,
    encode_classification, read_glue, read_movie_reviews, read_snli, split_dev,
};
pub use idx::{IdxImages, read_idx_images, read_idx_labels};
pub use images::{Augment, CifarKind, ImageSet, read_cifar_file, read_cifar_split, read_mnist_csv};
pub use manifest::{FileEntry, Manifest, Source, manifest, manifests};
pub use minilm::{MiniLm, minilm, minilm_tokenizer};
pub use squad::{
    SquadAnswer, SquadExample, SquadFeature, SquadFeatureConfig, SquadFeaturizer, parse_squad,
    read_squad,
};
pub use tokenizer::{Encoding, SpecialIds, WordPiece};
