//! What every loader shares: the error type (always naming the file), whole-file reads with
//! transparent gzip, and checksums.

use std::io::Read;
use std::path::{Path, PathBuf};

use md5::Md5;
use sha2::{Digest, Sha256};

/// A data file that could not be read or does not hold what its format promises.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("{}: {source}", crate::excerpt::path(path))]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {problem}", crate::excerpt::path(path))]
    Format { path: PathBuf, problem: String },
    #[error("{dataset}: {problem}")]
    Unavailable { dataset: String, problem: String },
    /// Not a file that can be read as one ([`crate::io::open_input`]): its message names it.
    #[error("{0}")]
    Input(String),
}

impl DataError {
    pub fn format(path: &Path, problem: impl Into<String>) -> Self {
        DataError::Format {
            path: path.to_path_buf(),
            problem: problem.into(),
        }
    }

    pub fn io(path: &Path, source: std::io::Error) -> Self {
        DataError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

pub type Result<T, E = DataError> = std::result::Result<T, E>;

impl DataError {
    fn input(err: anyhow::Error) -> Self {
        DataError::Input(format!("{err:#}"))
    }
}

/// Data file `path` opened the one way inputs are ([`crate::io::open_input`]): a regular file
/// of at most [`crate::io::limits::DATA_FILE`] bytes, opened without blocking.
pub fn open_data(path: &Path) -> Result<std::fs::File> {
    crate::io::open_input(path, crate::io::limits::DATA_FILE)
        .map(|(file, _)| file)
        .map_err(DataError::input)
}

/// The whole of data file `path` ([`open_data`]).
pub fn read_data(path: &Path) -> Result<Vec<u8>> {
    crate::io::read_input(path, crate::io::limits::DATA_FILE).map_err(DataError::input)
}

/// [`read_data`] as UTF-8 text.
pub fn read_data_text(path: &Path) -> Result<String> {
    crate::io::read_input_text(path, crate::io::limits::DATA_FILE).map_err(DataError::input)
}

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// The file's bytes, gunzipped when it starts with the gzip magic (whatever its name); the
/// unpacked bytes are bounded as a data file is.
pub fn read_maybe_gzip(path: &Path) -> Result<Vec<u8>> {
    let raw = read_data(path)?;
    if !raw.starts_with(&GZIP_MAGIC) {
        return Ok(raw);
    }
    // A gzip footer stores the uncompressed size mod 2³²: a good first guess for the buffer.
    let hint = raw
        .len()
        .checked_sub(4)
        .map(|at| u32::from_le_bytes(raw[at..].try_into().unwrap()) as usize);
    let limit = crate::io::limits::DATA_FILE;
    let mut out = Vec::with_capacity(hint.unwrap_or(raw.len() * 4).min(1 << 31));
    flate2::read::GzDecoder::new(&raw[..])
        .take(limit + 1)
        .read_to_end(&mut out)
        .map_err(|e| DataError::format(path, format!("truncated or corrupt gzip stream ({e})")))?;
    if out.len() as u64 > limit {
        return Err(DataError::format(
            path,
            format!("unpacks to more than the {limit} bytes a data file may hold"),
        ));
    }
    Ok(out)
}

pub use crate::excerpt::quote as excerpt;

/// The first existing path among `candidates`.
pub fn first_existing(candidates: &[PathBuf]) -> Option<&PathBuf> {
    candidates.iter().find(|p| crate::io::is_present(p))
}

/// Hex digests of a file, streamed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Digests {
    pub sha256: String,
    pub md5: String,
    pub bytes: u64,
}

pub fn digests(path: &Path) -> Result<Digests> {
    // Backbone weights are digested too: the larger of the two limits.
    let (mut file, _) =
        crate::io::open_input(path, crate::io::limits::TENSORS).map_err(DataError::input)?;
    let (mut sha, mut md5) = (Sha256::new(), Md5::new());
    let mut buf = vec![0u8; 1 << 20];
    let mut bytes = 0u64;
    loop {
        let read = file.read(&mut buf).map_err(|e| DataError::io(path, e))?;
        if read == 0 {
            break;
        }
        sha.update(&buf[..read]);
        md5.update(&buf[..read]);
        bytes += read as u64;
    }
    Ok(Digests {
        sha256: crate::io::hex(&sha.finalize()),
        md5: crate::io::hex(&md5.finalize()),
        bytes,
    })
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    crate::io::hex(&Sha256::digest(bytes))
}

/// A release's class-name file: one name per line (blank lines ignored), `expected` of them.
pub fn class_names(path: &Path, expected: usize) -> Result<Vec<String>> {
    let text = read_data_text(path)?;
    let names: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect();
    if names.len() != expected {
        return Err(DataError::format(
            path,
            format!("{} class names, expected {expected}", names.len()),
        ));
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn gzip_is_detected_by_content() {
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("plain.bin");
        std::fs::write(&plain, b"hello").unwrap();
        assert_eq!(read_maybe_gzip(&plain).unwrap(), b"hello");
        let zipped = dir.path().join("noext");
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(&[7u8; 10_000]).unwrap();
        let gz = enc.finish().unwrap();
        std::fs::write(&zipped, &gz).unwrap();
        assert_eq!(read_maybe_gzip(&zipped).unwrap(), vec![7u8; 10_000]);
        // Truncated: an error naming the file, not a panic.
        std::fs::write(&zipped, &gz[..gz.len() / 2]).unwrap();
        let err = read_maybe_gzip(&zipped).unwrap_err().to_string();
        assert!(err.contains("noext") && err.contains("gzip"), "{err}");
    }

    #[test]
    fn digests_of_a_known_string() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("abc");
        std::fs::write(&path, b"abc").unwrap();
        let d = digests(&path).unwrap();
        assert_eq!(
            d.sha256,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(d.md5, "900150983cd24fb0d6963f7d28e17f72");
        assert_eq!(d.bytes, 3);
        assert_eq!(sha256_hex(b"abc"), d.sha256);
    }
}
