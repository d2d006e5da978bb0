//! A grid's finished cells on disk, one file each (`<out>/cells/d<d>_mu<‖μ‖>.json`, holding the
//! cell's whole config beside its row), so that a sweep stopped by a signal or split over the
//! tasks of a job array (`--shard K/N`) resumes where it stopped and its parts add up to one grid.
//! A cell file is reused only for the very config it records; another is an error naming it.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use super::config::SyntheticConfig;
use super::sweep::SweepRow;
use crate::io::{ensure_dir, read_input_text, write_json};

/// The folder of the cell files under a sweep's output folder.
pub const CELLS: &str = "cells";

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct CellFile {
    config: SyntheticConfig,
    /// Whether the row holds the spectrum diagnostics (`localization-sweep`).
    with_spectrum: bool,
    row: SweepRow,
}

/// The cell files of one output folder.
pub struct CellStore {
    dir: PathBuf,
    with_spectrum: bool,
}

impl CellStore {
    /// The store under `out` (created if needed), of rows with the spectrum diagnostics or
    /// without.
    pub fn open(out: &Path, with_spectrum: bool) -> Result<Self> {
        let dir = out.join(CELLS);
        ensure_dir(&dir)?;
        Ok(Self { dir, with_spectrum })
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
