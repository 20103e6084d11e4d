//! The standard CIFAR training augmentation (He et al. 2016, §4.2): pad 4
//! zero pixels on each side, crop back to the original size at a random
//! offset, flip horizontally with probability 1/2, then normalize each
//! channel — torchvision's `RandomCrop(32, padding=4)`,
//! `RandomHorizontalFlip()`, `ToTensor()`, `Normalize(mean, std)`.
//!
//! The random choices of sample `i` in epoch `e` come from a stream keyed by
//! `(seed, e, i)` alone, so a sample is augmented the same way whatever batch,
//! thread or rank it lands on, and a run on N ranks sees what a run on one
//! rank would.

use serde::{Deserialize, Serialize};

use super::ImageSet;
use crate::DataError;
use crate::rng::SplitMix64;

/// CIFAR-10 channel means of the training set (the values the CIFAR ResNet
/// code bases use).
pub const CIFAR10_MEAN: [f32; 3] = [0.4914, 0.4822, 0.4465];
/// CIFAR-10 channel standard deviations (per-pixel, training set).
pub const CIFAR10_STD: [f32; 3] = [0.2470, 0.2435, 0.2616];
/// MNIST mean (PyTorch's MNIST example).
pub const MNIST_MEAN: [f32; 1] = [0.1307];
/// MNIST standard deviation (PyTorch's MNIST example).
pub const MNIST_STD: [f32; 1] = [0.3081];
/// Fashion-MNIST mean of the 60,000 training images.
pub const FASHION_MNIST_MEAN: [f32; 1] = [0.2860];
/// Fashion-MNIST standard deviation of the training images.
pub const FASHION_MNIST_STD: [f32; 1] = [0.3530];

/// The augmentation settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Augment {
    /// Zero padding on each side before the random crop (0 turns cropping off).
    #[serde(default = "default_pad")]
    pub pad: usize,
    /// Random horizontal flips.
    #[serde(default = "default_flip")]
    pub flip: bool,
    /// Per-channel mean, on the [0, 1] scale.
    pub mean: Vec<f32>,
    /// Per-channel standard deviation, on the [0, 1] scale.
    pub std: Vec<f32>,
}

fn default_pad() -> usize {
    4
}
fn default_flip() -> bool {
    true
}

impl Augment {
    /// CIFAR-10's augmentation.
    pub fn cifar10() -> Self {
        Self {
            pad: 4,
            flip: true,
            mean: CIFAR10_MEAN.to_vec(),
            std: CIFAR10_STD.to_vec(),
        }
    }

    /// Normalization only, with the given statistics (evaluation).
    pub fn normalize_only(mean: &[f32], std: &[f32]) -> Self {
        Self {
            pad: 0,
            flip: false,
            mean: mean.to_vec(),
            std: std.to_vec(),
        }
    }

    /// Checks the settings against images of `channels` channels.
    pub fn validate(&self, channels: usize) -> Result<(), DataError> {
        let bad = |detail: String| {
            Err(DataError::Config {
                config: "augment",
                detail,
            })
        };
        if self.mean.len() != channels || self.std.len() != channels {
            return bad(format!(
                "{} means and {} standard deviations for {channels}-channel images",
                self.mean.len(),
                self.std.len()
            ));
        }
        if let Some(s) = self.std.iter().find(|s| !(**s > 0.0 && s.is_finite())) {
            return bad(format!("standard deviation {s} must be positive"));
        }
        Ok(())
    }

    /// The crop offset `(dx, dy)`, each in `0..=2·pad`, and the flip of
    /// sample `index` in `epoch`.
    pub fn draw(&self, seed: u64, epoch: u64, index: u64) -> (usize, usize, bool) {
        let mut rng = SplitMix64::keyed(seed, &[epoch, index]);
        let dx = rng.below(2 * self.pad + 1);
        let dy = rng.below(2 * self.pad + 1);
        let flip = self.flip && rng.next_f64() < 0.5;
        (dx, dy, flip)
    }

    /// Writes the normalized CHW image cropped at `(dx, dy)` of the padded
    /// image and flipped if asked into `out` (`c·h·w` values).
    pub fn apply(
        &self,
        image: &[u8],
        (channels, height, width): (usize, usize, usize),
        dx: usize,
        dy: usize,
        flip: bool,
        out: &mut [f32],
    ) {
        let p = self.pad as isize;
        for c in 0..channels {
            let (mean, std) = (self.mean[c], self.std[c]);
            for y in 0..height {
                let sy = y as isize + dy as isize - p;
                for x in 0..width {
                    let cx = if flip { width - 1 - x } else { x };
                    let sx = cx as isize + dx as isize - p;
                    let inside =
                        (0..height as isize).contains(&sy) && (0..width as isize).contains(&sx);
                    let pixel = if inside {
                        image[(c * height + sy as usize) * width + sx as usize]
                    } else {
                        0
                    };
                    out[(c * height + y) * width + x] = (f32::from(pixel) / 255.0 - mean) / std;
                }
            }
        }
    }

    /// A `[batch, C, H, W]` buffer of images `indices` of `set`, augmented
    /// for `epoch` when `train`, only normalized otherwise.
    pub fn batch(
        &self,
        set: &ImageSet,
        indices: &[usize],
        epoch: u64,
        seed: u64,
        train: bool,
    ) -> Result<Vec<f32>, DataError> {
        self.validate(set.channels)?;
        let shape = (set.channels, set.height, set.width);
        let n = set.image_bytes();
        let mut out = vec![0.0; indices.len() * n];
        for (slot, &i) in out.chunks_exact_mut(n).zip(indices) {
            let (dx, dy, flip) = if train {
                self.draw(seed, epoch, i as u64)
            } else {
                (self.pad, self.pad, false)
            };
            self.apply(set.image(i), shape, dx, dy, flip, slot);
        }
        Ok(out)
    }
}
