//! Errors in a checkpoint's JSON files that name the key they stopped in.

/// serde_json's complaint about the JSON `text`, with the key whose value it stopped in, so that
/// a message names the field: `"image_std": number out of range at line 3 column 12`.
pub(crate) fn json_error(text: &str, err: &serde_json::Error) -> String {
    // Byte offset of the error: the lines before it, then the column (1-based).
    let offset: usize = text
        .split_inclusive('\n')
        .take(err.line().saturating_sub(1))
        .map(str::len)
        .sum::<usize>()
        + err.column().saturating_sub(1);
    let before = text.get(..offset.min(text.len())).unwrap_or(text);
    match last_key(before) {
        Some(key) => format!("\"{key}\": {err}"),
        None => err.to_string(),
    }
}

/// The last object key in `text` (`"key"` followed by `:`), if any.
fn last_key(text: &str) -> Option<&str> {
    let mut rest = text;
    while let Some(colon) = rest.rfind(':') {
        let head = rest[..colon].trim_end();
        if let Some(open) = head.strip_suffix('"').and_then(|quoted| quoted.rfind('"')) {
            return Some(&head[open + 1..head.len() - 1]);
        }
        rest = &rest[..colon];
    }
    None
}

#[cfg(test)]
mod tests {
    #[test]
    fn json_errors_name_the_key_they_stopped_in() {
        let text =
            "{\n  \"size\": {\"height\": 224},\n  \"image_std\": [\n    0.5,\n    1e999\n  ]\n}";
        let err = serde_json::from_str::<serde_json::Value>(text).unwrap_err();
        let message = super::json_error(text, &err);
        assert!(
            message.starts_with("\"image_std\": number out of range at line 5"),
            "{message}"
        );
        let err = serde_json::from_str::<serde_json::Value>("[1,").unwrap_err();
        assert_eq!(super::json_error("[1,", &err), err.to_string());
    }
}
