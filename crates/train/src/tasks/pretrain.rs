//! BERT pre-training (masked LM + next sentence) on a real corpus.
//!
//! The examples are made once per (corpus, sequence length, dupe factor,
//! seed, tokenizer) by rank 0 into the cache (`shards/<key>/`, written to a
//! temporary directory and renamed) while the other ranks wait at a
//! barrier; then every rank reads the same files (checksummed). The last
//! `held_out` examples are never trained on: evaluation reports the loss and
//! masked-LM accuracy there.

use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::tensor::{Device, Tensor, TensorData};
use terse_comm::Communicator;
use terse_data::pretrain::{
    PretrainConfig, PretrainExample, ShardSet, build_shards, corpus_fingerprint, read_corpus,
};
use terse_data::{WordPiece, minilm_tokenizer};
use terse_models::ModelConfig;
use terse_models::bert::{BertConfig, BertForPreTraining, save_hf};

use super::export::copy_tokenizer;
use crate::batch::pretrain_batch;
use crate::checkpoint::ranks_sharing;
use crate::rank_exchange::all_gather_bytes;
use crate::task::{Task, eval_range, exact_f32};
use crate::{RunConfig, TaskConfig, TrainError};

/// The pre-training task of a run.
pub struct PretrainTask {
    shards: ShardSet,
    train: usize,
    bert: BertConfig,
    pad_id: u32,
    shard_dir: PathBuf,
    tokenizer_file: PathBuf,
}

impl PretrainTask {
    /// Builds (the first rank on each data cache, once) and opens the
    /// examples `config` asks for, the same on every rank.
    pub fn prepare(config: &RunConfig, comm: &dyn Communicator) -> Result<Self, TrainError> {
        let TaskConfig::Pretrain {
            corpus,
            max_seq,
            dupe_factor,
            held_out,
        } = &config.task
        else {
            return Err(invalid("task.kind", "not a pre-training task".into()));
        };
        let Some(ModelConfig::Bert(bert)) = &config.model else {
            return Err(invalid("model.kind", "pre-training needs `bert`".into()));
        };
        let tokenizer_file = minilm_tokenizer()?;
        let tokenizer = WordPiece::from_tokenizer_json(&tokenizer_file)?;
        if tokenizer.vocab_size() != bert.vocab_size {
            return Err(invalid(
                "model.vocab_size",
                format!(
                    "{} but the WordPiece vocabulary has {} entries",
                    bert.vocab_size,
                    tokenizer.vocab_size()
                ),
            ));
        }
        if *max_seq > bert.max_position_embeddings {
            return Err(invalid(
                "task.max_seq",
                format!(
                    "{max_seq} exceeds the model's {} positions",
                    bert.max_position_embeddings
                ),
            ));
        }
        let mut data = PretrainConfig::for_max_seq(*max_seq, config.train.seed)?;
        data.dupe_factor = *dupe_factor;
        // The key names the settings and fingerprints the content (the
        // corpus files, the vocabulary, the shard format), so an edited
        // corpus or another vocabulary makes new examples instead of
        // reusing stale ones.
        let fingerprint = corpus_fingerprint(corpus, std::slice::from_ref(&tokenizer_file))?;
        let key = format!(
            "{}-seq{max_seq}-dupe{dupe_factor}-seed{}-v{}-{fingerprint}",
            corpus
                .iter()
                .map(|c| sanitize(c))
                .collect::<Vec<_>>()
                .join("+"),
            config.train.seed,
            tokenizer.vocab_size()
        );
        let shard_dir = terse_data::fetch::cache_dir().join("shards").join(&key);
        // The first rank on each data cache reads the cached examples
        // (which checks every shard's checksum) or makes them; the other
        // ranks wait, then read them. A cache of each node (the README's
        // multi-node setup) has its own first rank; one the nodes share
        // has rank 0.
        let sharing = ranks_sharing(
            shard_dir
                .parent()
                .expect("the shards' directory has a parent"),
            comm,
        )?;
        let checked = if sharing.first() == Some(&comm.rank()) {
            Some(cached_or_built(corpus, &tokenizer, &data, &shard_dir)?)
        } else {
            None
        };
        comm.barrier()?;
        let shards = match checked {
            Some(shards) => shards,
            None => ShardSet::open(&shard_dir)?,
        };
        same_examples_on_every_rank(comm, &key, shards.len())?;
        let train = shards.len().saturating_sub(*held_out);
        if train == 0 {
            return Err(invalid(
                "task.held_out",
                format!(
                    "{held_out} of {} examples leaves none to train on",
                    shards.len()
                ),
            ));
        }
        Ok(Self {
            shards,
            train,
            bert: bert.clone(),
            pad_id: tokenizer.special().pad,
            shard_dir,
            tokenizer_file,
        })
    }

    /// Where the examples are.
    pub fn shard_dir(&self) -> &Path {
        &self.shard_dir
    }

    fn examples_at(
        &self,
        indices: impl Iterator<Item = usize>,
    ) -> Result<Vec<PretrainExample>, TrainError> {
        indices
            .map(|i| self.shards.get(i).map_err(TrainError::from))
            .collect()
    }
}

/// Refuses ranks whose examples differ from rank 0's: with a data cache
/// of each node, nodes whose corpus files or vocabulary differ make
/// different example sets (another key, another count), and the ranks
/// would train on different data under one step order without a word.
fn same_examples_on_every_rank(
    comm: &dyn Communicator,
    key: &str,
    examples: usize,
) -> Result<(), TrainError> {
    let own = format!("{examples} examples, {key}");
    let all = all_gather_bytes(comm, own.as_bytes())?;
    let differing: Vec<String> = all
        .iter()
        .enumerate()
        .filter(|(_, theirs)| *theirs != &all[0])
        .map(|(rank, theirs)| format!("rank {rank} has {}", String::from_utf8_lossy(theirs)))
        .collect();
    if differing.is_empty() {
        return Ok(());
    }
    Err(invalid(
        "task.corpus",
        format!(
            "the ranks' pre-training examples differ from rank 0's ({}): {}; their nodes' \
             corpus files or vocabularies differ: give every node the same data (cargo xtask \
             data fetch there, or a TERSE_CACHE the nodes share)",
            String::from_utf8_lossy(&all[0]),
            differing.join(", ")
        ),
    ))
}

fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

fn invalid(field: &'static str, reason: String) -> TrainError {
    TrainError::InvalidRun { field, reason }
}

/// The examples cached in `shard_dir`, or, when they are missing or a
/// shard fails its checksum, made again there. Runs started at once on one
/// cache (two trainings, parallel tests) take turns through a lock beside
/// the directory: the first makes the examples, the others then find them.
fn cached_or_built(
    corpus: &[String],
    tokenizer: &WordPiece,
    data: &PretrainConfig,
    shard_dir: &Path,
) -> Result<ShardSet, TrainError> {
    let lock_path = shard_dir.with_extension("lock");
    let io = crate::checkpoint::io;
    if let Some(parent) = lock_path.parent() {
        std::fs::create_dir_all(parent).map_err(io(parent))?;
    }
    let lock = std::fs::File::create(&lock_path).map_err(io(&lock_path))?;
    lock.lock().map_err(io(&lock_path))?;
    if shard_dir.join("pretrain.json").exists() {
        match ShardSet::open(shard_dir) {
            Ok(shards) => return Ok(shards),
            Err(e) => tracing::warn!("{e}; making the examples again"),
        }
    }
    build(corpus, tokenizer, data, shard_dir)?;
    Ok(ShardSet::open(shard_dir)?)
}

fn build(
    corpus: &[String],
    tokenizer: &WordPiece,
    data: &PretrainConfig,
    shard_dir: &Path,
) -> Result<(), TrainError> {
    let mut documents = Vec::new();
    for name in corpus {
        documents.extend(read_corpus(name)?);
    }
    let tmp = shard_dir.with_extension("tmp");
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|source| TrainError::Io {
            path: tmp.clone(),
            source,
        })?;
    }
    tracing::info!(
        "making pre-training examples from {} ({} documents) into {}",
        corpus.join(", "),
        documents.len(),
        shard_dir.display()
    );
    let summary = build_shards(&documents, tokenizer, data, &tmp, 1)?;
    // Damaged examples of an earlier build make way (moved aside first, so
    // the directory is never half old, half new).
    let stale = shard_dir.with_extension("stale");
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| TrainError::Io { path, source }
    };
    if shard_dir.exists() {
        if stale.exists() {
            std::fs::remove_dir_all(&stale).map_err(io(&stale))?;
        }
        std::fs::rename(shard_dir, &stale).map_err(io(shard_dir))?;
    }
    std::fs::rename(&tmp, shard_dir).map_err(io(shard_dir))?;
    if stale.exists() {
        std::fs::remove_dir_all(&stale).map_err(io(&stale))?;
    }
    tracing::info!("{} examples", summary.examples);
    Ok(())
}

/// Held-out examples per evaluation batch.
const EVAL_BATCH: usize = 32;

impl Task for PretrainTask {
    type Model = BertForPreTraining;

    fn examples(&self) -> usize {
        self.train
    }

    fn init(&self, device: &Device) -> Result<Self::Model, TrainError> {
        Ok(BertForPreTraining::new(&self.bert, device))
    }

    fn loss(
        &self,
        model: &Self::Model,
        examples: &[usize],
        _epoch: u64,
        device: &Device,
    ) -> Result<Tensor<1>, TrainError> {
        let examples = self.examples_at(examples.iter().copied())?;
        let batch = pretrain_batch(&examples, self.pad_id, device)?;
        let out = model.forward(batch.input, batch.masked_positions);
        Ok(model.loss(&out, batch.mlm_labels, batch.nsp_labels))
    }

    /// Batches of 32 held-out examples.
    fn eval_batches(&self) -> usize {
        (self.shards.len() - self.train).div_ceil(EVAL_BATCH)
    }

    /// `[loss, m, m predicted tokens, m masked tokens, the predicted
    /// next-sentence labels, the gold ones]` of held-out batch `batch`.
    fn eval_batch(
        &self,
        model: &Self::Model,
        batch: usize,
        device: &Device,
    ) -> Result<Vec<f32>, TrainError> {
        let held = eval_range(batch, EVAL_BATCH, self.shards.len() - self.train);
        let examples = self.examples_at(held.map(|i| self.train + i))?;
        let batch = pretrain_batch(&examples, self.pad_id, device)?;
        let out = model.forward(batch.input, batch.masked_positions);
        let loss = model
            .loss(&out, batch.mlm_labels.clone(), batch.nsp_labels.clone())
            .into_scalar::<f32>();
        let ids = |ids: TensorData| ids.iter::<i64>().map(exact_f32).collect::<Vec<f32>>();
        let mlm = ids(batch.mlm_labels.into_data());
        let mut outputs = vec![loss, exact_f32(mlm.len() as i64)];
        outputs.extend(ids(out.mlm_logits.argmax(1).into_data()));
        outputs.extend(mlm);
        outputs.extend(ids(out.nsp_logits.argmax(1).into_data()));
        outputs.extend(ids(batch.nsp_labels.into_data()));
        Ok(outputs)
    }

    /// Loss and masked-LM / next-sentence accuracy on the held-out examples,
    /// and the masked-LM baseline a model must beat to have learned more
    /// than word frequencies: `mlm_majority_accuracy`, the accuracy of always
    /// answering the held-out set's most frequent masked token (the best any
    /// unigram predictor can score there; it depends on the data only).
    fn eval_metrics(&self, outputs: &[Vec<f32>]) -> Result<Vec<(String, f64)>, TrainError> {
        held_out_metrics(outputs)
    }

    fn export(&self, model: &Self::Model, dir: &Path) -> Result<(), TrainError> {
        if self.bert.layer_norm == terse_models::bert::LayerNormPlacement::Pre {
            return Err(TrainError::InvalidRun {
                field: "model.layer_norm",
                reason: "HuggingFace's BERT is Post-LN: a Pre-LN model has no HuggingFace \
                         export (its checkpoints resume and evaluate as usual)"
                    .into(),
            });
        }
        save_hf(&model.clone().valid(), &self.bert, dir)?;
        // The vocabulary the examples were made with goes with the weights,
        // so fine-tuning from this directory tokenizes the same way.
        copy_tokenizer(&self.tokenizer_file, dir)
    }
}

/// The held-out set's metrics from its batches' outputs (`[loss, m,
/// m predicted, m gold, nsp predicted…, nsp gold…]` each).
fn held_out_metrics(outputs: &[Vec<f32>]) -> Result<Vec<(String, f64)>, TrainError> {
    if outputs.is_empty() {
        return Ok(Vec::new());
    }
    let (mut loss, mut mlm_hit, mut mlm_all, mut nsp_hit, mut nsp_all) =
        (0.0, 0usize, 0usize, 0usize, 0usize);
    let mut targets: std::collections::HashMap<i64, usize> = Default::default();
    let hits = |predicted: &[f32], gold: &[f32]| -> usize {
        predicted.iter().zip(gold).filter(|(p, g)| p == g).count()
    };
    for batch in outputs {
        let malformed = || TrainError::Batch("a malformed held-out batch's outputs".into());
        let (&batch_loss, rest) = batch.split_first().ok_or_else(malformed)?;
        let (&m, rest) = rest.split_first().ok_or_else(malformed)?;
        let m = m as usize;
        if rest.len() < 2 * m || !(rest.len() - 2 * m).is_multiple_of(2) {
            return Err(malformed());
        }
        let (mlm, nsp) = rest.split_at(2 * m);
        let (mlm_predicted, mlm_gold) = mlm.split_at(m);
        let (nsp_predicted, nsp_gold) = nsp.split_at(nsp.len() / 2);
        // Weighted by the batch's examples: a short last batch (a
        // held_out that is not a multiple of the batch) counts as
        // its examples do, not as a whole batch.
        loss += f64::from(batch_loss) * (nsp_gold.len() as f64);
        for &token in mlm_gold {
            *targets.entry(token as i64).or_default() += 1;
        }
        (mlm_hit, mlm_all) = (mlm_hit + hits(mlm_predicted, mlm_gold), mlm_all + m);
        (nsp_hit, nsp_all) = (
            nsp_hit + hits(nsp_predicted, nsp_gold),
            nsp_all + nsp_gold.len(),
        );
    }
    Ok(vec![
        ("held_out_loss".into(), loss / nsp_all.max(1) as f64),
        (
            "mlm_accuracy".into(),
            mlm_hit as f64 / mlm_all.max(1) as f64,
        ),
        (
            "nsp_accuracy".into(),
            nsp_hit as f64 / nsp_all.max(1) as f64,
        ),
        (
            "mlm_majority_accuracy".into(),
            targets.values().copied().max().unwrap_or(0) as f64 / mlm_all.max(1) as f64,
        ),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `[loss, m, m predicted, m gold, n predicted, n gold]`.
    fn batch(loss: f32, mlm: (&[f32], &[f32]), nsp: (&[f32], &[f32])) -> Vec<f32> {
        let mut out = vec![loss, mlm.0.len() as f32];
        out.extend(mlm.0.iter().chain(mlm.1).chain(nsp.0).chain(nsp.1));
        out
    }

    /// Ranks with other examples than rank 0's (another count, or another
    /// key: other corpus files on a node) are refused, every rank naming
    /// the ones that differ; the same examples everywhere pass.
    #[test]
    fn ranks_with_other_examples_than_rank_0_s_are_refused() {
        use std::time::Duration;
        use terse_comm::LocalComm;
        let run = |of_rank: fn(usize) -> (&'static str, usize)| {
            LocalComm::run(3, Duration::from_secs(10), |comm| {
                let (key, examples) = of_rank(comm.rank());
                same_examples_on_every_rank(comm, key, examples).map_err(|e| e.to_string())
            })
        };
        for outcome in run(|_| ("sotu-seq128", 1000)) {
            outcome.unwrap().unwrap();
        }
        for outcome in run(|r| ("sotu-seq128", if r == 2 { 990 } else { 1000 })) {
            let error = outcome.unwrap().unwrap_err();
            assert!(error.contains("rank 2 has 990 examples"), "{error}");
        }
        for outcome in run(|r| (if r == 1 { "sotu-other" } else { "sotu-seq128" }, 1000)) {
            let error = outcome.unwrap().unwrap_err();
            assert!(error.contains("rank 1 has 1000 examples"), "{error}");
        }
    }

    /// A short last batch counts as its examples: (2·1.0 + 1·4.0) / 3,
    /// not the batches' mean 2.5.
    #[test]
    fn the_held_out_loss_weighs_each_batch_by_its_examples() {
        let outputs = [
            batch(1.0, (&[5.0], &[5.0]), (&[0.0, 1.0], &[0.0, 0.0])),
            batch(4.0, (&[6.0], &[7.0]), (&[1.0], &[1.0])),
        ];
        let metrics = held_out_metrics(&outputs).unwrap();
        let get = |name: &str| metrics.iter().find(|(n, _)| n == name).unwrap().1;
        assert_eq!(get("held_out_loss"), 2.0);
        assert_eq!(get("mlm_accuracy"), 0.5);
        assert!((get("nsp_accuracy") - 2.0 / 3.0).abs() < 1e-12);
    }
}
