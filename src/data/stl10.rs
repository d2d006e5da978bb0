//! STL-10 (Coates, Lee & Ng 2011), binary release `stl10_binary/`: `train_X.bin` and `test_X.bin`
//! hold 96×96×3 u8 images one after another, each as three channel planes (R, G, B) stored
//! column-major (MATLAB order: the first 96 bytes are the first column); `train_y.bin` and
//! `test_y.bin` hold one label byte per image, 1..10 in the order of `class_names.txt`. 5000
//! training and 8000 test images in the release (the unlabeled set is not used).

use std::path::Path;

use super::files::{DataError, Result};
use super::samples::{ImageSet, Inputs, Split};

pub const SIDE: usize = 96;
const IMAGE_BYTES: usize = 3 * SIDE * SIDE;
const NUM_CLASSES: u8 = 10;
/// The folder the release's tarball unpacks to, inside the dataset folder.
pub const FOLDER: &str = "stl10_binary";

/// `class_names.txt` of the release, in label order.
pub const CLASS_NAMES: [&str; 10] = [
    "airplane", "bird", "car", "cat", "deer", "dog", "horse", "monkey", "ship", "truck",
];

/// One split (`train` or `test`): `<split>_X.bin` and `<split>_y.bin` in `dir`.
pub fn load_split(dir: &Path, split: &str) -> Result<Split> {
    let images_path = dir.join(format!("{split}_X.bin"));
    let labels_path = dir.join(format!("{split}_y.bin"));
    let raw = super::files::read_data(&images_path)?;
    if raw.is_empty() || raw.len() % IMAGE_BYTES != 0 {
        return Err(DataError::format(
            &images_path,
            format!(
                "{} bytes is not a whole number of 96×96×3 images ({IMAGE_BYTES} bytes each): truncated or not STL-10's binary release",
                raw.len()
            ),
        ));
    }
    let count = raw.len() / IMAGE_BYTES;
    let label_bytes = super::files::read_data(&labels_path)?;
    if label_bytes.len() != count {
        return Err(DataError::format(
            &labels_path,
            format!(
                "{} labels for the {count} images of {}: one label byte per image expected",
                label_bytes.len(),
                images_path.display()
            ),
        ));
    }
    if let Some(k) = label_bytes
        .iter()
        .position(|l| !(1..=NUM_CLASSES).contains(l))
    {
        return Err(DataError::format(
            &labels_path,
            format!(
                "label {} of image {k} is outside 1..{NUM_CLASSES}",
                label_bytes[k]
            ),
        ));
    }
    // Column-major planes to (C, H, W) row-major: byte (c, x, y) of a plane is pixel (y, x).
    let mut pixels = vec![0u8; raw.len()];
    for (image, out) in raw
        .chunks_exact(IMAGE_BYTES)
        .zip(pixels.chunks_exact_mut(IMAGE_BYTES))
    {
        for c in 0..3 {
            let plane = &image[c * SIDE * SIDE..(c + 1) * SIDE * SIDE];
            let target = &mut out[c * SIDE * SIDE..(c + 1) * SIDE * SIDE];
            for x in 0..SIDE {
                for y in 0..SIDE {
                    target[y * SIDE + x] = plane[x * SIDE + y];
                }
            }
        }
    }
    Ok(Split::complete(
        Inputs::Images(ImageSet {
            count,
            channels: 3,
            height: SIDE,
            width: SIDE,
            pixels,
        }),
        label_bytes.iter().map(|&l| u32::from(l - 1)).collect(),
    ))
}

/// `class_names.txt`: the ten names, one per line.
pub fn load_class_names(path: &Path) -> Result<Vec<String>> {
    super::files::class_names(path, usize::from(NUM_CLASSES))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Images written in the release's layout come back as (C, H, W): a pixel set at row 2,
    /// column 5 of the green plane is read there, and labels 1..10 become 0..9.
    #[test]
    fn column_major_planes_become_row_major_images() {
        let dir = tempfile::tempdir().unwrap();
        let mut raw = vec![0u8; 2 * IMAGE_BYTES];
        let (y, x) = (2, 5);
        raw[IMAGE_BYTES + SIDE * SIDE + x * SIDE + y] = 200;
        std::fs::write(dir.path().join("train_X.bin"), &raw).unwrap();
        std::fs::write(dir.path().join("train_y.bin"), [10u8, 1]).unwrap();
        let split = load_split(dir.path(), "train").unwrap();
        assert_eq!(split.labels, [9, 0]);
        let Inputs::Images(set) = &split.inputs else {
            panic!("images")
        };
        assert_eq!(set.image(1)[SIDE * SIDE + y * SIDE + x], 200);
        assert_eq!(set.image(1).iter().filter(|&&p| p != 0).count(), 1);

        std::fs::write(dir.path().join("train_y.bin"), [11u8, 1]).unwrap();
        let err = load_split(dir.path(), "train").unwrap_err().to_string();
        assert!(
            err.contains("train_y.bin") && err.contains("outside 1..10"),
            "{err}"
        );
        std::fs::write(dir.path().join("train_X.bin"), &raw[..IMAGE_BYTES + 7]).unwrap();
        let err = load_split(dir.path(), "train").unwrap_err().to_string();
        assert!(
            err.contains("train_X.bin") && err.contains("not a whole number"),
            "{err}"
        );
    }
}
