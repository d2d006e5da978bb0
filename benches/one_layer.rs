//! The one-layer encoder of Figs. 6/7 (`cargo bench --bench one_layer`), on this machine:
//!
//! 1. a balanced run (d 2000, ‖μ‖ 20, 1000 steps, the test set scored every 10 steps as the
//!    authors' script does) beside the named baseline, the authors' `main_one_layer.py` (torch on
//!    the CPU, their config, wandb offline), run by this bench with the same threads when
//!    `BENIGN_AUTHORS_CHECKOUT` (a checkout of keitaroskmt/benign-attention) and
//!    `BENIGN_TORCH_PYTHON` (a Python with torch, einops, hydra-core, omegaconf, pandas and
//!    wandb) are set, and skipped, saying so, otherwise;
//! 2. a grid cell's time at a sample of d (the cell as `synthetic-sweep` runs it: the test set
//!    scored at the end only), as a fixed part and a time per step from runs of 50 and 150 steps;
//! 3. the coarse (9 × 9) and the full (39 × 39) grids' times estimated from 2., for a grid run
//!    on all cores.

use std::process::Command;
use std::time::Instant;

use benign_attention::synthetic::{EncoderSettings, GridSize, SyntheticConfig, Trace, run};

fn encoder_config(embed_dim: usize, signal_norm: f64, num_steps: usize) -> SyntheticConfig {
    SyntheticConfig {
        embed_dim,
        signal_norm,
        num_steps,
        encoder: Some(EncoderSettings::default()),
        ..SyntheticConfig::default()
    }
}

fn seconds_of(config: &SyntheticConfig, trace: Trace) -> f64 {
    let started = Instant::now();
    run(
        config,
        benign_attention::synthetic::EngineKind::Subspace,
        trace,
        &mut |_| {},
    )
    .expect("the run succeeds");
    started.elapsed().as_secs_f64()
}

/// The authors' script on the balanced setting: its wall time and its last logged train and test
/// accuracy, or why it was not run.
fn authors_run(threads: usize) -> Result<(f64, f64, f64), String> {
    let (Some(checkout), Some(python)) = (
        std::env::var_os("BENIGN_AUTHORS_CHECKOUT"),
        std::env::var_os("BENIGN_TORCH_PYTHON"),
    ) else {
        return Err("BENIGN_AUTHORS_CHECKOUT and BENIGN_TORCH_PYTHON unset".into());
    };
    let outputs = tempfile::tempdir().map_err(|e| e.to_string())?;
    let started = Instant::now();
    let status = Command::new(python)
        .arg("main_one_layer.py")
        .arg(format!("hydra.run.dir={}", outputs.path().display()))
        .current_dir(checkout)
        .env("WANDB_MODE", "offline")
        .env("WANDB_SILENT", "true")
        .env("WANDB_DIR", outputs.path())
        .env("OMP_NUM_THREADS", threads.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map_err(|e| format!("cannot start the authors' script: {e}"))?;
    if !status.success() {
        return Err(format!("the authors' script failed ({status})"));
    }
    let seconds = started.elapsed().as_secs_f64();
    // pandas' `to_json`: {"column": {"row": value}}, null where the script logged nothing.
    let stats = std::fs::read_to_string(outputs.path().join("stats_time_step.json"))
        .map_err(|e| format!("the authors' stats_time_step.json: {e}"))?;
    let stats: serde_json::Value = serde_json::from_str(&stats).map_err(|e| e.to_string())?;
    let last = |column: &str| -> Option<f64> {
        let values = stats.get(column)?.as_object()?;
        values
            .iter()
            .filter_map(|(step, v)| Some((step.parse::<usize>().ok()?, v.as_f64()?)))
            .max_by_key(|(step, _)| *step)
            .map(|(_, v)| v)
    };
    let (Some(train), Some(test)) = (last("train_accuracy"), last("test_accuracy")) else {
        return Err("the authors' stats_time_step.json has no accuracies".into());
    };
    Ok((seconds, train, test))
}

/// Least-squares a + b·d + c·d² through `points` (d, value).
fn quadratic(points: &[(f64, f64)]) -> [f64; 3] {
    let rows: Vec<f64> = points.iter().flat_map(|&(d, _)| [1.0, d, d * d]).collect();
    let a = nalgebra::DMatrix::from_row_slice(points.len(), 3, &rows);
    let b = nalgebra::DVector::from_iterator(points.len(), points.iter().map(|p| p.1));
    let solution = (a.transpose() * &a)
        .lu()
        .solve(&(a.transpose() * b))
        .expect("the sample has three distinct d");
    [solution[0], solution[1], solution[2]]
}

fn main() {
    let threads = rayon::current_num_threads();

    // 1. A balanced run, as the authors' script runs it, beside theirs.
    let balanced = encoder_config(2000, 20.0, 1000);
    seconds_of(&encoder_config(2000, 20.0, 20), Trace::Full);
    let started = Instant::now();
    let summary = run(
        &balanced,
        benign_attention::synthetic::EngineKind::Subspace,
        Trace::Full,
        &mut |_| {},
    )
    .expect("the run succeeds")
    .summary;
    let ours = started.elapsed().as_secs_f64();
    println!(
        "| balanced run, d 2000, 1000 steps, test every 10 ({threads} threads) | seconds | vs authors | final train / test acc |"
    );
    println!("|---|---|---|---|");
    match authors_run(threads) {
        Ok((theirs, train, test)) => {
            println!(
                "| authors' main_one_layer.py, torch CPU (baseline) | {theirs:.1} | 1.0× | {train:.3} / {test:.3} |"
            );
            println!(
                "| synthetic --model encoder | {ours:.1} | {:.1}× faster | {:.3} / {:.3} |",
                theirs / ours,
                summary.train_acc,
                summary.test_acc
            );
        }
        Err(why) => {
            println!("| authors' main_one_layer.py (baseline) | not run: {why} | | |");
            println!(
                "| synthetic --model encoder | {ours:.1} | | {:.3} / {:.3} |",
                summary.train_acc, summary.test_acc
            );
        }
    }

    // 2. A grid cell's fixed part and time per step, at a sample of d.
    println!();
    println!("| grid cell, d | fixed part (s) | per step (ms) | 1000-step cell (s) |");
    println!("|---|---|---|---|");
    let sample = [250, 1500, 2750, 4000, 5000];
    let mut fixed = Vec::new();
    let mut per_step = Vec::new();
    for d in sample {
        let short = seconds_of(&encoder_config(d, 20.0, 50), Trace::FinalOnly);
        let long = seconds_of(&encoder_config(d, 20.0, 150), Trace::FinalOnly);
        let step = (long - short) / 100.0;
        let base = short - 50.0 * step;
        println!(
            "| {d} | {base:.2} | {:.1} | {:.1} |",
            step * 1e3,
            base + 1000.0 * step
        );
        fixed.push((d as f64, base));
        per_step.push((d as f64, step));
    }

    // 3. The grids, from the fits. A cell here has every core; the sweep runs one cell per core,
    //    the same work in about the same time.
    let (fixed, per_step) = (quadratic(&fixed), quadratic(&per_step));
    let at = |c: [f64; 3], d: f64| (c[0] + c[1] * d + c[2] * d * d).max(0.0);
    let estimate = |grid: GridSize| -> f64 {
        let cells_per_d = grid.signal_norms().len() as f64;
        grid.embed_dims()
            .into_iter()
            .map(|d| cells_per_d * (at(fixed, d as f64) + 1000.0 * at(per_step, d as f64)))
            .sum::<f64>()
    };
    println!();
    println!("| `synthetic-sweep --model encoder`, estimated from the cells above | minutes |");
    println!("|---|---|");
    println!(
        "| `--grid coarse` (81 cells) | {:.0} |",
        estimate(GridSize::Coarse) / 60.0
    );
    println!(
        "| `--grid full` (1521 cells) | {:.0} |",
        estimate(GridSize::Full) / 60.0
    );
}
