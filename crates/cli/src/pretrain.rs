//! `terse pretrain`: masked-LM + next-sentence pre-training of BERT on the
//! corpus the config names, from `configs/pretrain-<MODEL>.toml` or
//! `--config`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use terse_models::ModelConfig;
use terse_models::bert::{BertConfig, BertPreset};
use terse_train::RunConfig;

use crate::launch::RunFlags;
use crate::shipped;

/// Arguments of `terse pretrain`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The model (bert-tiny, bert-base, bert-large, minilm-l6, … — the
    /// configs/pretrain-*.toml there are): picks the shipped config
    /// configs/pretrain-<MODEL>.toml, and must be the model of --config when
    /// both are given (any BERT preset bert-tiny … bert-xlarge names a shape)
    #[arg(value_name = "MODEL")]
    model: Option<String>,

    /// TOML run config [default: configs/pretrain-<MODEL>.toml]
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,

    #[command(flatten)]
    flags: RunFlags,
}

pub fn run(args: &Args) -> Result<()> {
    let dir = &shipped::dir();
    match (&args.config, &args.model) {
        (Some(config), Some(model)) => args
            .flags
            .run_checked(config, "pretrain", |resolved| agrees(dir, model, resolved)),
        (Some(config), None) => args.flags.run(config, "pretrain"),
        (None, Some(model)) => args.flags.run(&shipped_config(dir, model)?, "pretrain"),
        (None, None) => {
            bail!("name a MODEL (e.g. `terse pretrain bert-tiny`) or pass --config")
        }
    }
}

/// The shipped config of `model` in `dir`, or an error listing the shipped
/// ones.
fn shipped_config(dir: &Path, model: &str) -> Result<PathBuf> {
    shipped::config(dir, "pretrain-", model, ".toml", "models shipped").map_err(|e| {
        anyhow::anyhow!(
            "{e} (or pass --config, e.g. a copy of configs/pretrain-bert-tiny.toml with \
             [model] preset = \"small\")"
        )
    })
}

/// The shape that names a BERT: layers, width, heads, feed-forward width
/// (dropout, LayerNorm ε and the like may differ under one name).
fn shape(bert: &BertConfig) -> (usize, usize, usize, usize) {
    (
        bert.num_hidden_layers,
        bert.hidden_size,
        bert.num_attention_heads,
        bert.intermediate_size,
    )
}

fn describe(bert: &BertConfig) -> String {
    format!(
        "{} layers, hidden {}, {} heads, feed-forward {}",
        bert.num_hidden_layers, bert.hidden_size, bert.num_attention_heads, bert.intermediate_size
    )
}

/// The BERT `model` names: its shipped config's, else the preset
/// `bert-<preset>`'s.
fn named_bert(dir: &Path, model: &str) -> Result<BertConfig> {
    let shipped = dir.join(format!("pretrain-{model}.toml"));
    if shipped.exists() {
        let config = RunConfig::load(&shipped).with_context(|| shipped.display().to_string())?;
        if let Some(ModelConfig::Bert(bert)) = config.model {
            return Ok(bert);
        }
        bail!("{}: [model] is not a BERT", shipped.display());
    }
    let preset = model.strip_prefix("bert-").and_then(|name| {
        BertPreset::ALL
            .into_iter()
            .find(|preset| preset.name() == name)
    });
    match preset {
        Some(preset) => Ok(preset.config()),
        None => bail!(
            "no model `{model}`: the shipped ones are {}, and bert-<preset> names a preset \
             ({})",
            shipped::names(dir, "pretrain-", ".toml").join(", "),
            BertPreset::ALL
                .map(|p| format!("bert-{}", p.name()))
                .join(", ")
        ),
    }
}

/// Refuses a config whose BERT is not the shape `model` names.
fn agrees(dir: &Path, model: &str, config: &RunConfig) -> Result<()> {
    let wanted = named_bert(dir, model)?;
    let Some(ModelConfig::Bert(bert)) = &config.model else {
        bail!("[model] is not a BERT, but the command line names {model}");
    };
    if shape(bert) != shape(&wanted) {
        bail!(
            "[model] builds a BERT of {}, but the command line names {model} ({})",
            describe(bert),
            describe(&wanted)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn configs() -> PathBuf {
        shipped::for_tests()
    }

    #[test]
    fn a_model_names_its_shipped_config_and_an_unknown_one_lists_them() {
        let path = shipped_config(&configs(), "bert-tiny").unwrap();
        assert!(path.ends_with("pretrain-bert-tiny.toml"), "{path:?}");
        let error = shipped_config(&configs(), "bert-huge")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("pretrain-bert-huge.toml: no such config"),
            "{error}"
        );
        for shipped in ["bert-tiny", "bert-base", "bert-large", "minilm-l6"] {
            assert!(error.contains(shipped), "{error}");
        }
    }

    #[test]
    fn a_config_of_another_bert_is_refused_naming_both() {
        let tiny = RunConfig::load(&configs().join("pretrain-bert-tiny.toml")).unwrap();
        agrees(&configs(), "bert-tiny", &tiny).unwrap();
        let error = agrees(&configs(), "bert-base", &tiny)
            .unwrap_err()
            .to_string();
        assert_eq!(
            error,
            "[model] builds a BERT of 2 layers, hidden 128, 2 heads, feed-forward 512, but the \
             command line names bert-base (12 layers, hidden 768, 12 heads, feed-forward 3072)"
        );
        // A preset without a shipped config still names a shape.
        let error = agrees(&configs(), "bert-mini", &tiny)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("names bert-mini (4 layers, hidden 256"),
            "{error}"
        );
        let error = agrees(&configs(), "gpt2", &tiny).unwrap_err().to_string();
        assert!(error.starts_with("no model `gpt2`"), "{error}");
    }
}
