//! CIFAR-10, binary version: each record is 1 label byte then 1024 R, 1024 G and 1024 B bytes
//! (32×32 row-major), i.e. already (C, H, W). Five training batches and one test batch of 10000
//! records each in the release.

use std::path::Path;

use super::files::{DataError, Result};
use super::samples::{ImageSet, Inputs, Split};

const SIDE: usize = 32;
const IMAGE_BYTES: usize = 3 * SIDE * SIDE;
const RECORD_BYTES: usize = 1 + IMAGE_BYTES;
pub const RECORDS_PER_BATCH: usize = 10_000;
const NUM_CLASSES: u8 = 10;
pub const TRAIN_BATCHES: [&str; 5] = [
    "data_batch_1.bin",
    "data_batch_2.bin",
    "data_batch_3.bin",
    "data_batch_4.bin",
    "data_batch_5.bin",
];
pub const TEST_BATCH: &str = "test_batch.bin";

pub const CLASS_NAMES: [&str; 10] = [
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
];

/// One batch file: labels, pixels, and a warning if it holds fewer records than the release.
fn read_batch(path: &Path) -> Result<(Vec<u32>, Vec<u8>, Option<String>)> {
    let bytes = super::files::read_data(path)?;
    if bytes.is_empty() || bytes.len() % RECORD_BYTES != 0 {
        return Err(DataError::format(
            path,
            format!(
                "{} bytes is not a whole number of {RECORD_BYTES}-byte records",
                bytes.len()
            ),
        ));
    }
    let records = bytes.len() / RECORD_BYTES;
    let mut labels = Vec::with_capacity(records);
    let mut pixels = Vec::with_capacity(records * IMAGE_BYTES);
    for (k, record) in bytes.chunks_exact(RECORD_BYTES).enumerate() {
        if record[0] >= NUM_CLASSES {
            return Err(DataError::format(
                path,
                format!("record {k} has label byte {}, expected 0..9", record[0]),
            ));
        }
        labels.push(u32::from(record[0]));
        pixels.extend_from_slice(&record[1..]);
    }
    let warning = (records < RECORDS_PER_BATCH).then(|| {
        format!(
            "{}: {records} of {RECORDS_PER_BATCH} records (partial file); loading what is there",
            path.display()
        )
    });
    Ok((labels, pixels, warning))
}

/// The batches `files` under `dir`, concatenated; batch b's record r has release index
/// b·10000 + r. Returns the split and the warnings about partial files.
pub fn load_batches(dir: &Path, files: &[&str]) -> Result<(Split, Vec<String>)> {
    let (mut labels, mut pixels, mut release_index, mut warnings) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (b, name) in files.iter().enumerate() {
        let (l, p, warning) = read_batch(&dir.join(name))?;
        release_index.extend((0..l.len()).map(|r| b * RECORDS_PER_BATCH + r));
        labels.extend(l);
        pixels.extend(p);
        warnings.extend(warning);
    }
    let images = ImageSet {
        count: labels.len(),
        channels: 3,
        height: SIDE,
        width: SIDE,
        pixels,
    };
    Ok((
        Split {
            inputs: Inputs::Images(images),
            labels,
            release_index,
        },
        warnings,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(label: u8, fill: u8) -> Vec<u8> {
        let mut r = vec![label];
        r.extend(std::iter::repeat_n(fill, IMAGE_BYTES));
        r
    }

    #[test]
    fn partial_batches_load_with_a_warning_and_keep_release_order() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("a.bin"),
            [record(3, 1), record(9, 2)].concat(),
        )
        .unwrap();
        std::fs::write(dir.path().join("b.bin"), record(0, 5)).unwrap();
        let (split, warnings) = load_batches(dir.path(), &["a.bin", "b.bin"]).unwrap();
        assert_eq!(split.labels, vec![3, 9, 0]);
        assert_eq!(split.release_index, vec![0, 1, 10_000]);
        assert_eq!(warnings.len(), 2);
        assert!(
            warnings[0].contains("2 of 10000 records"),
            "{}",
            warnings[0]
        );
        let Inputs::Images(images) = &split.inputs else {
            panic!()
        };
        assert_eq!(images.image(2)[0], 5);
    }

    #[test]
    fn corrupt_batches_are_errors_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.bin");
        std::fs::write(&path, [record(1, 0), vec![0u8; 10]].concat()).unwrap();
        let err = load_batches(dir.path(), &["bad.bin"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("bad.bin")
                && err.contains("3083 bytes is not a whole number of 3073-byte records"),
            "{err}"
        );
        std::fs::write(&path, [record(1, 0), record(10, 0)].concat()).unwrap();
        let err = load_batches(dir.path(), &["bad.bin"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("bad.bin") && err.contains("record 1 has label byte 10"),
            "{err}"
        );
        let err = load_batches(dir.path(), &["missing.bin"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("missing.bin"), "{err}");
    }
}
