//! How a run reports what it is doing: stages with a size, epochs, and one-off remarks. The CLI
//! draws bars and lines from it; tests and grids pass their own.

use super::metrics::EpochMetrics;
use super::run::RunConfig;

/// Progress callbacks: every message of the library goes through them (the CLI draws bars; tests
/// pass `()`). Lines and warnings reach stderr unless an implementation sends them elsewhere: a
/// warning is never dropped.
pub trait Progress: Sync {
    fn stage(&self, _what: &str, _total: usize) {}
    fn advance(&self, _by: usize) {}
    fn epoch(&self, _metrics: &EpochMetrics) {}
    /// The run's series begin (its folder is written from here on), with what a resumed run's
    /// checkpoint had logged: phase 1's losses and phase 2's epochs so far (empty for a new run).
    fn series_start(
        &self,
        _config: &RunConfig,
        _pretrain_losses: &[f64],
        _logged: &[EpochMetrics],
    ) {
    }
    /// Phase-1 epoch `epoch` (from 1) ended with mean batch loss `loss`, as it trains.
    fn pretrain_epoch(&self, _epoch: usize, _loss: f64) {}
    /// Phase 1 is done, however it was had (trained, from the shared cache, from the checkpoint).
    fn pretrain_done(&self, _losses: &[f64]) {}
    /// A phase-2 epoch joined the run's log (epoch 0, right after the reset, included).
    fn logged(&self, _metrics: &EpochMetrics) {}
    /// A remark about the run, made once (e.g. which steps stay on the host).
    fn note(&self, _line: &str) {}
    /// A line of a driver's log (a grid's count of runs, one line per finished run).
    fn line(&self, line: &str) {
        eprintln!("{line}");
    }
    /// Something the user should know that does not stop the run.
    fn warn(&self, line: &str) {
        eprintln!("warning: {line}");
    }
}

/// What a run off the CPU still computes on the host: small, or without a GPU kernel in candle.
pub const HOST_STEPS: &str = "image resizing, tokenization, the query-key eigenspectrum (nalgebra), the rank-collapse residual and the attention statistics run on the host";

impl Progress for () {}
