//! The standard CIFAR training augmentation (He et al. 2016, "Deep Residual
//! Learning for Image Recognition", §4.2): pad 4 zero pixels on each side,
//! crop back to the original size at a random offset, flip horizontally
//! with probability 1/2, then normalize each channel — torchvision's
//! `RandomCrop(32, padding=4)`, `RandomHorizontalFlip()`, `ToTensor()`,
//! `Normalize(mean, std)` in that order. The padding is byte 0, so a padded
//! pixel comes out as `−mean/std`, as in torchvision.
//!
//! The random choices of sample `i` in epoch `e` come from a SplitMix64
//! stream keyed by `(seed, e, i)` alone ([`SplitMix64::keyed`]), so a sample
//! is augmented the same way whatever batch, thread or rank it lands on, and
//! a run on N ranks sees what a run on one rank would.

use serde::{Deserialize, Serialize};

use super::ImageSet;
use crate::DataError;
use terse_rng::SplitMix64;

/// CIFAR-10 channel means (R, G, B) of the training set, on the [0, 1]
/// scale (the values the CIFAR ResNet code bases use).
pub const CIFAR10_MEAN: [f32; 3] = [0.4914, 0.4822, 0.4465];
/// CIFAR-10 channel standard deviations (over all training pixels).
pub const CIFAR10_STD: [f32; 3] = [0.2470, 0.2435, 0.2616];
/// MNIST mean (PyTorch's MNIST example).
pub const MNIST_MEAN: [f32; 1] = [0.1307];
/// MNIST standard deviation (PyTorch's MNIST example).
pub const MNIST_STD: [f32; 1] = [0.3081];
/// Fashion-MNIST mean of the 60,000 training images.
pub const FASHION_MNIST_MEAN: [f32; 1] = [0.2860];
/// Fashion-MNIST standard deviation of the training images.
pub const FASHION_MNIST_STD: [f32; 1] = [0.3530];

/// Largest accepted padding: far beyond any use, and small enough that the
/// offset range `2·pad + 1` cannot overflow.
const MAX_PAD: usize = 1 << 16;

/// The augmentation settings. Defaults: CIFAR-10's (pad 4, flips, CIFAR-10
/// statistics); [`Augment::validate`] refuses statistics whose channel
/// count is not the images'.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Augment {
    /// Zero padding on each side before the random crop (0: no cropping).
    #[serde(default = "default_pad")]
    pub pad: usize,
    /// Random horizontal flips with probability 1/2.
    #[serde(default = "default_flip")]
    pub flip: bool,
    /// Per-channel mean, on the [0, 1] scale.
    #[serde(default = "default_mean")]
    pub mean: Vec<f32>,
    /// Per-channel standard deviation, on the [0, 1] scale.
    #[serde(default = "default_std")]
    pub std: Vec<f32>,
}

fn default_pad() -> usize {
    4
}
fn default_flip() -> bool {
    true
}
fn default_mean() -> Vec<f32> {
    CIFAR10_MEAN.to_vec()
}
fn default_std() -> Vec<f32> {
    CIFAR10_STD.to_vec()
}

impl Default for Augment {
    fn default() -> Self {
        Self::cifar10()
    }
}

impl Augment {
    /// CIFAR-10's training augmentation.
    pub fn cifar10() -> Self {
        Self {
            pad: default_pad(),
            flip: default_flip(),
            mean: default_mean(),
            std: default_std(),
        }
    }

    /// Normalization only, with the given statistics (evaluation, or data
    /// such as digits where a flip changes the class).
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
        if self.mean.len() != channels || self.std.len() != channels {
            return refused(format!(
                "{} means and {} standard deviations for {channels}-channel images",
                self.mean.len(),
                self.std.len()
            ));
        }
        if let Some(s) = self.std.iter().find(|s| !(**s > 0.0 && s.is_finite())) {
            return refused(format!(
                "standard deviation {s} must be positive and finite"
            ));
        }
        if let Some(m) = self.mean.iter().find(|m| !m.is_finite()) {
            return refused(format!("mean {m} must be finite"));
        }
        if self.pad > MAX_PAD {
            return refused(format!("pad {} is above {MAX_PAD}", self.pad));
        }
        Ok(())
    }

    /// The crop offset `(dx, dy)` into the padded image, each in
    /// `0..=2·pad` (`(pad, pad)` is the unshifted image), and whether to
    /// flip, for sample `index` in `epoch`: a function of
    /// `(seed, epoch, index)` alone.
    pub fn draw(&self, seed: u64, epoch: u64, index: u64) -> (usize, usize, bool) {
        let mut rng = SplitMix64::keyed(seed, &[epoch, index]);
        let offsets = 2 * self.pad.min(MAX_PAD) + 1;
        let dx = rng.below(offsets);
        let dy = rng.below(offsets);
        let flip = self.flip && rng.next_f64() < 0.5;
        (dx, dy, flip)
    }

    /// The deterministic core: writes image `image` (CHW bytes of shape
    /// `(channels, height, width)`), cropped at `(dx, dy)` of its zero-padded
    /// copy, then flipped if `flip`, then normalized, into `out` (CHW, same
    /// shape). Output pixel `(c, y, x)` is padded pixel
    /// `(c, y + dy, x' + dx)` with `x' = width − 1 − x` when flipped, else `x`.
    pub fn apply(
        &self,
        image: &[u8],
        (channels, height, width): (usize, usize, usize),
        (dx, dy, flip): (usize, usize, bool),
        out: &mut [f32],
    ) -> Result<(), DataError> {
        self.validate(channels)?;
        let n = channels * height * width;
        if image.len() != n || out.len() != n {
            return refused(format!(
                "{} pixels in and {} values out for a {channels}×{height}×{width} image",
                image.len(),
                out.len()
            ));
        }
        if dx > 2 * self.pad || dy > 2 * self.pad {
            return refused(format!(
                "offset ({dx}, {dy}) is outside 0..={} for pad {}",
                2 * self.pad,
                self.pad
            ));
        }
        // Source coordinate in the unpadded image: padded minus pad.
        let source = |i: usize, shift: usize, len: usize| {
            (i + shift).checked_sub(self.pad).filter(|&s| s < len)
        };
        for c in 0..channels {
            let (mean, std) = (self.mean[c], self.std[c]);
            let normalize = |pixel: u8| (f32::from(pixel) / 255.0 - mean) / std;
            let plane = &image[c * height * width..(c + 1) * height * width];
            for y in 0..height {
                let row = &mut out[(c * height + y) * width..(c * height + y + 1) * width];
                let Some(sy) = source(y, dy, height) else {
                    row.fill(normalize(0));
                    continue;
                };
                for (x, value) in row.iter_mut().enumerate() {
                    let cx = if flip { width - 1 - x } else { x };
                    let pixel = source(cx, dx, width).map_or(0, |sx| plane[sy * width + sx]);
                    *value = normalize(pixel);
                }
            }
        }
        Ok(())
    }

    /// Fills `out`, a `[indices.len(), C, H, W]` buffer, with images
    /// `indices` of `set`: augmented with [`Augment::draw`]`(seed, epoch, i)`
    /// when `train`, only normalized (centre crop, no flip) otherwise.
    pub fn batch_into(
        &self,
        set: &ImageSet,
        indices: &[usize],
        seed: u64,
        epoch: u64,
        train: bool,
        out: &mut [f32],
    ) -> Result<(), DataError> {
        set.check()?;
        self.validate(set.channels)?;
        let n = set.image_bytes();
        if out.len() != indices.len() * n {
            return refused(format!(
                "a buffer of {} values for {} images of {n}",
                out.len(),
                indices.len()
            ));
        }
        if let Some((k, i)) = indices.iter().enumerate().find(|(_, i)| **i >= set.len()) {
            return refused(format!(
                "batch position {k} asks for image {i} of a {}-image set",
                set.len()
            ));
        }
        let shape = (set.channels, set.height, set.width);
        for (slot, &i) in out.chunks_exact_mut(n).zip(indices) {
            let choice = if train {
                self.draw(seed, epoch, i as u64)
            } else {
                (self.pad, self.pad, false)
            };
            self.apply(set.image(i), shape, choice, slot)?;
        }
        Ok(())
    }

    /// [`Augment::batch_into`] into a new `[indices.len(), C, H, W]` buffer.
    pub fn batch(
        &self,
        set: &ImageSet,
        indices: &[usize],
        seed: u64,
        epoch: u64,
        train: bool,
    ) -> Result<Vec<f32>, DataError> {
        let mut out = vec![0.0; indices.len() * set.image_bytes()];
        self.batch_into(set, indices, seed, epoch, train, &mut out)?;
        Ok(out)
    }
}

/// Settings or a buffer that [`Augment`] refuses, and why.
fn refused<T>(detail: String) -> Result<T, DataError> {
    Err(DataError::Config {
        config: "augment",
        detail,
    })
}
