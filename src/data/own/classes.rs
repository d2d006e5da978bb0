//! Labels to classes, in one documented order: when every label is an integer, classes are in
//! ascending numeric order (`2, 10` stays `2, 10`); otherwise labels are words, in byte order
//! (`cat, dog`). A label column holding both kinds is refused: `1` and `one` would otherwise be
//! two classes in an order nobody chose.

/// A label as read: a JSON integer or an integer-looking CSV cell, or a string.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Label {
    Integer(i64),
    Word(String),
}

impl Label {
    /// A CSV cell or folder name: an integer when it is one, as written, else a word.
    pub fn of_text(text: &str) -> Self {
        match text.parse::<i64>() {
            Ok(k) if k.to_string() == text => Label::Integer(k),
            _ => Label::Word(text.to_string()),
        }
    }

    fn name(&self) -> String {
        match self {
            Label::Integer(k) => k.to_string(),
            Label::Word(w) => w.clone(),
        }
    }
}

/// The class names of `labels` in the documented order, and each label's class index. `labels`
/// carry where they were read (`file line 3`) for the error naming a mixed column.
pub fn assign(labels: &[(Label, String)]) -> Result<(Vec<String>, Vec<u32>), String> {
    let integer = labels.iter().find(|(l, _)| matches!(l, Label::Integer(_)));
    let word = labels.iter().find(|(l, _)| matches!(l, Label::Word(_)));
    if let (Some((i, at_i)), Some((w, at_w))) = (integer, word) {
        return Err(format!(
            "the label column mixes integers ({at_i}: {}) and words ({at_w}: {:?}); make every label one kind",
            i.name(),
            w.name()
        ));
    }
    let mut distinct: Vec<&Label> = labels.iter().map(|(l, _)| l).collect();
    distinct.sort_by(|a, b| match (a, b) {
        (Label::Integer(x), Label::Integer(y)) => x.cmp(y),
        (Label::Word(x), Label::Word(y)) => x.as_bytes().cmp(y.as_bytes()),
        _ => std::cmp::Ordering::Equal,
    });
    distinct.dedup();
    let names: Vec<String> = distinct.iter().map(|l| l.name()).collect();
    let index: std::collections::HashMap<&Label, u32> = distinct
        .iter()
        .enumerate()
        .map(|(k, &l)| (l, k as u32))
        .collect();
    let indices = labels.iter().map(|(l, _)| index[l]).collect();
    Ok((names, indices))
}

impl std::hash::Hash for Label {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        match self {
            Label::Integer(k) => (0u8, k).hash(state),
            Label::Word(w) => (1u8, w).hash(state),
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
        // "01" is not written as an integer is: a word.
        assert_eq!(Label::of_text("01"), Label::Word("01".into()));
    }

    #[test]
    fn a_mixed_column_is_refused_naming_both_kinds() {
        let err = read(&["1", "2", "spam"]).unwrap_err();
        assert_eq!(
            err,
            "the label column mixes integers (line 2: 1) and words (line 4: \"spam\"); make every label one kind"
        );
    }
}
