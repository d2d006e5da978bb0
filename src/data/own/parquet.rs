//! Hugging Face datasets' Parquet files (`hf:` sources), read with apache/arrow-rs's `parquet`
//! crate, row by row. The input column holds texts (a string column) or images (an `Image`
//! feature: a struct of the encoded file's `bytes` and its `path`); the label column holds
//! integers or strings. Classes: the label's `ClassLabel` names where the dataset's metadata gives
//! them (the `huggingface` key `datasets` writes into every Parquet file, and the hub keeps), the
//! integers being their indices; otherwise [`super::classes`]' order.

use std::path::{Path, PathBuf};

use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::{Field, Row};

use super::classes::{self, Label};
use super::images::{EncodedImage, decode_set};
use super::pool::Loaded;
use super::pool::Splits;
use crate::data::files::{DataError, Result};
use crate::data::samples::{Inputs, Split};

/// The input column and what it holds.
#[derive(Clone, Copy, Debug)]
pub enum Input<'a> {
    Image(&'a str),
    Text(&'a str),
}

impl Input<'_> {
    fn column(self) -> &'static str {
        match self {
            Input::Image(_) => "image",
            Input::Text(_) => "text",
        }
    }

    fn name(&self) -> &str {
        match self {
            Input::Image(c) | Input::Text(c) => c,
        }
    }
}

/// One split's rows as read.
#[derive(Default)]
struct SplitRows {
    texts: Vec<String>,
    /// EncodedImage images, each with where it was read (for the error of one that does not decode).
    images: Vec<(PathBuf, Vec<u8>)>,
    labels: Vec<(Label, String)>,
}

/// The dataset of `files` (names in the hub's layout, train's first).
pub fn load(files: &[(String, PathBuf)], input: Input, label: &str) -> Result<Loaded> {
    let mut parts: Vec<(&str, SplitRows)> = Vec::new();
    // Each part's first file, named when its images as a whole are over the memory budget.
    let mut part_files: Vec<&Path> = Vec::new();
    let mut class_label: Option<(PathBuf, Vec<String>)> = None;
    for (name, path) in files {
        let split = name.split('/').nth(1).unwrap_or("train");
        let split = split.strip_prefix("partial-").unwrap_or(split);
        if parts.last().is_none_or(|(s, _)| *s != split) {
            parts.push((split, SplitRows::default()));
            part_files.push(path);
        }
        let rows = &mut parts.last_mut().unwrap().1;
        let names = read_file(path, input, label, rows)?;
        match (&class_label, names) {
            (None, Some(names)) => class_label = Some((path.clone(), names)),
            (Some((first, known)), Some(names)) if *known != names => {
                return Err(DataError::format(
                    path,
                    format!(
                        "its ClassLabel names for {label:?} differ from {}'s",
                        first.display()
                    ),
                ));
            }
            _ => {}
        }
    }
    let all_labels: Vec<(Label, String)> = parts
        .iter()
        .flat_map(|(_, rows)| rows.labels.iter().cloned())
        .collect();
    let (class_names, indices) = match &class_label {
        Some((path, names)) => (
            names.clone(),
            class_label_indices(path, names, &all_labels)?,
        ),
        None => classes::assign(&all_labels)
            .map_err(|why| DataError::format(&files[0].1, format!("column {label:?}: {why}")))?,
    };
    if let [(_, train), (_, test)] = &parts[..] {
        classes::refuse_test_only(
            train.labels.iter().map(|(label, _)| label),
            test.labels.iter().map(|(label, at)| (label, at.as_str())),
        )
        .map_err(|why| DataError::format(&files[files.len() - 1].1, why))?;
    }
    let mut indices = indices.into_iter();
    let mut warnings = Vec::new();
    let mut splits = Vec::new();
    for (k, (_, rows)) in parts.into_iter().enumerate() {
        let path = part_files[k];
        let labels: Vec<u32> = indices.by_ref().take(rows.labels.len()).collect();
        let (inputs, notes) = inputs_of(rows, input, path)?;
        warnings.extend(notes);
        splits.push(Split::complete(inputs, labels));
    }
    if let [train, test] = &splits[..]
        && let (Inputs::Images(a), Inputs::Images(b)) = (&train.inputs, &test.inputs)
        && (a.channels, a.height, a.width) != (b.channels, b.height, b.width)
    {
        return Err(DataError::format(
            &files[files.len() - 1].1,
            format!(
                "the test images are {}×{}×{}, the training images {}×{}×{}: one size and colour for both",
                b.channels, b.height, b.width, a.channels, a.height, a.width
            ),
        ));
    }
    warnings.dedup();
    let splits = Splits::of(splits);
    Ok(Loaded {
        class_names,
        splits,
        warnings,
    })
}

/// A split's inputs from its rows: the texts, or its images decoded under the memory budget
/// (`path`, its first file, named when they are over it), with the deviations to say.
fn inputs_of(rows: SplitRows, input: Input, path: &Path) -> Result<(Inputs, Vec<String>)> {
    match input {
        Input::Text(_) => Ok((Inputs::Texts(rows.texts), Vec::new())),
        Input::Image(_) => {
            let sources: Vec<EncodedImage> = rows
                .images
                .into_iter()
                .map(|(at, bytes)| EncodedImage::Bytes { at, bytes })
                .collect();
            let (images, notes) = decode_set(&sources, path)?;
            Ok((Inputs::Images(images), notes))
        }
    }
}

/// Label indices against ClassLabel names: integers below their count (a `-1`, the hub's "no
/// label" of unlabelled test splits, is refused).
fn class_label_indices(
    path: &Path,
    names: &[String],
    labels: &[(Label, String)],
) -> Result<Vec<u32>> {
    labels
        .iter()
        .map(|(label, at)| match label {
            Label::Number(k)
                if let Ok(k) = k.parse::<u32>()
                    && (k as usize) < names.len() =>
            {
                Ok(k)
            }
            other => Err(DataError::format(
                path,
                format!(
                    "{at}: label {} is not one of the {} ClassLabel classes (0 to {}); an unlabelled split cannot be trained or scored",
                    crate::excerpt::quote(other.name()),
                    names.len(),
                    names.len().saturating_sub(1)
                ),
            )),
        })
        .collect()
}

/// `label`'s ClassLabel names from the file's `huggingface` metadata, if it has them.
fn class_label_names(
    reader: &SerializedFileReader<std::fs::File>,
    label: &str,
) -> Option<Vec<String>> {
    let metadata = reader.metadata().file_metadata().key_value_metadata()?;
    let value = metadata
        .iter()
        .find(|kv| kv.key == "huggingface")?
        .value
        .as_ref()?;
    let info: serde_json::Value = serde_json::from_str(value).ok()?;
    let feature = &info["info"]["features"][label];
    if feature["_type"] != "ClassLabel" {
        return None;
    }
    feature["names"]
        .as_array()?
        .iter()
        .map(|n| n.as_str().map(str::to_string))
        .collect::<Option<Vec<String>>>()
        // A ClassLabel without names says nothing: the labels are read as they are.
        .filter(|names| !names.is_empty())
}

/// Reads `path`'s rows into `rows`; returns its ClassLabel names, if any.
fn read_file(
    path: &Path,
    input: Input,
    label: &str,
    rows: &mut SplitRows,
) -> Result<Option<Vec<String>>> {
    let file = crate::data::files::open_data(path)?;
    let reader = SerializedFileReader::new(file)
        .map_err(|e| DataError::format(path, format!("not a Parquet file ({e})")))?;
    let columns: Vec<String> = reader
        .metadata()
        .file_metadata()
        .schema_descr()
        .root_schema()
        .get_fields()
        .iter()
        .map(|f| f.name().to_string())
        .collect();
    for (what, column) in [(input.column(), input.name()), ("label", label)] {
        if !columns.iter().any(|c| c == column) {
            return Err(DataError::format(
                path,
                format!(
                    "no {what} column {} (its columns: {}); name it in the source: hf:…#{what}=COLUMN",
                    crate::excerpt::quote(column),
                    crate::excerpt::list(&columns)
                ),
            ));
        }
    }
    let names = class_label_names(&reader, label);
    let file_name = path
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let iter = reader
        .get_row_iter(None)
        .map_err(|e| DataError::format(path, format!("unreadable rows ({e})")))?;
    for (k, row) in iter.enumerate() {
        let row = row.map_err(|e| DataError::format(path, format!("row {k}: unreadable ({e})")))?;
        let at = format!("{file_name} row {k}");
        read_row(&row, (path, k, at), (input, label), rows)
            .map_err(|what| DataError::format(path, format!("row {k}: {what}")))?;
    }
    Ok(names)
}

/// Row `k` of `path` (shown as `at`) into `rows`: its input and its label; the error is the
/// reason alone.
fn read_row(
    row: &Row,
    (path, k, at): (&Path, usize, String),
    (input, label): (Input, &str),
    rows: &mut SplitRows,
) -> std::result::Result<(), String> {
    let value = |column: &str| field(row, column).ok_or(format!("no value in {column:?}"));
    match (input, value(input.name())?) {
        (Input::Text(_), Field::Str(text)) if text.trim().is_empty() => {
            return Err("an empty text (every sample needs some text)".into());
        }
        (Input::Text(_), Field::Str(text)) => rows.texts.push(text.clone()),
        (Input::Image(_), Field::Group(image)) => match field(image, "bytes") {
            Some(Field::Bytes(bytes)) => rows.images.push((
                PathBuf::from(format!("{} row {k}", path.display())),
                bytes.data().to_vec(),
            )),
            _ => {
                return Err(format!(
                    "the image in {:?} holds no encoded bytes (an image stored by path only cannot be read)",
                    input.name()
                ));
            }
        },
        (Input::Text(c), other) => return Err(format!("{c:?} holds {other}, not a string")),
        (Input::Image(c), other) => {
            return Err(format!(
                "{c:?} holds {other}, not an Image feature (a struct of bytes and path)"
            ));
        }
    }
    let label_value = match value(label)? {
        // Every integer width, signed or not (pandas writes uint8 labels as UINT_8).
        Field::Long(v) => Label::integer(v),
        Field::Int(v) => Label::integer(v),
        Field::Short(v) => Label::integer(v),
        Field::Byte(v) => Label::integer(v),
        Field::ULong(v) => Label::integer(v),
        Field::UInt(v) => Label::integer(v),
        Field::UShort(v) => Label::integer(v),
        Field::UByte(v) => Label::integer(v),
        Field::Str(s) if !s.is_empty() => Label::Word(s.clone()),
        other => {
            return Err(format!(
                "label {other} is neither an integer nor a non-empty string"
            ));
        }
    };
    rows.labels.push((label_value, at));
    Ok(())
}

/// The value of `column` in `row`.
fn field<'a>(row: &'a Row, column: &str) -> Option<&'a Field> {
    row.get_column_iter()
        .find(|(name, _)| *name == column)
        .map(|(_, f)| f)
}
