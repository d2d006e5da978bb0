//! `.npz` archives (a zip of `.npy` arrays, as numpy's `savez` writes them), read by this module
//! rather than by candle: nothing is allocated from what a header declares until the declaration
//! has been checked against the zip entry's uncompressed size, the data-file limit and the memory
//! this process may still take, and the dtype is the npy header's own `descr` (a bool array,
//! `|b1`, is not taken for bytes).

use std::io::Read;
use std::path::Path;

use super::files::{DataError, Result};

/// An element type an array is read as, by its npy `descr`.
pub trait NpyElement: Sized + Copy {
    /// The `descr` numpy writes for it.
    const DESCR: &'static str;
    /// Other spellings of it (a byte has no byte order: candle writes `<u1`).
    const ALSO: &'static [&'static str] = &[];
    fn from_le(bytes: &[u8]) -> Self;
}

impl NpyElement for u8 {
    const DESCR: &'static str = "|u1";
    const ALSO: &'static [&'static str] = &["<u1", ">u1", "=u1"];
    fn from_le(bytes: &[u8]) -> Self {
        bytes[0]
    }
}

impl NpyElement for i64 {
    const DESCR: &'static str = "<i8";
    fn from_le(bytes: &[u8]) -> Self {
        i64::from_le_bytes(bytes.try_into().expect("8 bytes"))
    }
}

/// Longest npy header read (numpy pads its headers to 64-byte multiples; real ones are < 200).
const MAX_HEADER: usize = 1 << 16;

/// What an npy header declares.
#[derive(Debug, PartialEq)]
struct NpyHeader {
    descr: String,
    fortran_order: bool,
    shape: Vec<usize>,
}

/// Array `name` of the archive at `path` as (shape, values), checking that numpy stored it as
/// `T` (`|u1` for u8, `<i8` for i64).
pub fn read_array<T: NpyElement>(path: &Path, name: &str) -> Result<(Vec<usize>, Vec<T>)> {
    let file = super::files::open_data(path)?;
    let bad = |what: String| DataError::format(path, format!("array {name}: {what}"));
    let mut archive = zip::ZipArchive::new(file)
        .map_err(|e| DataError::format(path, format!("not readable as .npz (not a zip: {e})")))?;
    let member = format!("{name}.npy");
    let mut entry = match archive.by_name(&member) {
        Ok(entry) => entry,
        Err(zip::result::ZipError::FileNotFound) => {
            return Err(DataError::format(path, format!("missing array {name}")));
        }
        Err(e) => return Err(bad(format!("not readable as .npz ({e})"))),
    };
    let declared_size = entry.size();
    let limit = crate::io::limits::DATA_FILE;
    if declared_size > limit {
        return Err(bad(format!(
            "its zip entry unpacks to {declared_size} bytes, more than the {limit} a data file may hold"
        )));
    }
    let (header, header_bytes) = read_header(&mut entry).map_err(&bad)?;
    if header.descr != T::DESCR && !T::ALSO.contains(&header.descr.as_str()) {
        return Err(bad(format!(
            "dtype {} ({}), expected {} ({})",
            crate::excerpt::quote(&header.descr),
            dtype_name(&header.descr),
            T::DESCR,
            dtype_name(T::DESCR)
        )));
    }
    let multi_dim = header.shape.iter().filter(|&&d| d > 1).count() > 1;
    if header.fortran_order && multi_dim {
        return Err(bad(
            "stored in Fortran order; save it with numpy's default (C) order".into(),
        ));
    }
    let item = std::mem::size_of::<T>() as u64;
    let held = declared_size.saturating_sub(header_bytes as u64);
    let bytes = declared_bytes(&header, item, held).map_err(&bad)?;
    let room = crate::limits::Available::now();
    if bytes as f64 > room.bytes {
        return Err(bad(format!(
            "{bytes} bytes, more than the {:.0} this process may still take ({})",
            room.bytes, room.source
        )));
    }
    let mut raw: Vec<u8> = Vec::new();
    raw.try_reserve_exact(bytes as usize)
        .map_err(|_| bad(format!("cannot allocate its {bytes} bytes")))?;
    entry
        .take(bytes + 1)
        .read_to_end(&mut raw)
        .map_err(|e| bad(format!("truncated or corrupt ({e})")))?;
    if raw.len() as u64 != bytes {
        return Err(bad(format!(
            "holds {} data bytes, its header declares {bytes}",
            raw.len()
        )));
    }
    let values = if item == 1 {
        raw.iter()
            .map(|b| T::from_le(std::slice::from_ref(b)))
            .collect()
    } else {
        raw.chunks_exact(item as usize).map(T::from_le).collect()
    };
    Ok((header.shape, values))
}

/// The data bytes `header` declares at `item` bytes an element, which must be the `held` bytes
/// its zip entry holds after the header (no product overflows: a lie is refused, not wrapped).
fn declared_bytes(header: &NpyHeader, item: u64, held: u64) -> std::result::Result<u64, String> {
    header
        .shape
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d as u64))
        .and_then(|count| count.checked_mul(item))
        .filter(|&bytes| bytes == held)
        .ok_or_else(|| {
            format!(
                "its header declares shape {:?} of {}, which its zip entry's {held} data bytes do not hold",
                header.shape, header.descr
            )
        })
}

/// candle's name of an npy dtype, for messages (`<f4` is F32).
fn dtype_name(descr: &str) -> &'static str {
    match descr {
        "|u1" | "<u1" | ">u1" | "=u1" => "U8",
        "|b1" => "bool",
        "<i8" => "I64",
        "<i4" => "I32",
        "<u4" => "U32",
        "<f2" => "F16",
        "<f4" => "F32",
        "<f8" => "F64",
        _ => "another dtype",
    }
}

/// The npy header at the start of `reader`, and its length in bytes (magic and length included).
fn read_header(reader: &mut impl Read) -> std::result::Result<(NpyHeader, usize), String> {
    let mut start = [0u8; 8];
    reader
        .read_exact(&mut start)
        .map_err(|e| format!("not an .npy array ({e})"))?;
    if &start[..6] != b"\x93NUMPY" {
        return Err("not an .npy array (no \\x93NUMPY magic)".into());
    }
    let (length, prefix) = match start[6] {
        1 => {
            let mut len = [0u8; 2];
            reader.read_exact(&mut len).map_err(|e| e.to_string())?;
            (u16::from_le_bytes(len) as usize, 10)
        }
        2 | 3 => {
            let mut len = [0u8; 4];
            reader.read_exact(&mut len).map_err(|e| e.to_string())?;
            (u32::from_le_bytes(len) as usize, 12)
        }
        v => return Err(format!("npy format version {v}, expected 1, 2 or 3")),
    };
    if length > MAX_HEADER {
        return Err(format!(
            "an npy header of {length} bytes (at most {MAX_HEADER})"
        ));
    }
    let mut text = vec![0u8; length];
    reader
        .read_exact(&mut text)
        .map_err(|e| format!("truncated npy header ({e})"))?;
    let text = String::from_utf8(text).map_err(|_| "an npy header that is not text".to_string())?;
    Ok((parse_header(&text)?, prefix + length))
}

/// The Python dict literal numpy writes: `{'descr': '<i8', 'fortran_order': False, 'shape': (3, 1), }`.
fn parse_header(text: &str) -> std::result::Result<NpyHeader, String> {
    let quoted = |text: &str| crate::excerpt::quote(text);
    let value_after = |key: &str| -> std::result::Result<&str, String> {
        let at = text
            .find(&format!("'{key}':"))
            .ok_or_else(|| format!("npy header {} has no '{key}'", quoted(text)))?;
        Ok(text[at + key.len() + 3..].trim_start())
    };
    let descr = value_after("descr")?;
    let descr = descr
        .strip_prefix('\'')
        .and_then(|d| d.split_once('\''))
        .map(|(d, _)| d.to_string())
        .ok_or_else(|| format!("npy header {}: unreadable descr", quoted(text)))?;
    let fortran_order = match value_after("fortran_order")? {
        v if v.starts_with("False") => false,
        v if v.starts_with("True") => true,
        _ => {
            return Err(format!(
                "npy header {}: unreadable fortran_order",
                quoted(text)
            ));
        }
    };
    let shape = value_after("shape")?;
    let inner = shape
        .strip_prefix('(')
        .and_then(|s| s.split_once(')'))
        .map(|(s, _)| s)
        .ok_or_else(|| format!("npy header {}: unreadable shape", quoted(text)))?;
    let shape = inner
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| {
            d.parse::<usize>()
                .map_err(|_| format!("npy header: shape entry {} is not a size", quoted(d)))
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(NpyHeader {
        descr,
        fortran_order,
        shape,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use candle_core::Tensor;

    /// Writes an .npz of the given named arrays.
    pub(crate) fn write_npz(path: &Path, arrays: &[(&str, Tensor)]) {
        Tensor::write_npz(arrays, path).unwrap();
    }

    /// A CPU tensor of `data` with `shape`.
    pub(crate) fn array<T: candle_core::WithDType>(shape: &[usize], data: &[T]) -> Tensor {
        Tensor::from_slice(data, shape, &candle_core::Device::Cpu).unwrap()
    }

    #[test]
    fn numpys_headers_parse() {
        let h =
            parse_header("{'descr': '<i8', 'fortran_order': False, 'shape': (3, 1), }").unwrap();
        assert_eq!(
            h,
            NpyHeader {
                descr: "<i8".into(),
                fortran_order: false,
                shape: vec![3, 1]
            }
        );
        let h = parse_header("{'descr': '|u1', 'fortran_order': False, 'shape': (5,), }").unwrap();
        assert_eq!(h.shape, vec![5]);
        let h = parse_header("{'descr': '<f4', 'fortran_order': True, 'shape': (), }").unwrap();
        assert!(h.fortran_order && h.shape.is_empty());
        assert!(
            parse_header("{'descr': '<i8', 'fortran_order': False, 'shape': (-1,), }").is_err()
        );
    }

    #[test]
    fn a_declared_shape_the_entry_does_not_hold_is_refused_before_allocating() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("liar.npz");
        // A valid npy whose header claims 2⁶⁰ labels, zipped.
        let header = "{'descr': '|u1', 'fortran_order': False, 'shape': (1152921504606846976,), }";
        let mut npy = b"\x93NUMPY\x01\x00".to_vec();
        npy.extend((header.len() as u16).to_le_bytes());
        npy.extend(header.as_bytes());
        npy.extend([1u8, 2, 3]);
        let file = std::fs::File::create(&path).unwrap();
        let mut zip = zip::ZipWriter::new(file);
        zip.start_file("train_labels.npy", zip::write::SimpleFileOptions::default())
            .unwrap();
        std::io::Write::write_all(&mut zip, &npy).unwrap();
        zip.finish().unwrap();
        let err = read_array::<u8>(&path, "train_labels")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("liar.npz") && err.contains("declares shape [1152921504606846976]"),
            "{err}"
        );
        assert!(err.len() < 300, "{err}");
    }
}
