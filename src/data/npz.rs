//! `.npz` archives (a zip of `.npy` arrays, as numpy's `savez` writes them), read with candle's
//! npy support: typed reads that name the file and the array when something is missing or of the
//! wrong dtype.

use std::path::Path;

use candle_core::{DType, Tensor};

use super::files::{DataError, Result};

/// Array `name` of the archive at `path` as (shape, values), checking that numpy stored it as
/// `dtype` (u8 for `|u1`, i64 for `<i8`).
pub fn read_array<T: candle_core::WithDType>(
    path: &Path,
    name: &str,
    dtype: DType,
) -> Result<(Vec<usize>, Vec<T>)> {
    // Checked as every input is (a regular file of a data file's size) before candle opens it.
    drop(super::files::open_data(path)?);
    let array = Tensor::read_npz_by_name(path, &[name])
        .map_err(|e| {
            let message = e.to_string();
            if message.contains("no array for") {
                DataError::format(path, format!("missing array {name}"))
            } else {
                DataError::format(
                    path,
                    format!("array {name}: not readable as .npz ({message})"),
                )
            }
        })?
        .remove(0);
    if array.dtype() != dtype {
        return Err(DataError::format(
            path,
            format!(
                "array {name}: dtype {:?}, expected {dtype:?}",
                array.dtype()
            ),
        ));
    }
    let shape = array.dims().to_vec();
    let values = array
        .flatten_all()
        .and_then(|a| a.to_vec1::<T>())
        .map_err(|e| DataError::format(path, format!("array {name}: {e}")))?;
    Ok((shape, values))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Writes an .npz of the given named arrays.
    pub(crate) fn write_npz(path: &Path, arrays: &[(&str, Tensor)]) {
        Tensor::write_npz(arrays, path).unwrap();
    }

    /// A CPU tensor of `data` with `shape`.
    pub(crate) fn array<T: candle_core::WithDType>(shape: &[usize], data: &[T]) -> Tensor {
        Tensor::from_slice(data, shape, &candle_core::Device::Cpu).unwrap()
    }
}
