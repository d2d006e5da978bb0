//! The one rule for quoting data in a message (errors, notes): a value is cut to [`SHOWN`]
//! characters with the rest counted, a list to its first [`LISTED`] items and its length, a path
//! quoted with its control characters escaped, so that no input can make a message longer than
//! a terminal line or cut it with a newline of its own.

use std::path::Path;

/// Characters of a value a message shows.
pub const SHOWN: usize = 80;
/// Items of a list a message shows.
pub const LISTED: usize = 5;

/// `text` quoted (Rust's escapes: a newline shows as `\n`), at most [`SHOWN`] characters, the
/// rest counted.
pub fn quote(text: &str) -> String {
    match text.char_indices().nth(SHOWN) {
        None => format!("{text:?}"),
        Some((cut, _)) => format!("{:?}… ({} bytes in all)", &text[..cut], text.len()),
    }
}

/// The first [`LISTED`] of `items`, each [`quote`]d, then "… (N in all)" when there are more.
pub fn list<I, S>(items: I) -> String
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let mut shown = Vec::new();
    let mut count = 0usize;
    for item in items {
        if count < LISTED {
            shown.push(quote(item.as_ref()));
        }
        count += 1;
    }
    if count > LISTED {
        format!("{}, … ({count} in all)", shown.join(", "))
    } else {
        shown.join(", ")
    }
}

/// A path as a message shows it: as it is when it holds no control character, else quoted with
/// them escaped (a file name with a newline would otherwise cut the line).
pub fn path(path: &Path) -> String {
    let shown = path.display().to_string();
    if shown.chars().any(char::is_control) {
        format!("{shown:?}")
    } else {
        shown
    }
}

/// A whole message line bounded: the first `max` characters and the count of the rest (the
/// last guard, in [`crate::errors::one_line`], for a message that quotes data unbounded).
pub fn line(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text.to_string(),
        Some((cut, _)) => format!("{}… ({} bytes in all)", &text[..cut], text.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_lists_and_paths_are_bounded_and_escaped() {
        assert_eq!(quote("LOC:city"), "\"LOC:city\"");
        let long = "é".repeat(1000);
        let quoted = quote(&long);
        assert!(quoted.ends_with("… (2000 bytes in all)"), "{quoted}");
        assert_eq!(quoted.matches('é').count(), SHOWN);
        assert_eq!(list(["a", "b"]), "\"a\", \"b\"");
        let many: Vec<String> = (0..100_000).map(|k| format!("k{k}")).collect();
        let listed = list(&many);
        assert!(listed.ends_with(", … (100000 in all)"), "{listed}");
        assert!(listed.len() < 100, "{listed}");
        assert_eq!(path(Path::new("/a/b.csv")), "/a/b.csv");
        assert_eq!(
            path(Path::new("/a/cat/bad\nname.png")),
            "\"/a/cat/bad\\nname.png\""
        );
        assert_eq!(line("abc", 2), "ab… (3 bytes in all)");
    }
}
