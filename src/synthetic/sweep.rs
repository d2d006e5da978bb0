//! The Fig. 5 grid (docs/protocol.md §2.7): d ∈ {250, 375, …, 5000} × ‖μ‖ ∈ {5, 7.5, …, 100}, one full run
//! per cell at the other hyper-parameters, cells spread over all cores.

use anyhow::{Context, Result};
use rayon::prelude::*;

use super::cells::CellStore;
use super::config::SyntheticConfig;
use super::engine::EngineKind;
pub use super::grid::{GridSize, SweepRow};
use super::train::run;
use super::trajectory::Trace;
use crate::shard::JobShard;

/// The config of every cell of `grid` in (d, ‖μ‖) order, `base`'s other hyper-parameters.
fn cell_configs(base: &SyntheticConfig, grid: GridSize) -> Vec<SyntheticConfig> {
    grid.embed_dims()
        .into_iter()
        .flat_map(|d| grid.signal_norms().into_iter().map(move |mu| (d, mu)))
        .map(|(embed_dim, signal_norm)| SyntheticConfig {
            embed_dim,
            signal_norm,
            ..base.clone()
        })
        .collect()
}

/// Runs every cell of `grid` with `base`'s other hyper-parameters, each with `trace`
/// (`FinalOnly` or `FinalWithSpectrum`). Rows come back ordered by (d, ‖μ‖). `on_done` is called
/// once per finished cell, from any thread.
pub fn sweep(
    base: &SyntheticConfig,
    grid: GridSize,
    engine: EngineKind,
    trace: Trace,
    on_done: &(dyn Fn() + Sync),
) -> Result<Vec<SweepRow>> {
    let cells = cell_configs(base, grid);
    let todo: Vec<usize> = (0..cells.len()).collect();
    let rows = run_cells(&cells, &todo, engine, trace, None, on_done)?;
    Ok(rows
        .into_iter()
        .map(|row| row.expect("every cell ran"))
        .collect())
}

/// Where a sweep kept in a folder stands: every cell's row in (d, ‖μ‖) order where it has one.
pub struct GridProgress {
    pub rows: Vec<Option<SweepRow>>,
    /// Cells this call ran, and cells it found finished.
    pub ran: usize,
    pub reused: usize,
}

impl GridProgress {
    /// All the rows, once every cell has one.
    pub fn complete(&self) -> Option<Vec<SweepRow>> {
        self.rows.iter().cloned().collect()
    }
}

/// [`sweep`] kept in `store`: finished cells are reused, the others of `shard` (all without one)
/// run and are recorded one by one, so that a stopped sweep resumes and a split one adds up.
pub fn sweep_into(
    base: &SyntheticConfig,
    grid: GridSize,
    (engine, trace): (EngineKind, Trace),
    store: &CellStore,
    shard: Option<JobShard>,
    on_done: &(dyn Fn() + Sync),
) -> Result<GridProgress> {
    let Plan {
        cells,
        finished,
        todo,
    } = plan(base, grid, store, shard)?;
    let reused = finished.iter().filter(|r| r.is_some()).count();
    let ran = run_cells(&cells, &todo, engine, trace, Some(store), on_done)?;
    let ran_count = ran.iter().filter(|r| r.is_some()).count();
    let rows = finished
        .into_iter()
        .zip(ran)
        .map(|(old, new)| old.or(new))
        .collect();
    Ok(GridProgress {
        rows,
        ran: ran_count,
        reused,
    })
}

/// A kept sweep's cells, the rows of those finished, and the indices of those left to this call.
struct Plan {
    cells: Vec<SyntheticConfig>,
    finished: Vec<Option<SweepRow>>,
    todo: Vec<usize>,
}

fn plan(
    base: &SyntheticConfig,
    grid: GridSize,
    store: &CellStore,
    shard: Option<JobShard>,
) -> Result<Plan> {
    let cells = cell_configs(base, grid);
    let mut finished = Vec::with_capacity(cells.len());
    for config in &cells {
        finished.push(store.load(config)?);
    }
    let todo = (0..cells.len())
        .filter(|&k| finished[k].is_none() && shard.is_none_or(|s| s.keeps(k)))
        .collect();
    Ok(Plan {
        cells,
        finished,
        todo,
    })
}

/// How many cells [`sweep_into`] would run now.
pub fn pending(
    base: &SyntheticConfig,
    grid: GridSize,
    store: &CellStore,
    shard: Option<JobShard>,
) -> Result<usize> {
    Ok(plan(base, grid, store, shard)?.todo.len())
}

/// Runs the cells `todo` of `cells` across the threads (largest d first, so that the slowest do
/// not straggle at the end), recording each in `store` as it finishes. Returns a row per cell of
/// `cells`, `None` for those not run. A stop signal lets no new cell start and ends the sweep
/// with [`crate::interrupt::Interrupted`] once the running ones stop.
fn run_cells(
    cells: &[SyntheticConfig],
    todo: &[usize],
    engine: EngineKind,
    trace: Trace,
    store: Option<&CellStore>,
    on_done: &(dyn Fn() + Sync),
) -> Result<Vec<Option<SweepRow>>> {
    let mut order = todo.to_vec();
    order.sort_by_key(|&k| std::cmp::Reverse(cells[k].embed_dim));
    let done: Vec<(usize, SweepRow)> = order
        .into_par_iter()
        .map(|k| {
            crate::interrupt::check()?;
            let config = &cells[k];
            let row = run_cell(config, engine, trace).with_context(|| {
                format!(
                    "grid cell d = {}, ‖μ‖ = {}",
                    config.embed_dim, config.signal_norm
                )
            })?;
            if let Some(store) = store {
                store.save(config, &row)?;
            }
            on_done();
            Ok((k, row))
        })
        .collect::<Result<_>>()?;
    let mut rows = vec![None; cells.len()];
    for (k, row) in done {
        rows[k] = Some(row);
    }
    Ok(rows)
}

/// One cell's run and its row.
fn run_cell(config: &SyntheticConfig, engine: EngineKind, trace: Trace) -> Result<SweepRow> {
    let s = run(config, engine, trace, &mut |_| {})?.summary;
    Ok(SweepRow {
        embed_dim: config.embed_dim,
        signal_norm: config.signal_norm,
        snr: s.snr,
        train_loss: s.train_loss,
        test_loss: s.test_loss,
        train_acc: s.train_acc,
        test_acc: s.test_acc,
        noisy_fitted: s.noisy_fitted,
        noisy_total: s.noisy_total,
        clean_x1_prob: s.clean_x1_prob,
        regime: s.regime,
        clean_entropy: s.clean_entropy,
        noisy_entropy: s.noisy_entropy,
        qk_sym_mean: s.qk_symmetric.map(|q| q.mean),
        qk_sym_var: s.qk_symmetric.map(|q| q.var),
        qk_sym_var_init: s.qk_symmetric_init.map(|q| q.var),
    })
}
