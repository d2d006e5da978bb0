//! Progress on stderr, for every layer of the crate (downloads, extraction, training). On a terminal, an indicatif bar. Elsewhere (Slurm, nohup, a pipe), where a
//! bar would hide itself, plain lines with the numbers the bar shows: one when the stage starts
//! (printed when it first reports work, so that a stage whose set-up fails prints nothing before
//! the error), at most one every 30 s while it runs ([`EVERY_SECS_ENV`] changes the interval), and
//! one when it finishes.

use std::io::{IsTerminal, Write};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

/// Seconds between two progress lines when stderr is not a terminal (default 30; 0: every update).
pub const EVERY_SECS_ENV: &str = "BENIGN_PROGRESS_EVERY_SECS";

const DEFAULT_EVERY: Duration = Duration::from_secs(30);

/// A stage's progress: `len` units of work, `inc` as they are done, an optional message.
pub struct Bar(Draw);

enum Draw {
    Terminal(ProgressBar),
    Lines(Mutex<Lines>),
}

/// The state the line printer shows.
struct Lines {
    out: Box<dyn Write + Send>,
    unit: String,
    /// Counts are bytes: shown in MB, with the rate since the start.
    bytes: bool,
    len: u64,
    pos: u64,
    message: String,
    created: Instant,
    last_line: Instant,
    every: Duration,
    started: bool,
    finished: bool,
}

/// A bar of `len` `unit`s on stderr: drawn on a terminal, printed as lines elsewhere.
pub fn bar(len: u64, unit: &str) -> Bar {
    if std::io::stderr().is_terminal() {
        let bar = ProgressBar::new(len);
        let template = format!("{{elapsed_precise}} [{{bar:40}}] {{pos}}/{{len}} {unit} {{msg}}");
        if let Ok(style) = ProgressStyle::with_template(&template) {
            bar.set_style(style.progress_chars("=> "));
        }
        Bar(Draw::Terminal(bar))
    } else {
        Bar::lines(len, unit, every(), Box::new(std::io::stderr()))
    }
}

/// A bar of `len` bytes of `what` (a file being downloaded), with the transfer rate: drawn on a
/// terminal, printed as lines elsewhere ("[00:00:31] 12.0/45.6 MB at 0.39 MB/s mnist/train…").
pub fn byte_bar(len: u64, what: &str) -> Bar {
    if std::io::stderr().is_terminal() {
        let bar = ProgressBar::new(len);
        let template = format!(
            "{{elapsed_precise}} [{{bar:40}}] {{bytes}}/{{total_bytes}} ({{bytes_per_sec}}) {what}"
        );
        if let Ok(style) = ProgressStyle::with_template(&template) {
            bar.set_style(style.progress_chars("=> "));
        }
        Bar(Draw::Terminal(bar))
    } else {
        let bar = Bar::lines(len, what, every(), Box::new(std::io::stderr()));
        if let Draw::Lines(lines) = &bar.0 {
            lock(lines).bytes = true;
        }
        bar
    }
}

/// The interval of [`EVERY_SECS_ENV`], else 30 s.
fn every() -> Duration {
    std::env::var(EVERY_SECS_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map_or(DEFAULT_EVERY, Duration::from_secs_f64)
}

impl Bar {
    /// The line printer writing to `out`, a line at most every `every`.
    fn lines(len: u64, unit: &str, every: Duration, out: Box<dyn Write + Send>) -> Self {
        let now = Instant::now();
        Bar(Draw::Lines(Mutex::new(Lines {
            out,
            unit: unit.to_string(),
            bytes: false,
            len,
            pos: 0,
            message: String::new(),
            created: now,
            last_line: now,
            every,
            started: false,
            finished: false,
        })))
    }

    pub fn inc(&self, by: u64) {
        match &self.0 {
            Draw::Terminal(bar) => bar.inc(by),
            Draw::Lines(lines) => {
                let mut lines = lock(lines);
                if !lines.started {
                    lines.started = true;
                    lines.print("started");
                }
                lines.pos = lines.pos.saturating_add(by);
                if lines.pos >= lines.len {
                    lines.finish();
                } else if lines.last_line.elapsed() >= lines.every {
                    lines.print("");
                }
            }
        }
    }

    /// Shown after the counts from the next drawing (or line) on.
    pub fn set_message(&self, message: impl Into<String>) {
        match &self.0 {
            Draw::Terminal(bar) => bar.set_message(message.into()),
            Draw::Lines(lines) => lock(lines).message = message.into(),
        }
    }

    /// Ends the stage: the bar disappears from a terminal; elsewhere a last line says so (unless
    /// reaching the length already printed it).
    pub fn finish_and_clear(&self) {
        match &self.0 {
            Draw::Terminal(bar) => bar.finish_and_clear(),
            Draw::Lines(lines) => lock(lines).finish(),
        }
    }

    /// Ends a stage that may not have finished (an error is on its way): the bar disappears from
    /// a terminal; elsewhere nothing more is printed.
    pub fn abandon(&self) {
        if let Draw::Terminal(bar) = &self.0 {
            bar.finish_and_clear();
        }
    }
}

fn lock(lines: &Mutex<Lines>) -> MutexGuard<'_, Lines> {
    lines.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Lines {
    /// The last line, once.
    fn finish(&mut self) {
        if !self.finished {
            self.finished = true;
            self.print("done");
        }
    }

    /// "[00:01:05] 57/201 steps train 0.9 (done)": elapsed, position/length, unit, message, note.
    fn print(&mut self, note: &str) {
        let elapsed = self.created.elapsed();
        let secs = elapsed.as_secs();
        let counts = if self.bytes {
            let mb = |b: u64| b as f64 / 1e6;
            format!(
                "{:.1}/{:.1} MB at {:.2} MB/s",
                mb(self.pos),
                mb(self.len),
                mb(self.pos) / elapsed.as_secs_f64().max(1e-3)
            )
        } else {
            format!("{}/{}", self.pos, self.len)
        };
        let mut line = format!(
            "[{:02}:{:02}:{:02}] {counts} {}",
            secs / 3600,
            secs / 60 % 60,
            secs % 60,
            self.unit
        );
        for part in [self.message.as_str(), note] {
            if !part.is_empty() {
                line.push(' ');
                line.push_str(part);
            }
        }
        // Progress is best effort: a closed stderr must not stop the work.
        let _ = writeln!(self.out, "{line}");
        let _ = self.out.flush();
        self.last_line = Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A writer whose bytes the test can read back.
    #[derive(Clone, Default)]
    struct SharedWriter(Arc<Mutex<Vec<u8>>>);

    impl Write for SharedWriter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl SharedWriter {
        fn lines(&self) -> Vec<String> {
            String::from_utf8(self.0.lock().unwrap().clone())
                .unwrap()
                .lines()
                .map(String::from)
                .collect()
        }
    }

    #[test]
    fn lines_start_update_at_the_interval_and_finish() {
        let out = SharedWriter::default();
        let bar = Bar::lines(3, "steps", Duration::ZERO, Box::new(out.clone()));
        bar.inc(1);
        bar.set_message("loss 0.5");
        bar.inc(2);
        bar.finish_and_clear();
        assert_eq!(
            out.lines(),
            [
                "[00:00:00] 0/3 steps started",
                "[00:00:00] 1/3 steps",
                "[00:00:00] 3/3 steps loss 0.5 done",
            ]
        );

        // A stage cut short by an error ends silently; finishing it says so once.
        let out = SharedWriter::default();
        let bar = Bar::lines(5, "runs", Duration::ZERO, Box::new(out.clone()));
        bar.inc(2);
        bar.abandon();
        assert_eq!(out.lines().len(), 2);
        bar.finish_and_clear();
        bar.finish_and_clear();
        assert_eq!(out.lines()[2], "[00:00:00] 2/5 runs done");
        assert_eq!(out.lines().len(), 3);

        // Nothing before the first report: a set-up error is the only line.
        let out = SharedWriter::default();
        Bar::lines(5, "steps", Duration::ZERO, Box::new(out.clone())).abandon();
        assert!(out.lines().is_empty());

        // With the default interval a short stage prints its first and last line only.
        let out = SharedWriter::default();
        let bar = Bar::lines(100, "samples", DEFAULT_EVERY, Box::new(out.clone()));
        (0..100).for_each(|_| bar.inc(1));
        bar.finish_and_clear();
        assert_eq!(
            out.lines(),
            [
                "[00:00:00] 0/100 samples started",
                "[00:00:00] 100/100 samples done"
            ]
        );
    }
}
