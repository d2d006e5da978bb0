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

/// The machine's limit as the benches state it: multiply-adds per second of a large f32 product
/// (1024 × 1024 by 1024 × 1024 through candle, the gemm every op here ends in), measured in the
/// calling thread pool (`rayon::current_num_threads()` threads), median of 5 after a warm-up.
pub fn large_product_rate() -> f64 {
    use candle_core::{Device, Tensor};
    const SIDE: usize = 1024;
    let values: Vec<f32> = (0..SIDE * SIDE)
        .map(|k| ((k * 37 % 101) as f32 - 50.0) / 50.0)
        .collect();
    let a = Tensor::from_vec(values, (SIDE, SIDE), &Device::Cpu).unwrap();
    let b = a.t().unwrap().contiguous().unwrap();
    let seconds = median_seconds(5, &mut || drop(a.matmul(&b).unwrap()));
    (SIDE * SIDE * SIDE) as f64 / seconds
}

/// "12.3 G multiply-adds/s, 45 % of the large product's 27.1 G".
pub fn rate_line(macs_per_second: f64, limit: f64) -> String {
    format!(
        "{:.1} G multiply-adds/s, {:.0} % of the large product's {:.1} G",
        macs_per_second / 1e9,
        100.0 * macs_per_second / limit,
        limit / 1e9
    )
}
