//! The Fig. 5 grid (39 × 39 runs of 1000 steps) with the subspace engine on all cores, against
//! the named baseline: the dense d×d engine run sequentially, as the authors ran 1521 runs. The
//! baseline is measured, not guessed: at every one of the 39 values of d (its cost does not depend
//! on ‖μ‖) a 10-step and a 60-step dense run give the set-up cost and the cost per step, from which
//! a 1000-step run is t₁₀ + 990·(t₆₀ − t₁₀)/50; the sum is scaled by the 39 values of ‖μ‖.
//!
//! `cargo bench --bench synthetic_grid` (full grid); `BENCH_GRID=coarse` for the 9 × 9 subset.

use std::time::Instant;

use benign_attention::synthetic::{EngineKind, GridSize, SyntheticConfig, Trace, run, sweep};

fn main() {
    let grid = match std::env::var("BENCH_GRID").as_deref() {
        Ok("coarse") => GridSize::Coarse,
        _ => GridSize::Full,
    };
    let base = SyntheticConfig::default();
    let cells = grid.embed_dims().len() * grid.signal_norms().len();

    let started = Instant::now();
    let rows =
        sweep(&base, grid, EngineKind::Subspace, Trace::FinalOnly, &|| {}).expect("sweep succeeds");
    let ours = started.elapsed().as_secs_f64();
    assert_eq!(rows.len(), cells);

    let timed = |config: &SyntheticConfig| {
        let started = Instant::now();
        run(config, EngineKind::Dense, Trace::FinalOnly, &mut |_| {}).expect("dense run succeeds");
        started.elapsed().as_secs_f64()
    };
    let mut dense_per_norm = 0.0;
    for &embed_dim in &grid.embed_dims() {
        let short = timed(&SyntheticConfig {
            embed_dim,
            num_steps: 10,
            ..base.clone()
        });
        let long = timed(&SyntheticConfig {
            embed_dim,
            num_steps: 60,
            ..base.clone()
        });
        let per_step = (long - short).max(0.0) / 50.0;
        dense_per_norm += short + per_step * (base.num_steps - 10) as f64;
    }
    let dense = dense_per_norm * grid.signal_norms().len() as f64;

    let threads = rayon::current_num_threads();
    println!("| {cells}-run grid ({threads} threads) | seconds | vs dense |");
    println!("|---|---|---|");
    println!(
        "| dense d×d engine, runs in sequence (baseline; set-up and per-step cost measured at every d) | {dense:.0} | 1.0× |"
    );
    println!(
        "| subspace engine, runs in parallel | {ours:.1} | {:.0}× faster |",
        dense / ours
    );
}
