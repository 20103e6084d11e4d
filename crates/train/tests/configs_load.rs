//! Every file in configs/ loads (unknown fields are errors, so a typo fails
//! here), and the MLP configs equal the built-in defaults `terse train mlp`
//! uses when no config is given.

use std::path::Path;

use terse_train::ClassifierRun;

#[test]
fn every_config_loads_and_mlp_configs_match_the_defaults() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        let optimizer = name
            .strip_prefix("mlp-fashion-mnist-")
            .unwrap_or_else(|| panic!("{name}: no loader for this config family yet"));
        let run: ClassifierRun =
            toml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        run.optimizer.validate().unwrap();
        run.schedule.validate().unwrap();
        assert_eq!(
            run,
            ClassifierRun::fashion_mnist_default(optimizer).unwrap(),
            "{name}"
        );
        seen += 1;
    }
    assert_eq!(seen, 3, "configs/ holds the three MLP configs");
}

#[test]
fn a_misspelled_field_is_an_error_naming_it() {
    let text = "hidden = [8]\nepochs = 1\nbatch_size = 4\nseed = 1\nlearning_rate = 3\n\
                [optimizer]\nname = \"sgd\"\n[schedule]\nkind = \"constant\"\nlr = 0.1\n";
    let error = toml::from_str::<ClassifierRun>(text)
        .unwrap_err()
        .to_string();
    assert!(error.contains("learning_rate"), "{error}");
}
