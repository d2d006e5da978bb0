//! TREC question classification (Li & Roth 2002) label files: one question per line,
//! "COARSE:fine question words ?", in Latin-1. Only the coarse label is used (6 classes, in the
//! order of the Hugging Face `trec` dataset's `coarse_label`, which the authors used).

use std::path::Path;

use super::files::{DataError, Result};
use super::samples::{Inputs, Split};

pub const CLASS_NAMES: [&str; 6] = ["ABBR", "ENTY", "DESC", "HUM", "LOC", "NUM"];

/// Latin-1 maps every byte to the code point of the same value.
fn decode_latin1(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| char::from(b)).collect()
}

pub fn load_file(path: &Path) -> Result<Split> {
    let bytes = super::files::read_data(path)?;
    let text = decode_latin1(&bytes);
    let (mut texts, mut labels) = (Vec::new(), Vec::new());
    for (k, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let line_no = k + 1;
        let (label, question) = line
            .split_once(' ')
            .filter(|(label, _)| label.contains(':'))
            .ok_or_else(|| {
                DataError::format(
                    path,
                    format!(
                        "line {line_no}: expected \"COARSE:fine question\", found {}",
                        super::files::excerpt(line)
                    ),
                )
            })?;
        let coarse = label.split(':').next().unwrap_or_default();
        let class = CLASS_NAMES
            .iter()
            .position(|c| *c == coarse)
            .ok_or_else(|| {
                DataError::format(
                    path,
                    format!(
                        "line {line_no}: unknown coarse label {} (expected one of {CLASS_NAMES:?})",
                        super::files::excerpt(coarse)
                    ),
                )
            })?;
        labels.push(class as u32);
        texts.push(question.trim_end_matches(['\r', '\n']).to_string());
    }
    if labels.is_empty() {
        return Err(DataError::format(path, "no labelled questions"));
    }
    Ok(Split::complete(Inputs::Texts(texts), labels))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_latin1_and_coarse_labels() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.label");
        std::fs::write(&path, b"LOC:city Which sister\xf0city ?\nNUM:date When ?\n").unwrap();
        let split = load_file(&path).unwrap();
        assert_eq!(split.labels, vec![4, 5]);
        let Inputs::Texts(texts) = &split.inputs else {
            panic!()
        };
        assert_eq!(texts[0], "Which sisterðcity ?");
    }

    #[test]
    fn lines_without_a_colon_label_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.label");
        std::fs::write(&path, b"LOC:city Fine ?\nDESC What is this ?\n").unwrap();
        let err = load_file(&path).unwrap_err().to_string();
        assert!(err.contains("bad.label") && err.contains("line 2"), "{err}");
        std::fs::write(&path, b"XYZ:abc Fine ?\n").unwrap();
        let err = load_file(&path).unwrap_err().to_string();
        assert!(err.contains("unknown coarse label \"XYZ\""), "{err}");
        std::fs::write(&path, b"\n  \n").unwrap();
        let err = load_file(&path).unwrap_err().to_string();
        assert!(
            err.contains("bad.label") && err.ends_with("no labelled questions"),
            "{err}"
        );
    }
}
