//! SQuAD v1.1: the official JSON read into one example per question
//! ([`read_squad`]) and featurized into sliding windows over the context
//! with labels and character offsets ([`SquadFeaturizer`]), as BERT's
//! `run_squad.py` does. Mapping a model's start/end logits back to answer
//! text is `terse_eval::squad_answers`, which reads the features' offsets
//! and max-context flags.

mod cache;
mod feature_file;
mod features;
mod reader;

pub use cache::cached_features;

pub use features::{SquadFeature, SquadFeatureConfig, SquadFeaturizer};
pub use reader::{SquadAnswer, SquadExample, parse_squad, read_squad};
