//! `csv:PATH` and `jsonl:PATH`: texts with labels. PATH is one file (one pool, split by
//! [`super::pool`]) or a folder holding `train.csv` and `test.csv` (`.jsonl` alike).
//!
//! CSV: a header row, then one row per sample (RFC 4180 quoting, as Python's `csv` and pandas
//! write); a column is named by its header or by its 0-based index. JSONL: one JSON object per
//! line (blank lines skipped); a column is a key; the text must be a string, the label an integer
//! or a string. Labels become classes in [`super::classes`]' order; samples keep the file's order.

use std::path::{Path, PathBuf};

use super::classes::{self, Label};
use super::pool::Loaded;
use super::pool::Splits;
use super::source::OwnKind;
use crate::data::files::{DataError, Result};
use crate::data::samples::{Inputs, Split};
use crate::excerpt::{list, quote};

/// Which columns hold the text and the label.
pub struct Columns<'a> {
    pub text: &'a str,
    pub label: &'a str,
}

fn extension(kind: OwnKind) -> &'static str {
    match kind {
        OwnKind::Csv => "csv",
        _ => "jsonl",
    }
}

/// The file, or the folder's train and test files.
pub fn files(path: &Path, kind: OwnKind) -> Result<Vec<PathBuf>> {
    if path.is_dir() {
        let ext = extension(kind);
        let pair: Vec<PathBuf> = ["train", "test"]
            .iter()
            .map(|part| path.join(format!("{part}.{ext}")))
            .collect();
        if let Some(missing) = pair.iter().find(|p| !crate::io::is_present(p)) {
            return Err(DataError::format(
                missing,
                format!("missing: a {ext}: folder holds train.{ext} and test.{ext}"),
            ));
        }
        return Ok(pair);
    }
    if !crate::io::is_present(path) {
        return Err(DataError::format(
            path,
            format!(
                "no such file (expected a .{} file, or a folder holding train and test files)",
                extension(kind)
            ),
        ));
    }
    Ok(vec![path.to_path_buf()])
}

/// One sample as read: its text, its label and where it was (`train.csv line 3`).
type TableSample = (String, Label, String);

pub fn load(path: &Path, kind: OwnKind, columns: &Columns) -> Result<Loaded> {
    let files = files(path, kind)?;
    let mut parts = Vec::new();
    for file in &files {
        let rows = match kind {
            OwnKind::Csv => read_csv(file, columns)?,
            _ => read_jsonl(file, columns)?,
        };
        if rows.is_empty() {
            return Err(DataError::format(file, "holds no samples"));
        }
        parts.push(rows);
    }
    let labels: Vec<(Label, String)> = parts
        .iter()
        .flatten()
        .map(|(_, label, at)| (label.clone(), at.clone()))
        .collect();
    let (class_names, indices) = classes::assign(&labels).map_err(|why| {
        DataError::format(path, format!("column {}: {why}", quote(columns.label)))
    })?;
    if let [train, test] = &parts[..] {
        classes::refuse_test_only(
            train.iter().map(|(_, label, _)| label),
            test.iter().map(|(_, label, at)| (label, at.as_str())),
        )
        .map_err(|why| DataError::format(&files[1], why))?;
    }
    let mut indices = indices.into_iter();
    let splits: Vec<Split> = parts
        .into_iter()
        .map(|rows| {
            let labels = indices.by_ref().take(rows.len()).collect();
            let texts = rows.into_iter().map(|(text, _, _)| text).collect();
            Split::complete(Inputs::Texts(texts), labels)
        })
        .collect();
    let splits = Splits::of(splits);
    Ok(Loaded {
        class_names,
        splits,
        warnings: Vec::new(),
    })
}

fn file_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into(),
    )
}

/// The index of `column` among `headers`: its name (which must name one column only), else a
/// 0-based index.
fn column_index(path: &Path, headers: &csv::StringRecord, column: &str) -> Result<usize> {
    let named: Vec<usize> = headers
        .iter()
        .enumerate()
        .filter(|(_, h)| *h == column)
        .map(|(k, _)| k)
        .collect();
    if named.len() > 1 {
        return Err(DataError::format(
            path,
            format!(
                "the header names {} columns {} (columns {}); rename one, or name the column by its index",
                named.len(),
                quote(column),
                list(named.iter().map(|k| k.to_string()))
            ),
        ));
    }
    named
        .first()
        .copied()
        .or_else(|| column.parse::<usize>().ok().filter(|&k| k < headers.len()))
        .ok_or_else(|| {
            DataError::format(
                path,
                format!(
                    "no column {} (its header has {}); name the column with --text-column / --label-column",
                    quote(column),
                    list(headers.iter())
                ),
            )
        })
}

/// A sample's text, refused when it is empty or only whitespace: it would reach the backbone as
/// padding alone and fail far from here.
fn checked_text(path: &Path, line: u64, text: String) -> Result<String> {
    if text.trim().is_empty() {
        return Err(DataError::format(
            path,
            format!("line {line}: an empty text (every sample needs some text)"),
        ));
    }
    Ok(text)
}

fn read_csv(path: &Path, columns: &Columns) -> Result<Vec<TableSample>> {
    let bytes = crate::data::files::read_data(path)?;
    let mut reader = csv::ReaderBuilder::new().from_reader(&bytes[..]);
    let bad = |e: csv::Error| {
        DataError::format(
            path,
            format!(
                "not a CSV file with a header row: {}",
                crate::excerpt::line(&e.to_string(), crate::excerpt::SHOWN * 2)
            ),
        )
    };
    let headers = reader.headers().map_err(bad)?.clone();
    let text = column_index(path, &headers, columns.text)?;
    let label = column_index(path, &headers, columns.label)?;
    let name = file_name(path);
    let mut rows = Vec::new();
    for record in reader.records() {
        let record = record.map_err(bad)?;
        let line = record
            .position()
            .map_or(0, |p| line_of(&bytes, p.byte() as usize));
        let at = format!("{name} line {line}");
        let cell = &record[label];
        if cell.is_empty() {
            return Err(DataError::format(
                path,
                format!("line {line}: an empty label"),
            ));
        }
        let sample = checked_text(path, line, record[text].to_string())?;
        rows.push((sample, Label::of_text(cell), at));
    }
    Ok(rows)
}

/// The 1-based line of byte `at` in `bytes`, counting `\n` (so `\r\n` files count as `\n` ones;
/// the csv crate's own line count is one short after a quoted field with CRLF line ends).
fn line_of(bytes: &[u8], at: usize) -> u64 {
    // After a CRLF the csv crate starts the next record at the `\n` (the `\r` ended the last):
    // line ends at the start belong to the line before. A record never starts with a blank line.
    let mut at = at.min(bytes.len());
    while at < bytes.len() && matches!(bytes[at], b'\r' | b'\n') {
        at += 1;
    }
    1 + bytes[..at].iter().filter(|&&b| b == b'\n').count() as u64
}

fn read_jsonl(path: &Path, columns: &Columns) -> Result<Vec<TableSample>> {
    let text = crate::data::files::read_data_text(path)?;
    // A byte-order mark, as a CSV may start with one: skipped, not taken for JSON.
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    let name = file_name(path);
    let mut rows = Vec::new();
    for (k, line) in text.lines().enumerate() {
        let line_number = k + 1;
        if line.trim().is_empty() {
            continue;
        }
        let problem = |what: String| DataError::format(path, format!("line {line_number}: {what}"));
        let serde_json::Value::Object(object) = serde_json::from_str(line)
            .map_err(|e| problem(format!("not a JSON object ({e}): {}", quote(line))))?
        else {
            return Err(problem(format!("not a JSON object: {}", quote(line))));
        };
        let field = |key: &str| {
            object.get(key).ok_or_else(|| {
                problem(format!(
                    "no key {} (the object has {}); name the column with --text-column / --label-column",
                    quote(key),
                    list(object.keys())
                ))
            })
        };
        let sample = match field(columns.text)? {
            serde_json::Value::String(s) => checked_text(path, line_number as u64, s.clone())?,
            other => {
                return Err(problem(format!(
                    "text {} is not a string",
                    quote(&other.to_string())
                )));
            }
        };
        let label = match field(columns.label)? {
            serde_json::Value::String(s) if !s.is_empty() => Label::Word(s.clone()),
            serde_json::Value::Number(n) if n.is_i64() || n.is_u64() => Label::integer(n),
            other => {
                return Err(problem(format!(
                    "label {} is neither an integer nor a non-empty string",
                    quote(&other.to_string())
                )));
            }
        };
        rows.push((sample, label, format!("{name} line {line_number}")));
    }
    Ok(rows)
}
