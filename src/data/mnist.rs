//! MNIST in the IDX format of the original release (gzip or raw): a big-endian header (magic with
//! element type and rank, then one u32 per dimension) followed by the payload.

use std::path::Path;

use super::files::{DataError, Result, first_existing, read_maybe_gzip};
use super::samples::{ImageSet, Inputs, Split};

/// IDX element type u8, rank 3 (images) and rank 1 (labels).
const IMAGES_MAGIC: u32 = 0x0000_0803;
const LABELS_MAGIC: u32 = 0x0000_0801;
const NUM_CLASSES: u32 = 10;

/// Parses an IDX file of u8 elements with the given magic; returns (dims, payload).
fn parse_idx(path: &Path, mut bytes: Vec<u8>, magic: u32) -> Result<(Vec<usize>, Vec<u8>)> {
    let rank = (magic & 0xff) as usize;
    let header_len = 4 + 4 * rank;
    if bytes.len() < header_len {
        return Err(DataError::format(
            path,
            format!("{} bytes, shorter than an IDX header", bytes.len()),
        ));
    }
    let word = |k: usize| u32::from_be_bytes(bytes[4 * k..4 * k + 4].try_into().unwrap());
    if word(0) != magic {
        return Err(DataError::format(
            path,
            format!(
                "IDX magic is 0x{:08x}, expected 0x{magic:08x} (u8, rank {rank})",
                word(0)
            ),
        ));
    }
    let dims: Vec<usize> = (1..=rank).map(|k| word(k) as usize).collect();
    let expected = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    let payload_len = bytes.len() - header_len;
    if expected != Some(payload_len) {
        let expected = expected.map_or("more than 2⁶⁴".into(), |e| e.to_string());
        let shape = dims
            .iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(" × ");
        return Err(DataError::format(
            path,
            format!("header promises {shape} = {expected} bytes, the payload has {payload_len}"),
        ));
    }
    bytes.drain(..header_len); // a memmove, not a second 47 MB allocation
    Ok((dims, bytes))
}

/// Images file (N, H, W) and labels file (N) → a split with one channel.
pub fn load_pair(images_path: &Path, labels_path: &Path) -> Result<Split> {
    let (dims, pixels) = parse_idx(images_path, read_maybe_gzip(images_path)?, IMAGES_MAGIC)?;
    let (label_dims, labels) = parse_idx(labels_path, read_maybe_gzip(labels_path)?, LABELS_MAGIC)?;
    if label_dims[0] != dims[0] {
        return Err(DataError::format(
            labels_path,
            format!(
                "{} labels for {} images in {}",
                label_dims[0],
                dims[0],
                images_path.display()
            ),
        ));
    }
    if dims.contains(&0) {
        return Err(DataError::format(
            images_path,
            format!(
                "holds no images (shape {} × {} × {})",
                dims[0], dims[1], dims[2]
            ),
        ));
    }
    if let Some(k) = labels.iter().position(|&l| l as u32 >= NUM_CLASSES) {
        return Err(DataError::format(
            labels_path,
            format!("label {} of record {k} is not a digit 0..9", labels[k]),
        ));
    }
    let images = ImageSet {
        count: dims[0],
        channels: 1,
        height: dims[1],
        width: dims[2],
        pixels,
    };
    Ok(Split {
        inputs: Inputs::Images(images),
        labels: labels.into_iter().map(u32::from).collect(),
        release_index: (0..dims[0]).collect(),
    })
}

/// `train-images-idx3-ubyte[.gz]` etc. under `dir`; `prefix` is "train" or "t10k".
pub fn load_split(dir: &Path, prefix: &str) -> Result<Split> {
    let find = |kind: &str| {
        let base = format!("{prefix}-{kind}");
        let candidates = [dir.join(format!("{base}.gz")), dir.join(&base)];
        first_existing(&candidates)
            .cloned()
            .ok_or_else(|| DataError::Unavailable {
                dataset: "mnist".into(),
                problem: format!(
                    "neither {} nor {} exists",
                    candidates[0].display(),
                    candidates[1].display()
                ),
            })
    };
    load_pair(&find("images-idx3-ubyte")?, &find("labels-idx1-ubyte")?)
}

pub const CLASS_NAMES: [&str; 10] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"];

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A valid IDX file: magic, dims, payload.
    pub(crate) fn idx(magic: u32, dims: &[u32], payload: &[u8]) -> Vec<u8> {
        let mut out = magic.to_be_bytes().to_vec();
        dims.iter()
            .for_each(|d| out.extend_from_slice(&d.to_be_bytes()));
        out.extend_from_slice(payload);
        out
    }

    #[test]
    fn reads_a_tiny_release() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("train-images-idx3-ubyte"),
            idx(IMAGES_MAGIC, &[2, 2, 3], &[1; 12]),
        )
        .unwrap();
        std::fs::write(
            dir.path().join("train-labels-idx1-ubyte"),
            idx(LABELS_MAGIC, &[2], &[3, 9]),
        )
        .unwrap();
        let split = load_split(dir.path(), "train").unwrap();
        assert_eq!(split.labels, vec![3, 9]);
        let Inputs::Images(images) = &split.inputs else {
            panic!("images expected")
        };
        assert_eq!(
            (images.count, images.channels, images.height, images.width),
            (2, 1, 2, 3)
        );
    }

    #[test]
    fn corrupt_headers_are_errors_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x-idx3-ubyte");
        let check = |bytes: Vec<u8>, needle: &str| {
            std::fs::write(&path, bytes).unwrap();
            let err = parse_idx(&path, std::fs::read(&path).unwrap(), IMAGES_MAGIC)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("x-idx3-ubyte") && err.contains(needle),
                "{err}"
            );
        };
        check(idx(0x0000_0801, &[2, 2, 3], &[0; 12]), "magic");
        check(idx(IMAGES_MAGIC, &[2, 2, 3], &[0; 11]), "payload has 11");
        check(idx(IMAGES_MAGIC, &[2, 2, 3], &[0; 13]), "payload has 13");
        check(vec![0, 0, 8], "shorter than an IDX header");
    }
}
