//! Fashion-MNIST (Xiao, Rasul & Vollgraf 2017): 60,000 training and 10,000
//! test 28×28 greyscale images of clothing in 10 classes, MIT/Expat licensed,
//! read from Debian's `dataset-fashion-mnist` package.

use std::path::{Path, PathBuf};

use crate::{DataError, IdxImages, read_idx_images, read_idx_labels};

/// Where Debian's `dataset-fashion-mnist` installs the IDX files.
pub const FASHION_MNIST_DEBIAN_DIR: &str = "/usr/share/datasets/fashion-mnist";

/// One split of Fashion-MNIST.
#[derive(Debug, Clone)]
pub struct FashionMnist {
    /// The images.
    pub images: IdxImages,
    /// One label in `0..10` per image.
    pub labels: Vec<u8>,
}

impl FashionMnist {
    /// The class names, by label.
    pub const CLASSES: [&'static str; 10] = [
        "T-shirt/top",
        "Trouser",
        "Pullover",
        "Dress",
        "Coat",
        "Sandal",
        "Shirt",
        "Sneaker",
        "Bag",
        "Ankle boot",
    ];

    /// Loads the training (`train = true`) or test split from `dir`, which
    /// holds the four `*-idx?-ubyte.gz` files.
    pub fn load(dir: &Path, train: bool) -> Result<Self, DataError> {
        if !dir.is_dir() {
            return Err(DataError::Missing {
                name: "Fashion-MNIST",
                path: dir.to_path_buf(),
                hint: "install it with `apt-get install dataset-fashion-mnist` (Debian)",
            });
        }
        let prefix = if train { "train" } else { "t10k" };
        let file = |kind: &str| -> PathBuf { dir.join(format!("{prefix}-{kind}.gz")) };
        let images = read_idx_images(&file("images-idx3-ubyte"))?;
        let labels_path = file("labels-idx1-ubyte");
        let labels = read_idx_labels(&labels_path)?;
        if labels.len() != images.count {
            return Err(DataError::Format {
                path: labels_path,
                detail: format!("{} labels for {} images", labels.len(), images.count),
            });
        }
        if let Some(i) = labels.iter().position(|&l| l >= 10) {
            return Err(DataError::Format {
                path: labels_path,
                detail: format!("label {} of image {i} is not a class in 0..10", labels[i]),
            });
        }
        Ok(Self { images, labels })
    }

    /// Loads a split from Debian's install location.
    pub fn load_debian(train: bool) -> Result<Self, DataError> {
        Self::load(Path::new(FASHION_MNIST_DEBIAN_DIR), train)
    }

    /// Number of examples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether the split is empty.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Images `range` as row-major f32 features scaled to [0, 1], and their labels.
    pub fn batch(&self, range: std::ops::Range<usize>) -> (Vec<f32>, Vec<i64>) {
        self.gather(range)
    }

    /// The images at `indices`, in that order, as row-major f32 features
    /// scaled to [0, 1], and their labels.
    pub fn gather(&self, indices: impl IntoIterator<Item = usize>) -> (Vec<f32>, Vec<i64>) {
        let mut features = Vec::new();
        let mut labels = Vec::new();
        for i in indices {
            features.extend(self.images.image(i).iter().map(|&p| f32::from(p) / 255.0));
            labels.push(i64::from(self.labels[i]));
        }
        (features, labels)
    }
}
