//! MedMNIST v2 `.npz` archives (PneumoniaMNIST, BreastMNIST, and any other 2D task): arrays
//! `{train,val,test}_images` (N, H, W) or (N, H, W, 3) of uint8 and `{split}_labels` (N, 1) of
//! uint8 class indices. Labels are checked against the task's class count when it is known.

use std::path::Path;

use super::files::{DataError, Result};

use super::npz::read_array;
use super::samples::{ImageSet, Inputs, Split};

/// One split ("train", "val" or "test") of the archive at `path`; with `num_classes`, every label
/// must be below it.
pub fn read_split(path: &Path, split: &str, num_classes: Option<usize>) -> Result<Split> {
    let (shape, pixels) = read_array::<u8>(path, &format!("{split}_images"))?;
    let (label_shape, labels) = read_array::<u8>(path, &format!("{split}_labels"))?;
    // (N, H, W) grayscale or (N, H, W, 3) colour, channels last as stored.
    let (count, height, width, channels) = match shape[..] {
        [n, h, w] => (n, h, w, 1),
        [n, h, w, 3] => (n, h, w, 3),
        _ => {
            return Err(DataError::format(
                path,
                format!("{split}_images has shape {shape:?}, expected (N, H, W[, 3])"),
            ));
        }
    };
    if label_shape.first() != Some(&count) || label_shape.iter().skip(1).product::<usize>() != 1 {
        return Err(DataError::format(
            path,
            format!(
                "{split}_labels has shape {label_shape:?} for {count} images: expected ({count},) or ({count}, 1), one label per image{}",
                if label_shape.first() == Some(&count) {
                    " (several labels per image: multi-label tasks are not supported)"
                } else {
                    ""
                }
            ),
        ));
    }
    if count == 0 || height == 0 || width == 0 {
        return Err(DataError::format(
            path,
            format!("{split}_images holds no images (shape {shape:?})"),
        ));
    }
    if let Some(n) = num_classes
        && let Some(k) = labels.iter().position(|&l| usize::from(l) >= n)
    {
        return Err(DataError::format(
            path,
            format!(
                "{split}_labels[{k}] is {}, expected a class index 0..{} ({n} classes)",
                labels[k],
                n.saturating_sub(1)
            ),
        ));
    }
    let pixels = if channels == 1 {
        pixels
    } else {
        channels_first(&pixels, count, height * width, channels)
    };
    let images = ImageSet {
        count,
        channels,
        height,
        width,
        pixels,
    };
    Ok(Split {
        inputs: Inputs::Images(images),
        labels: labels.into_iter().map(u32::from).collect(),
        release_index: (0..count).collect(),
    })
}

/// Refuses a split whose images are not `pixels` × `pixels` (a file of another size under this
/// size's name).
pub fn check_size(path: &Path, split: &Split, pixels: usize) -> Result<()> {
    if let Inputs::Images(images) = &split.inputs
        && (images.height != pixels || images.width != pixels)
    {
        return Err(DataError::format(
            path,
            format!(
                "holds {}×{} images, expected {pixels}×{pixels} for this release (the name says \
                 the size: task for 28 px, task_64, task_128, task_224)",
                images.height, images.width
            ),
        ));
    }
    Ok(())
}

/// (N, HW, C) → (N, C, HW).
fn channels_first(pixels: &[u8], count: usize, plane: usize, channels: usize) -> Vec<u8> {
    let mut out = vec![0; pixels.len()];
    for n in 0..count {
        let (src, dst) = (
            &pixels[n * plane * channels..],
            &mut out[n * plane * channels..],
        );
        for p in 0..plane {
            for c in 0..channels {
                dst[c * plane + p] = src[p * channels + c];
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::npz::tests::{array, write_npz};

    #[test]
    fn reads_grayscale_and_colour_splits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.npz");
        let colour: Vec<u8> = (0..2 * 2 * 2 * 3).map(|v| v as u8).collect();
        write_npz(
            &path,
            &[
                ("train_images", array::<u8>(&[2, 2, 2], &[7; 8])),
                ("train_labels", array::<u8>(&[2, 1], &[0, 1])),
                ("test_images", array::<u8>(&[2, 2, 2, 3], &colour)),
                ("test_labels", array::<u8>(&[2, 1], &[1, 1])),
            ],
        );
        let train = read_split(&path, "train", Some(2)).unwrap();
        assert_eq!(train.labels, vec![0, 1]);
        let test = read_split(&path, "test", Some(2)).unwrap();
        let Inputs::Images(images) = &test.inputs else {
            panic!()
        };
        assert_eq!(images.channels, 3);
        // Pixel (0, 0) of image 0 was stored (R, G, B) = (0, 1, 2): planes now start 0, 1, 2.
        assert_eq!(
            (images.image(0)[0], images.image(0)[4], images.image(0)[8]),
            (0, 1, 2)
        );
    }

    #[test]
    fn missing_keys_and_wrong_dtypes_are_errors_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("broken.npz");
        write_npz(
            &path,
            &[
                ("train_images", array::<f32>(&[1, 2, 2], &[0.0; 4])),
                ("train_labels", array::<u8>(&[1, 1], &[0])),
            ],
        );
        let err = read_split(&path, "train", None).unwrap_err().to_string();
        assert!(
            err.contains("broken.npz") && err.contains("train_images") && err.contains("F32"),
            "{err}"
        );
        let err = read_split(&path, "val", None).unwrap_err().to_string();
        assert!(
            err.contains("broken.npz") && err.contains("missing array val_images"),
            "{err}"
        );
        std::fs::write(&path, b"not a zip").unwrap();
        let err = read_split(&path, "train", None).unwrap_err().to_string();
        assert!(
            err.contains("broken.npz") && err.contains("not readable"),
            "{err}"
        );
    }

    #[test]
    fn labels_outside_the_classes_and_empty_splits_are_errors_naming_the_array() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.npz");
        write_npz(
            &path,
            &[
                ("train_images", array::<u8>(&[3, 2, 2], &[0; 12])),
                ("train_labels", array::<u8>(&[3, 1], &[1, 0, 7])),
                ("test_images", array::<u8>(&[0, 2, 2], &[])),
                ("test_labels", array::<u8>(&[0, 1], &[])),
            ],
        );
        let err = read_split(&path, "train", Some(2)).unwrap_err().to_string();
        assert!(
            err.contains("tiny.npz") && err.contains("train_labels[2] is 7"),
            "{err}"
        );
        assert_eq!(read_split(&path, "train", None).unwrap().labels, [1, 0, 7]);
        let err = read_split(&path, "test", Some(2)).unwrap_err().to_string();
        assert!(
            err.contains("tiny.npz") && err.contains("test_images holds no images"),
            "{err}"
        );
    }
}
