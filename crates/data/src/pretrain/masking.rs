//! BERT's masked-LM corruption (`create_masked_lm_predictions` of Google's
//! `create_pretraining_data.py`): `round(len · masked_lm_prob)` positions
//! (at least 1, at most `max_predictions`; `[CLS]`/`[SEP]` never), chosen
//! uniformly; each becomes `[MASK]` with probability 0.8, a uniformly random
//! vocabulary token with 0.1, and stays unchanged with 0.1.

use terse_rng::SplitMix64;

/// The ids the corruption needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaskingVocab {
    /// `[CLS]`.
    pub cls: u32,
    /// `[SEP]`.
    pub sep: u32,
    /// `[MASK]`.
    pub mask: u32,
    /// Vocabulary size: random replacements are drawn from `0..size`.
    pub size: u32,
}

/// The masked positions (ascending) and the original ids there.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MaskedLm {
    /// Positions in the sequence.
    pub positions: Vec<u16>,
    /// The original token at each position (the MLM labels).
    pub labels: Vec<u32>,
}

/// How many positions a sequence of `len` tokens masks (Python's
/// `int(round(x))` rounds half to even).
pub fn num_to_predict(len: usize, masked_lm_prob: f64, max_predictions: usize) -> usize {
    let rounded = (len as f64 * masked_lm_prob).round_ties_even() as usize;
    rounded.max(1).min(max_predictions)
}

/// Corrupts `tokens` in place and returns what was masked.
pub fn mask_tokens(
    tokens: &mut [u32],
    vocab: MaskingVocab,
    masked_lm_prob: f64,
    max_predictions: usize,
    rng: &mut SplitMix64,
) -> MaskedLm {
    let mut candidates: Vec<usize> = (0..tokens.len())
        .filter(|&i| tokens[i] != vocab.cls && tokens[i] != vocab.sep)
        .collect();
    rng.shuffle(&mut candidates);
    let wanted = num_to_predict(tokens.len(), masked_lm_prob, max_predictions);
    let mut chosen: Vec<(usize, u32)> = Vec::with_capacity(wanted);
    for &i in candidates.iter().take(wanted) {
        let original = tokens[i];
        tokens[i] = if rng.next_f64() < 0.8 {
            vocab.mask
        } else if rng.next_f64() < 0.5 {
            original
        } else {
            rng.below(vocab.size as usize) as u32
        };
        chosen.push((i, original));
    }
    chosen.sort_unstable();
    MaskedLm {
        positions: chosen.iter().map(|&(i, _)| i as u16).collect(),
        labels: chosen.iter().map(|&(_, id)| id).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_follow_python_rounding() {
        // 128 · 0.15 = 19.2 → 19; 10 · 0.15 = 1.5 → 2 (half to even);
        // 30 · 0.15 = 4.5 → 4; 5 · 0.15 = 0.75 → 1; 512 · 0.15 = 76.8 → 77;
        // 1000 · 0.15 = 150 → capped at 80.
        assert_eq!(num_to_predict(128, 0.15, 20), 19);
        assert_eq!(num_to_predict(10, 0.15, 20), 2);
        assert_eq!(num_to_predict(30, 0.15, 20), 4);
        assert_eq!(num_to_predict(5, 0.15, 20), 1);
        assert_eq!(num_to_predict(512, 0.15, 80), 77);
        assert_eq!(num_to_predict(1000, 0.15, 80), 80);
    }

    #[test]
    fn special_tokens_are_never_masked() {
        let vocab = MaskingVocab {
            cls: 101,
            sep: 102,
            mask: 103,
            size: 30_522,
        };
        let mut rng = SplitMix64::new(3);
        for _ in 0..200 {
            let mut tokens = vec![101, 2000, 2001, 102, 2002, 102];
            let original = tokens.clone();
            let masked = mask_tokens(&mut tokens, vocab, 0.5, 20, &mut rng);
            // round(6 · 0.5) = 3 positions, all among 1, 2, 4.
            assert_eq!(masked.positions.len(), 3);
            assert_eq!(masked.positions, [1, 2, 4]);
            assert_eq!(masked.labels, [2000, 2001, 2002]);
            for i in [0, 3, 5] {
                assert_eq!(tokens[i], original[i]);
            }
        }
    }
}
