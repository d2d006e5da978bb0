//! Labels to classes, in one documented order. A label is a *number* when it is written as an
//! integer of any length: an optional `-`, then digits, zero padding allowed (`7`, `08`,
//! `18446744073709551616`); JSON and Parquet integers of every width are numbers. When every
//! label is a number, classes are in ascending numeric order (`2, 10`; `08, 09, 10`), and two
//! spellings of one number (`8` and `08`) are refused: they would be two classes of one value.
//! Otherwise labels are words, in byte order (`cat, dog`). A label column holding both kinds is
//! refused: `1` and `one` would otherwise be two classes in an order nobody chose.

use std::cmp::Ordering;

use crate::excerpt::quote;

/// A label as read: a number as written (digits, optional sign), or a word.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Label {
    Number(String),
    Word(String),
}

impl Label {
    /// A CSV cell or folder name: a number when it is written as one, else a word.
    pub fn of_text(text: &str) -> Self {
        let digits = text.strip_prefix('-').unwrap_or(text);
        if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
            Label::Number(text.to_string())
        } else {
            Label::Word(text.to_string())
        }
    }

    /// An integer read from a typed column (JSON, Parquet).
    pub fn integer(value: impl std::fmt::Display) -> Self {
        Label::Number(value.to_string())
    }

    /// The number's value as (negative, digits without leading zeros), for ordering.
    fn value(number: &str) -> (bool, &str) {
        let (negative, digits) = match number.strip_prefix('-') {
            Some(d) => (true, d),
            None => (false, number),
        };
        let digits = digits.trim_start_matches('0');
        // -0 is 0.
        (negative && !digits.is_empty(), digits)
    }

    /// Numeric order of two numbers as written.
    fn numeric_cmp(a: &str, b: &str) -> Ordering {
        let ((na, da), (nb, db)) = (Self::value(a), Self::value(b));
        let magnitude = da.len().cmp(&db.len()).then_with(|| da.cmp(db));
        match (na, nb) {
            (false, false) => magnitude,
            (true, true) => magnitude.reverse(),
            (true, false) => Ordering::Less,
            (false, true) => Ordering::Greater,
        }
    }

    pub fn name(&self) -> &str {
        match self {
            Label::Number(k) | Label::Word(k) => k,
        }
    }
}

/// The class names of `labels` in the documented order, and each label's class index. `labels`
/// carry where they were read (`file line 3`) for the error naming a mixed column.
pub fn assign(labels: &[(Label, String)]) -> Result<(Vec<String>, Vec<u32>), String> {
    let number = labels.iter().find(|(l, _)| matches!(l, Label::Number(_)));
    let word = labels.iter().find(|(l, _)| matches!(l, Label::Word(_)));
    if let (Some((i, at_i)), Some((w, at_w))) = (number, word) {
        return Err(format!(
            "the label column mixes integers ({at_i}: {}) and words ({at_w}: {}); make every label one kind",
            quote(i.name()),
            quote(w.name())
        ));
    }
    let mut distinct: Vec<&Label> = labels.iter().map(|(l, _)| l).collect();
    distinct.sort_by(|a, b| match (a, b) {
        (Label::Number(x), Label::Number(y)) => {
            Label::numeric_cmp(x, y).then_with(|| x.as_bytes().cmp(y.as_bytes()))
        }
        (Label::Word(x), Label::Word(y)) => x.as_bytes().cmp(y.as_bytes()),
        _ => Ordering::Equal,
    });
    distinct.dedup();
    if let Some(pair) = distinct.windows(2).find(|w| match (w[0], w[1]) {
        (Label::Number(x), Label::Number(y)) => Label::numeric_cmp(x, y) == Ordering::Equal,
        _ => false,
    }) {
        return Err(format!(
            "labels {} and {} are one number written two ways; write every label alike",
            quote(pair[0].name()),
            quote(pair[1].name())
        ));
    }
    let names: Vec<String> = distinct.iter().map(|l| l.name().to_string()).collect();
    let index: std::collections::HashMap<&Label, u32> = distinct
        .iter()
        .enumerate()
        .map(|(k, &l)| (l, k as u32))
        .collect();
    let indices = labels.iter().map(|(l, _)| index[l]).collect();
    Ok((names, indices))
}

/// A test split's label that the training split lacks, refused: no run can learn its class,
/// and its samples would only lower the test accuracy.
pub fn refuse_test_only<'a>(
    train: impl Iterator<Item = &'a Label>,
    test: impl Iterator<Item = (&'a Label, &'a str)>,
) -> Result<(), String> {
    let known: std::collections::HashSet<&Label> = train.collect();
    let mut missing = test.filter(|(label, _)| !known.contains(label));
    match missing.next() {
        None => Ok(()),
        Some((label, at)) => {
            let more = missing.count();
            Err(format!(
                "{at}: a test label the training split does not have ({}){}",
                quote(label.name()),
                if more > 0 {
                    format!(", and {more} more sample(s) like it")
                } else {
                    String::new()
                }
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(cells: &[&str]) -> Result<(Vec<String>, Vec<u32>), String> {
        let labels: Vec<(Label, String)> = cells
            .iter()
            .enumerate()
            .map(|(k, c)| (Label::of_text(c), format!("line {}", k + 2)))
            .collect();
        assign(&labels)
    }

    #[test]
    fn integers_sort_as_numbers_and_words_as_bytes() {
        let (names, indices) = read(&["10", "2", "10", "-1"]).unwrap();
        assert_eq!(names, ["-1", "2", "10"]);
        assert_eq!(indices, [2, 1, 2, 0]);
        let (names, indices) = read(&["dog", "cat", "Zebra", "dog"]).unwrap();
        assert_eq!(names, ["Zebra", "cat", "dog"]);
        assert_eq!(indices, [2, 1, 0, 2]);
        // Zero-padded and beyond i64: numbers, in numeric order.
        let (names, _) = read(&["10", "09", "08"]).unwrap();
        assert_eq!(names, ["08", "09", "10"]);
        let (names, _) = read(&["18446744073709551616", "-99999999999999999999", "3"]).unwrap();
        assert_eq!(
            names,
            ["-99999999999999999999", "3", "18446744073709551616"]
        );
        let err = read(&["8", "08"]).unwrap_err();
        assert!(err.contains("one number written two ways"), "{err}");
        assert_eq!(Label::of_text("-"), Label::Word("-".into()));
        assert_eq!(Label::of_text("1.5"), Label::Word("1.5".into()));
    }

    #[test]
    fn a_mixed_column_is_refused_naming_both_kinds() {
        let err = read(&["1", "2", "spam"]).unwrap_err();
        assert_eq!(
            err,
            "the label column mixes integers (line 2: \"1\") and words (line 4: \"spam\"); make every label one kind"
        );
    }
}
