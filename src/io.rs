//! Output files: every file is written whole or not at all (temp file in the same folder, then
//! rename), so an interrupted run never leaves a file that looks finished.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::Serialize;

/// Creates `dir` (and parents) if needed; fails with the path if it exists and is not a folder.
pub fn ensure_dir(dir: &Path) -> Result<()> {
    if dir.exists() && !dir.is_dir() {
        bail!("{}: exists and is not a directory", dir.display());
    }
    std::fs::create_dir_all(dir)
        .with_context(|| format!("{}: cannot create directory", dir.display()))
}

/// Writes `path` atomically with whatever `fill` writes into a temporary file beside it.
pub fn write_atomic(path: &Path, fill: impl FnOnce(&mut dyn Write) -> Result<()>) -> Result<()> {
    let dir = parent_dir(path);
    let mut tmp = temporary_beside(&dir, "")?;
    {
        let mut buffered = std::io::BufWriter::new(tmp.as_file_mut());
        fill(&mut buffered).with_context(|| format!("{}: write failed", path.display()))?;
        buffered
            .flush()
            .with_context(|| format!("{}: write failed", path.display()))?;
    }
    tmp.as_file()
        .sync_all()
        .with_context(|| format!("{}: sync failed", path.display()))?;
    tmp.persist(path)
        .with_context(|| format!("{}: cannot move into place", path.display()))?;
    Ok(())
}

/// An exclusive `flock(2)` on a lock file, held while the value lives. The kernel drops it when
/// the process dies however it dies (no stale locks), and on NFS v4 the server arbitrates it
/// between hosts. The file stays: removing a lock file that another process may be opening would
/// let two processes hold "the" lock at once.
pub struct FileLock {
    _file: std::fs::File,
}

impl FileLock {
    fn open(path: &Path) -> Result<std::fs::File> {
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .with_context(|| format!("{}: cannot open the lock file", path.display()))
    }

    /// Blocks until this process holds the lock.
    pub fn wait(path: &Path) -> Result<Self> {
        let file = Self::open(path)?;
        file.lock()
            .with_context(|| format!("{}: cannot lock", path.display()))?;
        Ok(Self { _file: file })
    }

    /// The lock, or `None` while another process holds it.
    pub fn try_take(path: &Path) -> Result<Option<Self>> {
        let file = Self::open(path)?;
        match file.try_lock() {
            Ok(()) => Ok(Some(Self { _file: file })),
            Err(std::fs::TryLockError::WouldBlock) => Ok(None),
            Err(std::fs::TryLockError::Error(e)) => {
                Err(e).with_context(|| format!("{}: cannot lock", path.display()))
            }
        }
    }
}

/// Removes the temporary files that [`write_atomic`] and [`produce_atomic`] name `.tmp-*` (and
/// any other `.tmp*`) from `dir`: left by writers killed mid-write. Only for a caller holding the
/// folder's [`FileLock`], which makes every such file stale.
pub fn sweep_temporaries(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with(".tmp") {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Pretty JSON, atomically.
pub fn write_json(path: &Path, value: &impl Serialize) -> Result<()> {
    write_atomic(path, |w| {
        serde_json::to_writer_pretty(&mut *w, value)?;
        writeln!(w)?;
        Ok(())
    })
}

/// One JSON object per line, atomically.
pub fn write_json_lines<T: Serialize>(path: &Path, rows: &[T]) -> Result<()> {
    write_atomic(path, |w| {
        for row in rows {
            serde_json::to_writer(&mut *w, row)?;
            writeln!(w)?;
        }
        Ok(())
    })
}

/// A CSV with a header from the rows' field names, atomically.
pub fn write_csv<T: Serialize>(path: &Path, rows: &[T]) -> Result<()> {
    write_atomic(path, |w| {
        let mut writer = csv::Writer::from_writer(w);
        for row in rows {
            writer.serialize(row)?;
        }
        writer.flush()?;
        Ok(())
    })
}

/// A file produced by a library that only writes to paths (plotters): it writes to a temporary
/// path with the same extension, which is renamed to `path` once `produce` succeeds.
pub fn produce_atomic(path: &Path, produce: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let dir = parent_dir(path);
    let suffix = path
        .extension()
        .map(|e| format!(".{}", e.to_string_lossy()))
        .unwrap_or_default();
    let tmp = temporary_beside(&dir, &suffix)?;
    produce(tmp.path()).with_context(|| format!("{}: cannot write", path.display()))?;
    tmp.persist(path)
        .with_context(|| format!("{}: cannot move into place", path.display()))?;
    Ok(())
}

/// The temporary file an atomic write fills, `.tmp-*<suffix>` in `dir`, readable by others as a
/// plain file is (0644 before the umask; tempfile's own default, 0600, would leave results and
/// caches that a cluster's other users cannot read).
fn temporary_beside(dir: &Path, suffix: &str) -> Result<tempfile::NamedTempFile> {
    let mut builder = tempfile::Builder::new();
    builder.prefix(".tmp-").suffix(suffix);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(std::fs::Permissions::from_mode(0o644));
    }
    builder
        .tempfile_in(dir)
        .with_context(|| format!("{}: cannot create a temporary file", dir.display()))
}

fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Reads a float that JSON wrote as null because it was NaN (serde_json writes NaN as null).
pub fn nan_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<f64, D::Error> {
    Ok(<Option<f64> as serde::Deserialize>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// Serde through `Display` / `FromStr`: enums with a canonical spelling (dataset names, noise
/// models) are written the way users type them on the command line.
pub mod as_string {
    use std::fmt::Display;
    use std::str::FromStr;

    pub fn serialize<T: Display, S: serde::Serializer>(value: &T, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(value)
    }

    pub fn deserialize<'de, T, D>(d: D) -> Result<T, D::Error>
    where
        T: FromStr,
        T::Err: Display,
        D: serde::Deserializer<'de>,
    {
        let text = <String as serde::Deserialize>::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// A JSON value as (dotted path, leaf) pairs in document order: `{"a": {"b": 1}}` gives
/// `("a.b", 1)`. Arrays are leaves. What results.csv's columns and a checkpoint's identity check
/// read, so that a new field of a run's description is a new column without further code.
pub fn flatten_json(value: &serde_json::Value) -> Vec<(String, serde_json::Value)> {
    fn walk(prefix: &str, value: &serde_json::Value, out: &mut Vec<(String, serde_json::Value)>) {
        match value {
            serde_json::Value::Object(map) => {
                for (key, child) in map {
                    let path = if prefix.is_empty() {
                        key.clone()
                    } else {
                        format!("{prefix}.{key}")
                    };
                    walk(&path, child, out);
                }
            }
            leaf => out.push((prefix.to_string(), leaf.clone())),
        }
    }
    let mut out = Vec::new();
    walk("", value, &mut out);
    out
}

/// The first leaf (in `ours`' order) where `ours` and `theirs` differ, as "key X there, Y here"
/// ("missing" where `theirs` lacks it): how a checkpoint or a run folder of another run says why.
pub fn first_difference(ours: &serde_json::Value, theirs: &serde_json::Value) -> Option<String> {
    let theirs: std::collections::HashMap<String, serde_json::Value> =
        flatten_json(theirs).into_iter().collect();
    flatten_json(ours).into_iter().find_map(|(key, value)| {
        let there = theirs.get(&key);
        (there != Some(&value)).then(|| {
            let there = there.map_or("missing".into(), |v| v.to_string());
            format!("{key} {there} there, {value} here")
        })
    })
}

/// A short hex digest of a value's JSON: names and keys that change whenever the value does.
pub fn json_digest(value: &impl Serialize) -> Result<String> {
    use sha2::Digest;
    let json = serde_json::to_vec(value).context("serialising a key")?;
    Ok(hex(&sha2::Sha256::digest(&json)))
}

/// Lower-case hex of `bytes`, as digests are written everywhere in the crate.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(2 * bytes.len()), |mut out, b| {
            let _ = write!(out, "{b:02x}");
            out
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Written files are as readable as a plain file (0644 less the umask), not tempfile's 0600:
    /// results and caches on a cluster are read by other users.
    #[cfg(target_os = "linux")]
    #[test]
    fn written_files_are_readable_by_others_as_the_umask_allows() {
        use std::os::unix::fs::PermissionsExt;
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let umask = status
            .lines()
            .find_map(|l| l.strip_prefix("Umask:"))
            .map(|m| u32::from_str_radix(m.trim(), 8).unwrap())
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let json = dir.path().join("a.json");
        write_json(&json, &1).unwrap();
        let png = dir.path().join("b.png");
        produce_atomic(&png, |tmp| Ok(std::fs::write(tmp, b"x")?)).unwrap();
        for path in [json, png] {
            let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o644 & !umask, "{}", path.display());
        }
    }

    #[test]
    fn failed_writes_leave_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.json");
        let err = write_atomic(&path, |w| {
            w.write_all(b"{\"half\":")?;
            bail!("interrupted")
        });
        assert!(err.is_err());
        assert!(!path.exists());
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "temporary file left behind"
        );
        write_json(&path, &serde_json::json!({"ok": true})).unwrap();
        assert!(
            std::fs::read_to_string(&path)
                .unwrap()
                .contains("\"ok\": true")
        );
    }

    #[test]
    fn ensure_dir_rejects_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, "x").unwrap();
        assert!(
            ensure_dir(&file)
                .unwrap_err()
                .to_string()
                .contains("not a directory")
        );
        ensure_dir(&dir.path().join("a/b")).unwrap();
    }
}
