//! AG-news CSV as released by Zhang et al. (2015): rows "class","title","description", class
//! 1..4, no header. The text is title + " " + description (as the Hugging Face loader builds it)
//! and the label is class − 1.

use std::path::Path;

use super::files::{DataError, Result};
use super::samples::{Inputs, Split};

const NUM_CLASSES: u32 = 4;

pub fn load_csv(path: &Path) -> Result<Split> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .from_reader(super::files::open_data(path)?);
    let (mut texts, mut labels) = (Vec::new(), Vec::new());
    for (row, record) in reader.records().enumerate() {
        let line = row + 1;
        let record = record.map_err(|e| DataError::format(path, format!("row {line}: {e}")))?;
        if record.len() != 3 {
            return Err(DataError::format(
                path,
                format!(
                    "row {line}: expected 3 columns (class, title, description), found {}",
                    record.len()
                ),
            ));
        }
        let class: u32 = record[0].trim().parse().map_err(|_| {
            DataError::format(
                path,
                format!(
                    "row {line}: class {} is not a number 1..4",
                    super::files::excerpt(&record[0])
                ),
            )
        })?;
        if !(1..=NUM_CLASSES).contains(&class) {
            return Err(DataError::format(
                path,
                format!("row {line}: class {class} outside 1..4"),
            ));
        }
        labels.push(class - 1);
        texts.push(format!("{} {}", &record[1], &record[2]));
    }
    if labels.is_empty() {
        return Err(DataError::format(
            path,
            "no rows (expected \"class\",\"title\",\"description\" lines)",
        ));
    }
    Ok(Split::complete(Inputs::Texts(texts), labels))
}

/// classes.txt: one class name per line, four of them.
pub fn load_class_names(path: &Path) -> Result<Vec<String>> {
    super::files::class_names(path, NUM_CLASSES as usize)
}

pub const DEFAULT_CLASS_NAMES: [&str; 4] = ["World", "Sports", "Business", "Sci/Tech"];

#[cfg(test)]
mod tests {
    use super::*;

    fn load(content: &str) -> Result<Split> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("test.csv");
        std::fs::write(&path, content).unwrap();
        load_csv(&path)
    }

    #[test]
    fn joins_title_and_description() {
        let split =
            load("\"3\",\"Title\",\"Some, quoted \"\"text\"\".\"\n\"1\",\"A\",\"B\"\n").unwrap();
        assert_eq!(split.labels, vec![2, 0]);
        let Inputs::Texts(texts) = &split.inputs else {
            panic!()
        };
        assert_eq!(texts[0], "Title Some, quoted \"text\".");
    }

    #[test]
    fn bad_rows_are_errors_naming_the_file_and_row() {
        for (content, needle) in [
            (
                "\"1\",\"a\",\"b\"\n\"2\",\"only two\"\n",
                "row 2: expected 3 columns",
            ),
            ("\"0\",\"a\",\"b\"\n", "row 1: class 0 outside 1..4"),
            ("\"5\",\"a\",\"b\"\n", "row 1: class 5 outside 1..4"),
            ("\"x\",\"a\",\"b\"\n", "row 1: class \"x\" is not a number"),
            ("", "no rows"),
        ] {
            let err = load(content).unwrap_err().to_string();
            assert!(err.contains("test.csv") && err.contains(needle), "{err}");
        }
    }
}
