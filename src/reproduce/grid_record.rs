//! What a grid's result folder records beside its runs: the lock of the one `reproduce` writing it,
//! and which part of which grid it holds (`shard.json`), so that a merge of shard folders can name
//! every shard and every run that is missing instead of reporting on what happens to be there.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::io::FileLock;
use crate::report::results::RUNS;
use crate::train::run::RunFolder;

/// The record of a result folder's part of a grid.
pub const SHARD_FILE: &str = "shard.json";

/// Held by the `reproduce` writing a result folder.
const LOCK_FILE: &str = ".reproduce.lock";

/// Which part of which grid a result folder holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardRecord {
    /// A digest of the grid's definition: folders of one grid carry the same.
    pub grid: String,
    /// K of `--shard K/N` (1 of 1 without sharding).
    pub index: usize,
    pub count: usize,
    /// The runs this part of the grid makes, by folder name.
    pub runs: Vec<String>,
}

/// The lock of result folder `out` (created if needed): one `reproduce` writes a folder at a time,
/// a second is refused in one line.
pub fn lock(out: &Path) -> Result<FileLock> {
    crate::io::ensure_dir(out)?;
    let path = out.join(LOCK_FILE);
    match FileLock::try_take(&path)? {
        Some(lock) => Ok(lock),
        None => bail!(
            "--out {}: another reproduce is writing this folder (it holds {}); wait for it to end or choose another --out",
            out.display(),
            path.display()
        ),
    }
}

/// Writes `record` into `out`; a folder that holds another grid's, or another part's, is refused.
pub fn write(out: &Path, record: &ShardRecord) -> Result<()> {
    let path = out.join(SHARD_FILE);
    if let Some(earlier) = read(out)?
        && (earlier.grid != record.grid
            || earlier.index != record.index
            || earlier.count != record.count)
    {
        bail!(
            "--out {}: holds shard {}/{} of another grid or another sharding ({}); choose another --out",
            out.display(),
            earlier.index,
            earlier.count,
            path.display()
        );
    }
    crate::io::write_json(&path, record)
}

/// The record in `dir`, if it has one.
pub fn read(dir: &Path) -> Result<Option<ShardRecord>> {
    let path = dir.join(SHARD_FILE);
    if !crate::io::is_present(&path) {
        return Ok(None);
    }
    let text = crate::io::read_input_text(&path, crate::io::limits::SMALL_TEXT)?;
    let record: ShardRecord = serde_json::from_str(&text)
        .with_context(|| format!("{}: not a reproduce shard record", path.display()))?;
    if !(1..=record.count).contains(&record.index) {
        bail!(
            "{}: shard {}/{}: expected an index from 1 to the count",
            path.display(),
            record.index,
            record.count
        );
    }
    if let Some(run) = record.runs.iter().find(|run| !is_folder_name(run)) {
        bail!(
            "{}: run {run:?} is not the name of a folder under {RUNS}/",
            path.display()
        );
    }
    Ok(Some(record))
}

/// Whether `name` is one plain path component (no separator, not `.` or `..`).
fn is_folder_name(name: &str) -> bool {
    let mut parts = Path::new(name).components();
    matches!(
        (parts.next(), parts.next()),
        (Some(std::path::Component::Normal(_)), None)
    ) && !name.contains('/')
}

/// What a report over `dirs` lacks, one line each: the shards of a grid that are not among them,
/// the runs a shard makes that have not finished, and run folders begun but unfinished.
pub fn gaps(dirs: &[PathBuf]) -> Result<Vec<String>> {
    let mut gaps = Vec::new();
    let mut shards: Vec<(ShardRecord, &PathBuf)> = Vec::new();
    for dir in dirs {
        match read(dir)? {
            Some(record) => shards.push((record, dir)),
            None => gaps.extend(begun_unfinished(dir)?),
        }
    }
    for (record, dir) in &shards {
        for run in &record.runs {
            let folder = RunFolder(dir.join(RUNS).join(run));
            if !folder.summary().exists() {
                gaps.push(format!(
                    "run {run} of shard {}/{} ({}) has not finished",
                    record.index,
                    record.count,
                    dir.display()
                ));
            }
        }
    }
    let mut grids: Vec<&str> = shards.iter().map(|(r, _)| r.grid.as_str()).collect();
    grids.sort_unstable();
    grids.dedup();
    for grid in grids {
        let parts: Vec<&ShardRecord> = shards
            .iter()
            .filter(|(r, _)| r.grid == grid)
            .map(|(r, _)| r)
            .collect();
        let count = parts.iter().map(|r| r.count).max().unwrap_or(1);
        let present: Vec<usize> = parts.iter().map(|r| r.index).collect();
        for (first, last) in missing_ranges(&present, count) {
            let which = if first == last {
                format!("shard {first}/{count} of the grid is missing")
            } else {
                format!("shards {first} to {last} of {count} of the grid are missing")
            };
            gaps.push(format!(
                "{which} (no folder given holds it; its task may have died before it started)"
            ));
        }
    }
    Ok(gaps)
}

/// The runs of indices in 1..=count absent from `present`, as inclusive ranges: as many as there
/// are gaps, however large `count` is.
fn missing_ranges(present: &[usize], count: usize) -> Vec<(usize, usize)> {
    let mut present: Vec<usize> = present.to_vec();
    present.sort_unstable();
    present.dedup();
    let mut ranges = Vec::new();
    let mut next = 1;
    for index in present
        .into_iter()
        .chain(std::iter::once(count.saturating_add(1)))
    {
        if index > next {
            ranges.push((next, index - 1));
        }
        next = index + 1;
    }
    ranges
}

/// The run folders under `dir/runs` that a run began (its config.json) but did not finish.
fn begun_unfinished(dir: &Path) -> Result<Vec<String>> {
    let runs = dir.join(RUNS);
    let Ok(entries) = std::fs::read_dir(&runs) else {
        return Ok(Vec::new());
    };
    let mut unfinished = Vec::new();
    for entry in entries {
        let folder = RunFolder(
            entry
                .with_context(|| format!("{}: unreadable", runs.display()))?
                .path(),
        );
        if folder.config().exists() && !folder.summary().exists() {
            unfinished.push(format!("run {} has not finished", folder.0.display()));
        }
    }
    unfinished.sort();
    Ok(unfinished)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_shards_are_ranges_however_many_there_are() {
        assert_eq!(missing_ranges(&[1, 2], 2), vec![]);
        assert_eq!(missing_ranges(&[2], 4), vec![(1, 1), (3, 4)]);
        assert_eq!(
            missing_ranges(&[5, 5, 1], usize::MAX - 1),
            vec![(2, 4), (6, usize::MAX - 1)]
        );
    }

    #[test]
    fn a_record_out_of_range_or_naming_a_path_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        for (record, needle) in [
            (r#"{"grid":"g","index":3,"count":2,"runs":[]}"#, "3/2"),
            (r#"{"grid":"g","index":0,"count":2,"runs":[]}"#, "0/2"),
            (
                r#"{"grid":"g","index":1,"count":2,"runs":["../x"]}"#,
                "../x",
            ),
        ] {
            std::fs::write(dir.path().join(SHARD_FILE), record).unwrap();
            let error = format!("{:#}", read(dir.path()).unwrap_err());
            assert!(error.contains(needle), "{error}");
        }
    }
}
