//! Image classification data: one byte-image type, [`ImageSet`], shared by
//! every reader (CIFAR-10/100 binary files in [`cifar`], the IDX files of
//! MNIST and Fashion-MNIST via [`ImageSet::from_idx`], the MNIST CSV sample
//! in [`mnist_csv`]), and the training augmentation of the CIFAR papers in
//! [`augment`].
//!
//! Pixels stay bytes until a batch is built: CIFAR-10's 50,000 training
//! images are 150 MB as `u8` and would be 600 MB as `f32`, and the
//! augmentation has to start from the bytes anyway (it pads with 0 before
//! normalizing, as torchvision does).

pub mod augment;
pub mod cifar;
pub mod mnist_csv;

pub use augment::{
    Augment, CIFAR10_MEAN, CIFAR10_STD, FASHION_MNIST_MEAN, FASHION_MNIST_STD, MNIST_MEAN,
    MNIST_STD,
};
pub use cifar::{CifarKind, read_cifar_file, read_cifar_split};
pub use mnist_csv::read_mnist_csv;

use crate::{DataError, IdxImages};

/// Labelled byte images, `channels × height × width` each, stored image
/// after image in CHW order (channel planes, each row-major).
///
/// The count is `labels.len()` ([`ImageSet::len`]) rather than a field of
/// its own, so that it cannot disagree with the labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageSet {
    /// Colour channels (1 or 3).
    pub channels: usize,
    /// Image height.
    pub height: usize,
    /// Image width.
    pub width: usize,
    /// `len() · channels · height · width` pixels.
    pub pixels: Vec<u8>,
    /// One class label per image.
    pub labels: Vec<u16>,
}

impl ImageSet {
    /// A set from its parts; the pixel count must be `labels.len()` whole
    /// images of `channels × height × width`.
    pub fn new(
        channels: usize,
        height: usize,
        width: usize,
        pixels: Vec<u8>,
        labels: Vec<u16>,
    ) -> Result<Self, DataError> {
        let set = Self {
            channels,
            height,
            width,
            pixels,
            labels,
        };
        set.check()?;
        Ok(set)
    }

    /// Checks that the pixels are exactly one image per label (public fields
    /// let a caller break that; [`Augment::batch`] checks before indexing).
    pub fn check(&self) -> Result<(), DataError> {
        let per_image = self.image_bytes();
        if per_image == 0 || self.pixels.len() != self.labels.len() * per_image {
            return Err(DataError::Config {
                config: "ImageSet",
                detail: format!(
                    "{} pixels for {} labels of {}×{}×{} images (expected {})",
                    self.pixels.len(),
                    self.labels.len(),
                    self.channels,
                    self.height,
                    self.width,
                    self.labels.len() * per_image
                ),
            });
        }
        Ok(())
    }

    /// Number of images.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether there is no image.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Bytes per image, `channels · height · width`.
    pub fn image_bytes(&self) -> usize {
        self.channels * self.height * self.width
    }

    /// The CHW pixels of image `i` (`i < len()`, or this panics like slice
    /// indexing).
    pub fn image(&self, i: usize) -> &[u8] {
        let n = self.image_bytes();
        &self.pixels[i * n..(i + 1) * n]
    }

    /// The pixels of an IDX image file and the labels of its IDX label file
    /// as one single-channel set; the counts must agree.
    pub fn from_idx(images: IdxImages, labels: &[u8]) -> Result<Self, DataError> {
        if labels.len() != images.count {
            return Err(DataError::Config {
                config: "ImageSet",
                detail: format!("{} labels for {} IDX images", labels.len(), images.count),
            });
        }
        Self::new(
            1,
            images.rows,
            images.cols,
            images.pixels,
            labels.iter().map(|&l| u16::from(l)).collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idx_images_become_one_channel_sets() {
        // Two 2×3 images, as read_idx_images returns them.
        let idx = IdxImages {
            count: 2,
            rows: 2,
            cols: 3,
            pixels: vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 255],
        };
        let set = ImageSet::from_idx(idx.clone(), &[7, 9]).unwrap();
        assert_eq!(
            (set.len(), set.channels, set.height, set.width),
            (2, 1, 2, 3)
        );
        assert_eq!(set.image(1), [7, 8, 9, 10, 11, 255]);
        assert_eq!(set.labels, [7, 9]);
        let error = ImageSet::from_idx(idx, &[7]).unwrap_err().to_string();
        assert_eq!(error, "ImageSet: 1 labels for 2 IDX images");
    }

    #[test]
    fn inconsistent_parts_are_refused() {
        let error = ImageSet::new(3, 2, 2, vec![0; 11], vec![1])
            .unwrap_err()
            .to_string();
        assert_eq!(
            error,
            "ImageSet: 11 pixels for 1 labels of 3×2×2 images (expected 12)"
        );
        assert!(ImageSet::new(0, 2, 2, vec![], vec![]).is_err());
        assert!(ImageSet::new(1, 2, 2, vec![], vec![]).unwrap().is_empty());
    }
}
