//! Image classification data: one byte-image type shared by every reader
//! (CIFAR-10/100 binary files, IDX files of MNIST and Fashion-MNIST, the
//! MNIST CSV sample), and the training augmentation of the CIFAR papers.

pub mod augment;
pub mod cifar;
pub mod mnist_csv;

pub use augment::{
    Augment, CIFAR10_MEAN, CIFAR10_STD, FASHION_MNIST_MEAN, FASHION_MNIST_STD, MNIST_MEAN,
    MNIST_STD,
};
pub use cifar::{CifarKind, read_cifar_file, read_cifar_split};
pub use mnist_csv::read_mnist_csv;

use crate::IdxImages;

/// Labelled byte images, `channels × height × width` each, stored image after
/// image in CHW order.
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
    /// One label per image.
    pub labels: Vec<u16>,
}

impl ImageSet {
    /// Number of images.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether there is no image.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Bytes per image.
    pub fn image_bytes(&self) -> usize {
        self.channels * self.height * self.width
    }

    /// The CHW pixels of image `i`.
    pub fn image(&self, i: usize) -> &[u8] {
        let n = self.image_bytes();
        &self.pixels[i * n..(i + 1) * n]
    }

    /// An IDX image file and its label file as one set (one channel).
    pub fn from_idx(images: IdxImages, labels: &[u8]) -> Self {
        Self {
            channels: 1,
            height: images.rows,
            width: images.cols,
            pixels: images.pixels,
            labels: labels.iter().map(|&l| u16::from(l)).collect(),
        }
    }
}
