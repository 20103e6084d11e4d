//! Data for terse.
//!
//! This crate will hold tokenization (WordPiece through `tokenizers`), BERT
//! pre-training example creation (MLM/NSP, sharded and memory-mapped), the SQuAD
//! and GLUE readers and featurization, and the image readers, with batching per
//! rank. Today it reads IDX image files, which is what Fashion-MNIST (from
//! Debian's `dataset-fashion-mnist`) needs for the optimizer tests.
#![warn(missing_docs)]

mod error;
mod fashion_mnist;
mod idx;

pub use error::DataError;
pub use fashion_mnist::{FASHION_MNIST_DEBIAN_DIR, FashionMnist};
pub use idx::{IdxImages, read_idx_images, read_idx_labels};
