//! A training run as `configs/*.toml` writes it: the task (data and head),
//! the model, the optimizer and its schedule, and the loop's settings.
//!
//! Every section is a serde struct with unknown fields refused, so a typo is
//! an error naming the field, never a silently ignored setting. The resolved
//! config (after command-line overrides) is written next to the run's
//! metrics and into every checkpoint, where a resume compares it with the
//! new one ([`RunConfig::resume_difference`]).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use terse_models::ModelConfig;
use terse_optim::{LrSchedule, OptimizerConfig};

use crate::{DeviceChoice, LossScaling, Override, Precision, TrainError};

/// One run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    /// What to learn: the data and the head on the model.
    pub task: TaskConfig,
    /// The model (`kind = "bert" | "resnet" | "vgg" | "mlp"`). Absent when
    /// fine-tuning pretrained weights: their `config.json` is the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelConfig>,
    /// The optimizer (`name = "adam" | "onebit_lamb" | …`).
    pub optimizer: OptimizerConfig,
    /// Its learning-rate schedule, over optimizer steps.
    pub schedule: LrSchedule,
    /// The loop.
    pub train: TrainSettings,
}

/// Where a fine-tuning run's weights come from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Init {
    /// The pretrained MiniLM of DATA.md (`all-MiniLM-L6-v2`), fetched and
    /// checked by the run.
    Minilm,
    /// Random initialisation from the seed.
    Random,
    /// A HuggingFace-layout directory (`model.safetensors` + `config.json`),
    /// e.g. the `export/` of a terse pre-training run.
    Path(PathBuf),
}

/// The task of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum TaskConfig {
    /// Masked LM + next sentence on a corpus (DATA.md's text corpora).
    Pretrain {
        /// Corpora: `sotu`, `squad` (the training articles), `imdb`, or a
        /// path to a one-sentence-per-line file.
        corpus: Vec<String>,
        /// Sequence length of the examples (128 or 512 in the papers).
        max_seq: usize,
        /// Passes over the corpus with different masks.
        #[serde(default = "one")]
        dupe_factor: usize,
        /// Examples held out at the end of the set for evaluation.
        #[serde(default = "default_held_out")]
        held_out: usize,
    },
    /// Sentence(-pair) classification: a GLUE task or a stand-in.
    Glue {
        /// `rt-polarity`, `imdb`, `snli`, or a GLUE task name with its
        /// directory in `glue_dir`.
        task: String,
        /// Longest input in word pieces.
        max_seq: usize,
        /// Where the weights come from.
        init: Init,
        /// Directory of the official GLUE TSVs (GLUE tasks only).
        #[serde(default)]
        glue_dir: Option<PathBuf>,
    },
    /// SQuAD v1.1 extractive question answering.
    Squad {
        /// Window length in word pieces.
        max_seq: usize,
        /// Window stride: the step from one window's first context token
        /// to the next's, as Google's BERT `run_squad.py` (HF's `run_qa`
        /// names the overlap `doc_stride`).
        doc_stride: usize,
        /// Longest question in word pieces.
        max_query: usize,
        /// Where the weights come from.
        init: Init,
        /// Evaluate on the first N dev questions only (all when absent).
        #[serde(default)]
        dev_questions: Option<usize>,
    },
    /// Image classification.
    Image {
        /// `fashion-mnist`, `mnist` (the 5k CSV sample), `cifar10` or
        /// `cifar100` (from `dir`).
        dataset: String,
        /// Directory of the CIFAR binary files (CIFAR only: terse has no
        /// checksummed source to fetch them from).
        #[serde(default)]
        dir: Option<PathBuf>,
        /// Random crop (pad 4) and horizontal flip.
        #[serde(default)]
        augment: bool,
    },
}

impl TaskConfig {
    /// The `kind` it is written with.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Pretrain { .. } => "pretrain",
            Self::Glue { .. } => "glue",
            Self::Squad { .. } => "squad",
            Self::Image { .. } => "image",
        }
    }
}

fn one() -> usize {
    1
}

fn default_held_out() -> usize {
    256
}

/// The loop's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainSettings {
    /// Optimizer steps in the run.
    pub steps: u64,
    /// Examples per optimizer step, over all ranks.
    pub global_batch: usize,
    /// Examples per forward/backward pass on one rank; the rest of a rank's
    /// share of the global batch is gradient accumulation.
    pub micro_batch: usize,
    /// Seeds initialisation, data order and dropout.
    pub seed: u64,
    /// Write a checkpoint every N steps (0: only at the end and on a signal).
    #[serde(default)]
    pub checkpoint_every: u64,
    /// Evaluate every N steps (0: only at the end).
    #[serde(default)]
    pub eval_every: u64,
    /// Clip the gradient to this global norm before the optimizer (as
    /// DeepSpeed's `gradient_clipping` and the HF Trainer's
    /// `max_grad_norm`). The norm is the root mean square of the ranks'
    /// gradient norms — the exact norm of the mean gradient on one rank, an
    /// upper bound on several (the exact one would need the fp32 allreduce
    /// the compressed stages avoid) — and every rank scales by the same
    /// factor. Unset: no clipping (the norm is still logged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_grad_norm: Option<f64>,
    /// Seconds a rank waits for the others in one collective before the
    /// job ends with an error naming the ranks that did not arrive (a
    /// stopped, hung or lost rank). Unset: 30 minutes until the first step
    /// is done, then ten times the slowest step so far (an evaluation the
    /// other ranks wait for included), at least 10 minutes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collective_timeout_s: Option<u64>,
    /// Where the model, its batches and its gradients live: `cpu` (burn's
    /// flex backend, the default), `wgpu` (burn's wgpu backend on the best
    /// adapter: a GPU, else lavapipe), `wgpu:N`, `lavapipe`, or `cuda` /
    /// `cuda:N` (burn's CUDA backend; see [`DeviceChoice`]). A checkpoint
    /// continues on any.
    #[serde(default, skip_serializing_if = "DeviceChoice::is_cpu")]
    pub device: DeviceChoice,
    /// What the model computes in: `fp32` (the default), `tf32` (CUDA),
    /// `bf16` or `fp16` (matmuls and activations in the half type,
    /// LayerNorm, softmax and losses in fp32, as PyTorch's autocast; the
    /// parameters, gradients and optimizer states stay fp32). A device that
    /// lacks it refuses the run.
    #[serde(default, skip_serializing_if = "is_fp32")]
    pub precision: Precision,
    /// fp16's dynamic loss scaling (DeepSpeed's `fp16` block); fp16 only.
    /// Unset under fp16: DeepSpeed's defaults (2^16, window 1000, floor 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_scaling: Option<LossScaling>,
    /// The cubek matmul routine the linear layers run on a cubecl device
    /// (`wgpu`, `lavapipe`, `cuda`), by cubek's name without `matmul_`
    /// (`terse_fused::matmul_routine_names`: `simple_tma_mma`,
    /// `ordered_double_mma`, …), or on `cuda` NVIDIA's cuBLAS: `cublas`
    /// (f32 arithmetic, as PyTorch by default) or `cublas_tf32` (TF32
    /// tensor cores, PyTorch's `allow_tf32`). Unset: burn's own matmul
    /// (cubek's `Auto`, TF32 from sm_80 on CUDA).
    /// Each routine sums in its own order, so it is one fixed choice for
    /// the run rather than autotune's per-process race; a resumed run may
    /// change it, and then continues with other roundings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matmul: Option<String>,
}

fn is_fp32(precision: &Precision) -> bool {
    *precision == Precision::Fp32
}

impl TrainSettings {
    /// Micro-batches per rank per step on `world` ranks, or the error that
    /// names the fields that do not divide and values that would.
    pub fn accumulation(&self, world: usize) -> Result<usize, TrainError> {
        let world = world.max(1);
        let (global, micro) = (self.global_batch, self.micro_batch);
        let per_rank = global / world;
        if micro > 0 && global > 0 && global.is_multiple_of(world) && per_rank.is_multiple_of(micro)
        {
            return Ok(per_rank / micro);
        }
        let reason = if micro == 0 || global == 0 {
            format!("global_batch {global} and micro_batch {micro} must both be at least 1")
        } else if !global.is_multiple_of(world) {
            format!(
                "global_batch {global} does not split evenly into {world} ranks: run on a \
                 number of ranks that divides {global}, or set train.global_batch to a multiple \
                 of {}",
                world * micro
            )
        } else {
            // The largest micro-batch below the configured one that
            // divides each rank's share: the same step, more accumulation.
            let fits = (1..=micro.min(per_rank))
                .rev()
                .find(|m| per_rank.is_multiple_of(*m))
                .unwrap_or(1);
            format!(
                "global_batch {global} on {world} ranks is {per_rank} examples per rank, not a \
                 whole number of micro-batches of micro_batch {micro}: set train.micro_batch to \
                 a divisor of {per_rank} (e.g. --set train.micro_batch={fits}), or \
                 train.global_batch to a multiple of {}",
                world * micro
            )
        };
        Err(TrainError::InvalidRun {
            field: "train.global_batch",
            reason,
        })
    }
}

impl RunConfig {
    /// Reads a config file; errors name the file and the field.
    pub fn load(path: &Path) -> Result<Self, TrainError> {
        Self::load_with(path, &[])
    }

    /// Reads a config file and applies `overrides` (`--set`) before
    /// deserialising it; errors name the file and the field.
    pub fn load_with(path: &Path, overrides: &[Override]) -> Result<Self, TrainError> {
        let text = std::fs::read_to_string(path).map_err(|source| TrainError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let config_error = |reason| TrainError::Config {
            path: path.to_path_buf(),
            reason,
        };
        if overrides.is_empty() {
            // Straight from the text, so errors keep their line and column.
            return Self::parse(&text).map_err(config_error);
        }
        let mut document: toml::Table =
            toml::from_str(&text).map_err(|e: toml::de::Error| config_error(e.to_string()))?;
        for o in overrides {
            o.apply(&mut document).map_err(config_error)?;
        }
        let config: Self = document
            .try_into()
            .map_err(|e: toml::de::Error| config_error(e.to_string()))?;
        config.validate().map_err(config_error)?;
        Ok(config)
    }

    /// Parses and validates TOML text.
    pub fn parse(text: &str) -> Result<Self, String> {
        let config: Self = toml::from_str(text).map_err(|e| e.to_string())?;
        config.validate()?;
        Ok(config)
    }

    /// Checks what serde cannot: the optimizer, the schedule and the batch.
    pub fn validate(&self) -> Result<(), String> {
        self.optimizer
            .validate()
            .map_err(|e| format!("[optimizer]: {e}"))?;
        self.schedule
            .validate()
            .map_err(|e| format!("[schedule]: {e}"))?;
        if self.train.steps == 0 {
            return Err("train.steps: must be at least 1".into());
        }
        // Past its end a decaying schedule's rate is 0: those steps
        // would change nothing (an extended run, `--steps`, forgetting
        // the schedule).
        if let Some(total) = self.schedule.total_steps()
            && self.train.steps > total
            && self.schedule.lr(total + 1) == 0.0
        {
            return Err(format!(
                "train.steps = {} runs past schedule.total_steps = {total}, after which the \
                 learning rate is 0 and the model does not change: set schedule.total_steps \
                 too (e.g. --set schedule.total_steps={}), or train.steps ≤ {total}",
                self.train.steps, self.train.steps
            ));
        }
        if let Some(norm) = self.train.max_grad_norm
            && !(norm.is_finite() && norm > 0.0)
        {
            return Err(format!(
                "train.max_grad_norm = {norm}: must be a positive number (leave it out for no clipping)"
            ));
        }
        self.train
            .accumulation(1)
            .map_err(|e| format!("[train]: {e}"))?;
        crate::matmul_choice::check(self)?;
        self.check_precision()
    }

    /// The precision against the device and the model, and the loss
    /// scaling against the precision.
    fn check_precision(&self) -> Result<(), String> {
        let precision = self.train.precision;
        precision.check_device(&self.train.device)?;
        let bert = matches!(self.model, None | Some(ModelConfig::Bert(_)));
        if precision.half().is_some() && !bert {
            return Err(format!(
                "train.precision = \"{precision}\": mixed precision is implemented for BERT \
                 only (the image models' convolutions and BatchNorm compute in fp32); use fp32"
            ));
        }
        match &self.train.loss_scaling {
            Some(_) if !precision.scales_loss() => Err(format!(
                "train.loss_scaling is set but train.precision is \"{precision}\": loss \
                 scaling is for fp16 only (bf16 has fp32's range)"
            )),
            Some(scaling) => scaling.validate(),
            None => Ok(()),
        }
    }

    /// The config as TOML, as written next to a run's metrics.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a run config serialises")
    }

    /// Why a checkpoint written under `saved` cannot be continued under
    /// `self`, or `None` when it can. Only the number of steps (with the
    /// schedule's end, to extend a run past it), how often to checkpoint
    /// or evaluate, and how the same arithmetic runs may change; anything
    /// else (model, task, optimizer, the schedule's shape, batch, seed)
    /// would make the resumed run a different run.
    pub fn resume_difference(&self, saved: &RunConfig) -> Option<String> {
        let mut ours = serde_json::to_value(self).expect("serialises");
        let mut theirs = serde_json::to_value(saved).expect("serialises");
        for value in [&mut ours, &mut theirs] {
            if let Some(train) = value.get_mut("train").and_then(|t| t.as_object_mut()) {
                for free in [
                    "steps",
                    "checkpoint_every",
                    "eval_every",
                    "collective_timeout_s",
                    "device",
                    // The master weights and optimizer states are fp32 in
                    // every precision: a checkpoint moves between them.
                    "precision",
                    "loss_scaling",
                    // A summation order, like the device's.
                    "matmul",
                ] {
                    train.remove(free);
                }
            }
        }
        // Extending a run (--steps) past its schedule's end needs a later
        // end: the steps to come follow the new one, as HF's Trainer's
        // resumed scheduler does with a larger max_steps.
        for value in [&mut ours, &mut theirs] {
            if let Some(schedule) = value.get_mut("schedule").and_then(|t| t.as_object_mut()) {
                schedule.remove("total_steps");
            }
        }
        first_difference("", &theirs, &ours)
    }
}

/// The first path at which `saved` and `now` differ, described.
fn first_difference(
    path: &str,
    saved: &serde_json::Value,
    now: &serde_json::Value,
) -> Option<String> {
    use serde_json::Value;
    match (saved, now) {
        (Value::Object(a), Value::Object(b)) => {
            // A different variant (`name`, `kind`) is the difference to
            // name, not the fields that come with it.
            let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
            keys.sort_by_key(|k| (!matches!(k.as_str(), "name" | "kind" | "preset"), *k));
            keys.dedup();
            keys.into_iter().find_map(|key| {
                let sub = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                match (a.get(key), b.get(key)) {
                    (Some(x), Some(y)) => first_difference(&sub, x, y),
                    (x, y) => Some(format!(
                        "`{sub}` was {} in the checkpoint, is {} now",
                        x.map_or("absent".into(), Value::to_string),
                        y.map_or("absent".into(), Value::to_string)
                    )),
                }
            })
        }
        (a, b) if a == b => None,
        (a, b) => Some(format!("`{path}` was {a} in the checkpoint, is {b} now")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TINY: &str = r#"
[task]
kind = "pretrain"
corpus = ["sotu"]
max_seq = 128

[model]
kind = "bert"
preset = "tiny"

[optimizer]
name = "onebit_lamb"
freeze_step = 10

[schedule]
kind = "constant"
lr = 1e-3

[train]
steps = 20
global_batch = 8
micro_batch = 2
seed = 3
"#;

    /// The error says what would split: 8 ranks of BERT-base's 64 with
    /// micro-batches of 16 are 8 examples each.
    #[test]
    fn a_batch_that_does_not_split_names_a_micro_batch_that_would() {
        let mut config = RunConfig::parse(TINY).unwrap();
        config.train.global_batch = 64;
        config.train.micro_batch = 16;
        assert_eq!(config.train.accumulation(4).unwrap(), 1);
        let error = config.train.accumulation(8).unwrap_err().to_string();
        assert!(
            error.contains("8 examples per rank") && error.contains("train.micro_batch=8"),
            "{error}"
        );
        let error = config.train.accumulation(6).unwrap_err().to_string();
        assert!(
            error.contains("does not split evenly into 6 ranks"),
            "{error}"
        );
    }

    /// A decaying schedule's end bounds the steps; one that keeps a rate
    /// past it (a floor, a constant) does not.
    #[test]
    fn steps_past_a_schedule_that_ends_at_zero_are_refused() {
        let decaying = TINY.replace(
            "kind = \"constant\"\nlr = 1e-3",
            "kind = \"linear_warmup_linear_decay\"\npeak = 1e-3\nwarmup_steps = 2\ntotal_steps = 10",
        );
        let error = RunConfig::parse(&decaying).unwrap_err();
        assert!(
            error.contains("train.steps = 20 runs past schedule.total_steps = 10"),
            "{error}"
        );
        RunConfig::parse(&decaying.replace("total_steps = 10", "total_steps = 20")).unwrap();
        let floor = TINY.replace(
            "kind = \"constant\"\nlr = 1e-3",
            "kind = \"linear_warmup_poly_decay\"\npeak = 1e-3\nwarmup_steps = 2\n\
             total_steps = 10\npower = 1.0\nend_lr = 1e-5",
        );
        RunConfig::parse(&floor).unwrap();
    }

    #[test]
    fn parses_and_names_unknown_fields() {
        let config = RunConfig::parse(TINY).unwrap();
        assert_eq!(config.train.accumulation(2).unwrap(), 2);
        assert!(config.train.accumulation(3).is_err());
        let typo = RunConfig::parse(&TINY.replace("micro_batch", "micro_bach")).unwrap_err();
        assert!(typo.contains("micro_bach"), "{typo}");
    }

    #[test]
    fn resume_allows_more_steps_and_names_any_other_change() {
        let saved = RunConfig::parse(TINY).unwrap();
        let longer = RunConfig::parse(&TINY.replace("steps = 20", "steps = 40")).unwrap();
        assert_eq!(longer.resume_difference(&saved), None);
        let other = RunConfig::parse(&TINY.replace("onebit_lamb", "onebit_adam")).unwrap();
        let why = other.resume_difference(&saved).unwrap();
        assert!(why.contains("optimizer.name"), "{why}");
        assert!(
            why.contains("onebit_lamb") && why.contains("onebit_adam"),
            "{why}"
        );
        let model = RunConfig::parse(&TINY.replace("\"tiny\"", "\"mini\"")).unwrap();
        let why = model.resume_difference(&saved).unwrap();
        assert!(why.starts_with("`model."), "{why}");
        // A decaying schedule's end moves with an extension; its shape not.
        let decaying = |total: u64, peak: &str| {
            RunConfig::parse(&TINY.replace(
                "kind = \"constant\"\nlr = 1e-3",
                &format!(
                    "kind = \"linear_warmup_linear_decay\"\npeak = {peak}\nwarmup_steps = 2\n\
                     total_steps = {total}"
                ),
            ))
            .unwrap()
        };
        let (short, extended) = (decaying(20, "1e-3"), decaying(40, "1e-3"));
        assert_eq!(extended.resume_difference(&short), None);
        let why = decaying(20, "2e-3").resume_difference(&short).unwrap();
        assert!(why.contains("schedule.peak"), "{why}");
    }

    #[test]
    fn a_matmul_routine_is_one_of_cubeks_on_a_cubecl_device() {
        let with = |lines: &str| TINY.replace("seed = 3\n", &format!("seed = 3\n{lines}\n"));
        let lavapipe = "device = \"lavapipe\"";
        let named =
            RunConfig::parse(&with(&format!("{lavapipe}\nmatmul = \"simple_unit\""))).unwrap();
        assert_eq!(named.train.matmul.as_deref(), Some("simple_unit"));
        assert!(named.to_toml().contains("matmul = \"simple_unit\""));
        let saved = RunConfig::parse(&with(lavapipe)).unwrap();
        assert_eq!(
            named.resume_difference(&saved),
            None,
            "a summation order, free on resume"
        );

        let typo =
            RunConfig::parse(&with(&format!("{lavapipe}\nmatmul = \"fastest\""))).unwrap_err();
        assert!(
            typo.contains("train.matmul = \"fastest\"") && typo.contains("simple_tma_mma"),
            "{typo}"
        );
        let cpu = RunConfig::parse(&with("matmul = \"simple_unit\"")).unwrap_err();
        assert!(cpu.contains("device cpu"), "{cpu}");

        // cuBLAS is CUDA's: named for cuda, refused for another device.
        let cuda = RunConfig::parse(&with("device = \"cuda:1\"\nmatmul = \"cublas_tf32\""));
        assert_eq!(cuda.unwrap().train.matmul.as_deref(), Some("cublas_tf32"));
        let vulkan =
            RunConfig::parse(&with(&format!("{lavapipe}\nmatmul = \"cublas\""))).unwrap_err();
        assert!(
            vulkan.contains("cuBLAS") && vulkan.contains("device lavapipe"),
            "{vulkan}"
        );
        // A named routine is refused where the precision makes it idle.
        let half = RunConfig::parse(&with(
            "device = \"cuda\"\nprecision = \"bf16\"\nmatmul = \"cublas_tf32\"",
        ))
        .unwrap_err();
        assert!(half.contains("leave train.matmul unset"), "{half}");
    }
}
