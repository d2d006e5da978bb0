//! Timing helpers shared by the benches (each bench compiles what it uses).
#![allow(dead_code)]

use std::time::Instant;

/// The median of `times`.
pub fn median(mut times: Vec<f64>) -> f64 {
    times.sort_by(|a, b| a.total_cmp(b));
    times[times.len() / 2]
}

/// Seconds per call of `run`: the median of `runs` timed calls after one untimed warm-up.
pub fn median_seconds(runs: usize, run: &mut dyn FnMut()) -> f64 {
    run();
    median(
        (0..runs)
            .map(|_| {
                let started = Instant::now();
                run();
                started.elapsed().as_secs_f64()
            })
            .collect(),
    )
}
