//! terse's TensorBoard event records, byte for byte against the file the
//! `tensorboard` package's own writer made from the same events
//! (`fixtures/make_tensorboard_fixture.py`, run once in a throwaway venv):
//! the protobuf encoding, the record framing and the masked CRC-32Cs. The
//! script also reads that file back with TensorBoard's `EventAccumulator`
//! and checks every scalar, so bytes equal to it are bytes TensorBoard
//! reads (`--read FILE` shows its view of a real run's event file).

use terse_train::tensorboard::{Event, EventKind, record};

#[test]
fn records_match_tensorboards_own_writer() {
    let scalars = |pairs: &[(&str, f32)]| {
        EventKind::Scalars(pairs.iter().map(|(t, v)| ((*t).to_string(), *v)).collect())
    };
    let events = [
        Event {
            wall_time: 1_764_000_000.25,
            step: 0,
            what: EventKind::FileVersion("brain.Event:2".into()),
        },
        Event {
            wall_time: 1_764_000_001.5,
            step: 1,
            what: scalars(&[
                ("train/loss", 10.5),
                ("train/lr", 1e-4),
                ("train/bytes_sent", 0.0),
            ]),
        },
        Event {
            wall_time: 1_764_000_002.75,
            step: 300,
            what: scalars(&[("eval/mlm_accuracy", 0.125)]),
        },
        // A run killed after logging step 2, resumed from step 1's
        // checkpoint: its restart, then step 2 again.
        Event {
            wall_time: 1_764_000_003.0,
            step: 2,
            what: scalars(&[("train/loss", 9.5)]),
        },
        Event {
            wall_time: 1_764_000_004.0,
            step: 2,
            what: EventKind::SessionStart,
        },
        Event {
            wall_time: 1_764_000_005.0,
            step: 2,
            what: scalars(&[("train/loss", 9.25)]),
        },
    ];
    let ours: Vec<u8> = events.iter().flat_map(record).collect();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tensorboard_events.bin");
    let reference = std::fs::read(&path).unwrap();
    assert_eq!(ours, reference, "{} differs", path.display());
}
