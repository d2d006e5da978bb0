//! SST-2 as GLUE releases it (`SST-2/` in `SST-2.zip`): `train.tsv` and `dev.tsv` with the header
//! `sentence<TAB>label`, one sentence and its label (0 negative, 1 positive) per line, no
//! quoting. GLUE's `test.tsv` has no labels, so the test set is `dev.tsv`, the 872 sentences of
//! the validation split, as the authors scored (docs/protocol.md §3).

use std::path::Path;

use super::files::{DataError, Result};
use super::samples::{Inputs, Split};

/// The folder the release's zip unpacks to, inside the dataset folder.
pub const FOLDER: &str = "SST-2";
pub const CLASS_NAMES: [&str; 2] = ["negative", "positive"];
const HEADER: &str = "sentence\tlabel";

/// One labelled GLUE file (`train.tsv` or `dev.tsv`).
pub fn load_tsv(path: &Path) -> Result<Split> {
    let text = super::files::read_data_text(path)?;
    let mut lines = text.lines();
    match lines.next().map(|l| l.trim_end_matches('\r')) {
        Some(HEADER) => {}
        other => {
            return Err(DataError::format(
                path,
                format!(
                    "header {other:?}, expected \"sentence\\tlabel\" (GLUE's labelled SST-2 files)"
                ),
            ));
        }
    }
    let (mut texts, mut labels) = (Vec::new(), Vec::new());
    for (k, line) in lines.enumerate() {
        let line_no = k + 2;
        let line = line.trim_end_matches('\r');
        if line.is_empty() {
            continue;
        }
        // The sentence may hold any character but a tab; the label is after the last one.
        let (sentence, label) = line.rsplit_once('\t').ok_or_else(|| {
            DataError::format(
                path,
                format!("line {line_no}: no tab between sentence and label"),
            )
        })?;
        let label = match label.trim() {
            "0" => 0,
            "1" => 1,
            other => {
                return Err(DataError::format(
                    path,
                    format!(
                        "line {line_no}: label {}, expected 0 or 1",
                        super::files::excerpt(other)
                    ),
                ));
            }
        };
        texts.push(sentence.to_string());
        labels.push(label);
    }
    if labels.is_empty() {
        return Err(DataError::format(path, "no labelled sentences"));
    }
    Ok(Split::complete(Inputs::Texts(texts), labels))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_glue_rows_and_refuses_bad_ones_by_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("train.tsv");
        std::fs::write(
            &path,
            "sentence\tlabel\nit 's \"fine\" , really \t1\nbad\t0\n",
        )
        .unwrap();
        let split = load_tsv(&path).unwrap();
        assert_eq!(split.labels, [1, 0]);
        assert_eq!(
            split.inputs,
            Inputs::Texts(vec!["it 's \"fine\" , really ".into(), "bad".into()])
        );
        std::fs::write(&path, "sentence\tlabel\nok\t1\nworse\t2\n").unwrap();
        let err = load_tsv(&path).unwrap_err().to_string();
        assert!(err.contains("line 3: label \"2\""), "{err}");
        std::fs::write(&path, "index\tsentence\n0\tno labels\n").unwrap();
        let err = load_tsv(&path).unwrap_err().to_string();
        assert!(err.contains("header"), "{err}");
    }
}
