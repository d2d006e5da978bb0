//! One default synthetic run (d 2000, ‖μ‖ 20, 1000 steps, test set scored every 10 steps):
//! the subspace engine against the named baseline, the dense d×d engine of the authors' algorithm,
//! measured in the same process. `cargo bench --bench synthetic`.

mod common;
use common::median;

use std::time::Instant;

use benign_attention::synthetic::{EngineKind, SyntheticConfig, Trace, run};

fn time_run(config: &SyntheticConfig, engine: EngineKind) -> (f64, f64) {
    let started = Instant::now();
    let result = run(config, engine, Trace::Full, &mut |_| {}).expect("run succeeds");
    (started.elapsed().as_secs_f64(), result.summary.test_acc)
}

fn main() {
    let config = SyntheticConfig::default();
    let threads = rayon::current_num_threads();
    // Warm-up (page faults, thread pools), then medians.
    time_run(&config, EngineKind::Subspace);
    let subspace: Vec<(f64, f64)> = (0..5)
        .map(|_| time_run(&config, EngineKind::Subspace))
        .collect();
    let dense: Vec<(f64, f64)> = (0..2)
        .map(|_| time_run(&config, EngineKind::Dense))
        .collect();
    let sub = median(subspace.iter().map(|r| r.0).collect());
    let den = median(dense.iter().map(|r| r.0).collect());
    println!("| default synthetic run ({threads} threads) | seconds | vs dense |");
    println!("|---|---|---|");
    println!("| dense d×d engine (baseline, authors' algorithm) | {den:.2} | 1.0× |");
    println!("| subspace engine | {sub:.2} | {:.1}× faster |", den / sub);
    println!(
        "test acc: subspace {:.4}, dense {:.4}",
        subspace[0].1, dense[0].1
    );
}
