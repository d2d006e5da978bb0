//! What every loader returns a dataset's samples as: its modality, its splits' inputs (images or
//! texts) and labels ([`super::catalog::Dataset`] gathers them with the class names).

/// What a dataset's samples are, which decides the backbone that reads them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Modality {
    Image,
    Text,
}

/// Images as stored: u8, (count, channels, height, width) row-major. Grayscale stays one channel;
/// channel replication, resizing and normalisation belong to the backbone's preprocessing.
#[derive(Clone, Debug, PartialEq)]
pub struct ImageSet {
    pub count: usize,
    pub channels: usize,
    pub height: usize,
    pub width: usize,
    pub pixels: Vec<u8>,
}

impl ImageSet {
    pub fn image_len(&self) -> usize {
        self.channels * self.height * self.width
    }

    /// Image i, (channels, height, width).
    pub fn image(&self, i: usize) -> &[u8] {
        let len = self.image_len();
        &self.pixels[i * len..(i + 1) * len]
    }

    /// The images at `indices`, in that order.
    pub fn subset(&self, indices: &[usize]) -> ImageSet {
        let mut pixels = Vec::with_capacity(indices.len() * self.image_len());
        indices
            .iter()
            .for_each(|&i| pixels.extend_from_slice(self.image(i)));
        ImageSet {
            count: indices.len(),
            pixels,
            ..*self
        }
    }
}

/// The inputs of one split.
#[derive(Clone, Debug, PartialEq)]
pub enum Inputs {
    Images(ImageSet),
    Texts(Vec<String>),
}

impl Inputs {
    /// A digest of sample `i`'s raw bytes (pixels with their shape, or the text): what the
    /// feature cache checks a stored sample against, so that replaced files are not served.
    pub fn sample_digest(&self, i: usize) -> String {
        use sha2::Digest;
        let mut hasher = sha2::Sha256::new();
        match self {
            Inputs::Images(set) => {
                for dim in [set.channels, set.height, set.width] {
                    hasher.update((dim as u64).to_le_bytes());
                }
                hasher.update(set.image(i));
            }
            Inputs::Texts(texts) => hasher.update(texts[i].as_bytes()),
        }
        crate::io::hex(&hasher.finalize()[..8])
    }

    pub fn len(&self) -> usize {
        match self {
            Inputs::Images(set) => set.count,
            Inputs::Texts(texts) => texts.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One split of a dataset.
#[derive(Clone, Debug, PartialEq)]
pub struct Split {
    pub inputs: Inputs,
    pub labels: Vec<u32>,
    /// Position of each sample in the full official release of this split. Equal to 0..len for
    /// complete files; with partial files it keeps the link to per-image side data (CIFAR-10N)
    /// and to the authors' split (`--rng authors`). A MedMNIST archive whose size differs from the
    /// release is not a part of it: there it is the position in that file
    /// (see [`super::catalog::official_train_size`]).
    pub release_index: Vec<usize>,
}

impl Split {
    /// A split read from a complete release file: its samples are the release's, in order.
    pub fn complete(inputs: Inputs, labels: Vec<u32>) -> Self {
        let release_index = (0..labels.len()).collect();
        Self {
            inputs,
            labels,
            release_index,
        }
    }

    pub fn len(&self) -> usize {
        self.labels.len()
    }

    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Samples per class, for `num_classes` classes.
    pub fn class_counts(&self, num_classes: usize) -> Vec<usize> {
        let mut counts = vec![0; num_classes];
        for &label in &self.labels {
            counts[label as usize] += 1;
        }
        counts
    }

    /// The samples at `indices`, in that order.
    pub fn subset(&self, indices: &[usize]) -> Split {
        let inputs = match &self.inputs {
            Inputs::Images(set) => Inputs::Images(set.subset(indices)),
            Inputs::Texts(texts) => {
                Inputs::Texts(indices.iter().map(|&i| texts[i].clone()).collect())
            }
        };
        Split {
            inputs,
            labels: indices.iter().map(|&i| self.labels[i]).collect(),
            release_index: indices.iter().map(|&i| self.release_index[i]).collect(),
        }
    }
}
