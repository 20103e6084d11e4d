//! terse's fp16 loss scaler against DeepSpeed 0.19.6's own
//! (`FP16_Optimizer._update_scale`, run by
//! `fixtures/make_deepspeed_loss_scale.py`): the same overflow pattern gives
//! the same scale at every step, exactly (every scale is a power of two).
//! Where DeepSpeed meets an overflow with its scale already at the floor
//! and goes on skipping, terse stops the run (`Overflow::AtFloor`).

use terse_train::{LossScaler, LossScaling, Overflow};

#[test]
fn the_scale_follows_deepspeeds_over_every_overflow_pattern() {
    let text = include_str!("fixtures/deepspeed_loss_scale.json");
    let fixture: serde_json::Value = serde_json::from_str(text).unwrap();
    assert_eq!(fixture["deepspeed"], "0.19.6");
    let mut floors = 0;
    for case in fixture["cases"].as_array().unwrap() {
        let config = LossScaling {
            initial_scale_power: case["initial_scale_power"].as_u64().unwrap() as u32,
            scale_window: case["scale_window"].as_u64().unwrap(),
            min_scale: case["min_scale"].as_f64().unwrap(),
            static_scale: None,
        };
        let mut scaler = LossScaler::new(&config);
        let overflows = case["overflows"].as_array().unwrap();
        let tried = case["tried"].as_array().unwrap();
        let mut stopped = false;
        for (i, (overflow, tried)) in overflows.iter().zip(tried).enumerate() {
            let (overflow, tried) = (overflow.as_bool().unwrap(), tried.as_f64().unwrap());
            assert_eq!(scaler.scale, tried, "{config:?}: the scale step {i} tried");
            if let Some(Overflow::AtFloor { scale }) = scaler.update(overflow, &config) {
                assert_eq!(scale, config.min_scale, "{config:?}: step {i}");
                assert_eq!(tried, config.min_scale, "DeepSpeed was at its floor too");
                floors += 1;
                stopped = true;
                break;
            }
        }
        if !stopped {
            assert_eq!(scaler.scale, case["after"].as_f64().unwrap(), "{config:?}");
        }
    }
    assert!(floors >= 1, "the fixture reaches the floor at least once");
}
