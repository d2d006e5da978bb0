//! How a run reports what it is doing: stages with a size, epochs, and one-off remarks. The CLI
//! draws bars and lines from it; tests and grids pass their own.

use super::loops::EpochMetrics;

/// Progress callbacks (the CLI draws bars; tests pass no-ops).
pub trait Progress: Sync {
    fn stage(&self, _what: &str, _total: usize) {}
    fn advance(&self, _by: usize) {}
    fn epoch(&self, _metrics: &EpochMetrics) {}
    /// A remark about the run, made once (e.g. which steps stay on the host).
    fn note(&self, _line: &str) {}
}

/// What a run off the CPU still computes on the host: small, or without a GPU kernel in candle.
pub const HOST_STEPS: &str = "image resizing, tokenization, the query-key eigenspectrum (nalgebra), the rank-collapse residual and the attention statistics run on the host";

impl Progress for () {}
