//! One writer per run folder. A `finetune` run holds an exclusive lock on its folder's `.lock`
//! file from before it reads the folder (its checkpoint, its config) until its last file is
//! written, so two processes given the same `--out` cannot mix their files: the second is refused
//! in one line. Holding the lock also makes it safe to remove temporary files a killed writer left
//! (`.tmp-*`, from an atomic write cut short).
//!
//! The lock is [`crate::io::FileLock`] (`flock(2)`): a killed run never leaves a stale one.
//!
//! A folder that does not exist yet is not created to be locked (a refused run must leave nothing
//! behind): it is created with `create_dir`, which exactly one process wins, once the run has
//! been checked, and locked then.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use super::run::{RunConfig, RunFolder};
use crate::io::FileLock;

/// The lock on a run folder, held while the value lives.
pub struct RunFolderLock {
    folder: PathBuf,
    /// `None` while the folder does not exist yet ([`RunFolderLock::create`] makes and locks it).
    held: Option<FileLock>,
}

impl RunFolderLock {
    /// Locks `folder` when it exists (and removes what killed writers left in it); a folder that
    /// does not exist yet is locked by [`RunFolderLock::create`].
    pub fn acquire(folder: &Path) -> Result<Self> {
        let mut lock = RunFolderLock {
            folder: folder.to_path_buf(),
            held: None,
        };
        if folder.exists() {
            if !folder.is_dir() {
                bail!("--out {}: exists and is not a directory", folder.display());
            }
            lock.take()?;
        }
        Ok(lock)
    }

    /// Creates the folder if this process has not locked it yet, and locks it. A folder that
    /// another process created meanwhile is refused rather than shared.
    pub fn create(&mut self) -> Result<()> {
        if self.held.is_some() {
            return Ok(());
        }
        if let Some(parent) = self.folder.parent().filter(|p| !p.as_os_str().is_empty()) {
            crate::io::ensure_dir(parent)?;
        }
        match std::fs::create_dir(&self.folder) {
            Ok(()) => self.take(),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => bail!(
                "--out {}: created by another process while this run was being set up; choose another --out",
                self.folder.display()
            ),
            Err(e) => Err(e)
                .with_context(|| format!("{}: cannot create directory", self.folder.display())),
        }
    }

    fn take(&mut self) -> Result<()> {
        let path = RunFolder(self.folder.clone()).lock();
        match FileLock::try_take(&path)? {
            Some(lock) => self.held = Some(lock),
            None => bail!(
                "--out {}: another process is writing this run folder (it holds {}); wait for it to end or choose another --out",
                self.folder.display(),
                path.display()
            ),
        }
        crate::io::sweep_temporaries(&self.folder);
        Ok(())
    }
}

/// A run that is not resumed may replace the same run's files in `folder` (a rerun), never
/// another run's: its config.json would no longer describe its checkpoint and summary.
pub fn ensure_no_other_run(folder: &Path, config: &RunConfig) -> Result<()> {
    let file = RunFolder(folder.to_path_buf()).config();
    if !crate::io::is_present(&file) {
        return Ok(());
    }
    let text = crate::io::read_input(&file, crate::io::limits::SMALL_TEXT)?;
    let theirs: serde_json::Value = serde_json::from_slice(&text).with_context(|| {
        format!(
            "{}: not JSON; the folder holds a run this build cannot read, choose another --out",
            file.display()
        )
    })?;
    match crate::io::first_difference(&serde_json::to_value(config)?, &theirs) {
        Some(difference) => bail!(
            "--out {}: holds another run ({difference}); choose another --out",
            folder.display()
        ),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_writer_is_refused_and_a_missing_folder_is_made_only_on_create() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("runs/a");
        let mut first = RunFolderLock::acquire(&folder).unwrap();
        assert!(!folder.exists(), "acquire must not create the folder");
        let mut second = RunFolderLock::acquire(&folder).unwrap();
        first.create().unwrap();
        std::fs::write(folder.join(".tmp-abc.safetensors"), b"x").unwrap();
        let err = second.create().unwrap_err().to_string();
        assert!(err.contains("created by another process"), "{err}");
        let err = RunFolderLock::acquire(&folder).err().unwrap().to_string();
        assert!(err.contains("another process is writing"), "{err}");
        drop(first);
        // The next writer gets the lock, and the killed writer's temporary file goes.
        let _third = RunFolderLock::acquire(&folder).unwrap();
        assert!(!folder.join(".tmp-abc.safetensors").exists());
    }
}
