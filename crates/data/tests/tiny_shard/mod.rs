//! The two pre-training examples `fixtures/pretrain/make_tiny_shard.py`
//! writes into `tiny.shard`: one module for the shard tests here and the
//! collation tests of `terse-train` (which include it by path), so the
//! examples written out by hand cannot drift apart.

use terse_data::pretrain::{MaskedLm, PretrainExample};

/// The examples, in the shard's order.
pub fn tiny_examples() -> Vec<PretrainExample> {
    vec![
        PretrainExample {
            input_ids: vec![101, 7592, 103, 102, 2003, 102],
            segment_a_len: 4,
            masked: MaskedLm {
                positions: vec![2],
                labels: vec![2088],
            },
            is_random_next: false,
        },
        PretrainExample {
            input_ids: vec![101, 1037, 102, 1038, 1039, 103, 102],
            segment_a_len: 3,
            masked: MaskedLm {
                positions: vec![1, 5],
                labels: vec![1037, 1040],
            },
            is_random_next: true,
        },
    ]
}
