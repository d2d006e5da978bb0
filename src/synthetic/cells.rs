//! A grid's finished cells on disk, one file each (`<out>/cells/d<d>_mu<‖μ‖>.json`, holding the
//! cell's whole config beside its row), so that a sweep stopped by a signal or split over the
//! tasks of a job array (`--shard K/N`) resumes where it stopped and its parts add up to one grid.
//! A cell file is reused only for the very config it records, with a row that could be that
//! config's; another is an error naming it.
//!
//! The folder belongs to one sweep, recorded in `cells/sweep.json` (the shared hyper-parameters,
//! the grid, whether rows hold the spectrum) by the first command that writes it: another sweep
//! given the same `--out` is refused before it runs a cell. Each part of the sweep (the whole, or
//! one `--shard K/N`) is run by one process at a time, held by a lock; the parts of one sweep may
//! run at once, since their cells are disjoint.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use super::config::SyntheticConfig;
use super::grid::{GridSize, SweepRow};
use crate::io::{FileLock, ensure_dir, read_input_text, write_json};
use crate::shard::JobShard;

/// The folder of the cell files under a sweep's output folder.
pub const CELLS: &str = "cells";

/// The record of the sweep a cells folder belongs to.
const IDENTITY: &str = "sweep.json";

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct CellFile {
    config: SyntheticConfig,
    /// Whether the row holds the spectrum diagnostics (`localization-sweep`).
    with_spectrum: bool,
    row: SweepRow,
}

/// The sweep a cells folder belongs to: what every one of its cells shares.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SweepIdentity {
    /// The shared hyper-parameters (d and ‖μ‖ zero: each cell sets its own).
    shared: SyntheticConfig,
    grid: GridSize,
    with_spectrum: bool,
}

/// The cell files of one output folder.
pub struct CellStore {
    dir: PathBuf,
    with_spectrum: bool,
    /// This part of the sweep, held while the store lives.
    _part: FileLock,
}

impl CellStore {
    /// The store under `out` (created if needed) of the sweep of `grid` at `base`'s shared
    /// hyper-parameters, for the part `shard` (all without one). Refused in one line when the
    /// folder holds another sweep's cells, or another process runs the same part.
    pub fn open(
        out: &Path,
        (base, grid): (&SyntheticConfig, GridSize),
        with_spectrum: bool,
        shard: Option<JobShard>,
    ) -> Result<Self> {
        let dir = out.join(CELLS);
        ensure_dir(&dir)?;
        let identity = SweepIdentity {
            shared: SyntheticConfig {
                embed_dim: 0,
                signal_norm: 0.0,
                ..base.clone()
            },
            grid,
            with_spectrum,
        };
        claim(&dir, &identity, out)?;
        let part = match shard {
            Some(s) => format!(".lock-shard-{}-of-{}", s.index, s.count),
            None => ".lock".to_string(),
        };
        let Some(held) = FileLock::try_take(&dir.join(&part))? else {
            bail!(
                "--out {}: another sweep process is running this part of the grid (it holds {}); \
                 wait for it to end or choose another --out",
                out.display(),
                dir.join(&part).display()
            );
        };
        Ok(Self {
            dir,
            with_spectrum,
            _part: held,
        })
    }

    fn path(&self, config: &SyntheticConfig) -> PathBuf {
        self.dir.join(format!(
            "d{}_mu{}.json",
            config.embed_dim, config.signal_norm
        ))
    }

    /// The row of the cell `config` describes, if it has finished; a file of another config is
    /// refused.
    pub fn load(&self, config: &SyntheticConfig) -> Result<Option<SweepRow>> {
        let path = self.path(config);
        if !crate::io::is_present(&path) {
            return Ok(None);
        }
        let text = read_input_text(&path, crate::io::limits::SMALL_TEXT)?;
        let file: CellFile = serde_json::from_str(&text)
            .with_context(|| format!("{}: not a sweep cell", path.display()))?;
        if file.config != *config || file.with_spectrum != self.with_spectrum {
            bail!(
                "{}: a cell of another sweep (its config, or whether it holds the spectrum, differs); \
                 choose another --out or remove the folder",
                path.display()
            );
        }
        if let Some(why) = file.row.contradiction(config, self.with_spectrum) {
            bail!(
                "{}: not the row of the cell it names ({why}); remove the file to run the cell again",
                path.display()
            );
        }
        Ok(Some(file.row))
    }

    /// Records a finished cell.
    pub fn save(&self, config: &SyntheticConfig, row: &SweepRow) -> Result<()> {
        write_json(
            &self.path(config),
            &CellFile {
                config: config.clone(),
                with_spectrum: self.with_spectrum,
                row: row.clone(),
            },
        )
    }
}

/// Records `identity` as the sweep of the cells folder `dir`, or checks that it is the one
/// recorded; under a lock, so that two commands started together cannot both claim it.
fn claim(dir: &Path, identity: &SweepIdentity, out: &Path) -> Result<()> {
    let _held = FileLock::wait(&dir.join(".identity.lock"))?;
    let path = dir.join(IDENTITY);
    if !crate::io::is_present(&path) {
        return write_json(&path, identity);
    }
    let text = read_input_text(&path, crate::io::limits::SMALL_TEXT)?;
    let recorded: SweepIdentity = serde_json::from_str(&text)
        .with_context(|| format!("{}: not a sweep's record", path.display()))?;
    if recorded != *identity {
        bail!(
            "--out {}: holds the cells of another sweep ({} records other shared \
             hyper-parameters, grid or kind); choose another --out or remove the folder",
            out.display(),
            path.display()
        );
    }
    Ok(())
}
