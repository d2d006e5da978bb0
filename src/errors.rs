//! Errors as the binary prints them: one line.

/// An error and its causes on one line: each cause's first line only (candle appends a
/// backtrace to its message when RUST_BACKTRACE is set), and a cause that an outer message
/// already quotes is not repeated.
pub fn one_line(err: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in err.chain() {
        let text = cause.to_string();
        let first = text.lines().next().unwrap_or_default().trim();
        if !first.is_empty() && !parts.iter().any(|outer| outer.contains(first)) {
            parts.push(first.to_string());
        }
    }
    crate::excerpt::line(&parts.join(": "), MAX_LINE)
}

/// The longest error line printed: every message quoting data cuts it ([`crate::excerpt`]); this
/// is the guard for one that does not.
pub const MAX_LINE: usize = 1000;

#[cfg(test)]
mod tests {
    use super::one_line;

    /// A cause's backtrace (candle appends one when RUST_BACKTRACE is set) stays out of the line,
    /// and a cause an outer message already quotes is said once.
    #[test]
    fn errors_print_as_one_line_without_backtraces_or_repeats() {
        let io = std::io::Error::other("No space left on device (os error 28)");
        let err = anyhow::Error::new(io)
            .context("x.json: cannot write (No space left on device (os error 28))")
            .context("writing the summary");
        assert_eq!(
            one_line(&err),
            "writing the summary: x.json: cannot write (No space left on device (os error 28))"
        );
        let err = anyhow::anyhow!(
            "shape mismatch in matmul\n   0: candle_core::error::Error::bt\n   1: main"
        )
        .context("phase 2");
        assert_eq!(one_line(&err), "phase 2: shape mismatch in matmul");
    }
}
