//! Files: every input opened the one way ([`open_input`]: a regular file, of a size its format
//! allows, opened without blocking), and every output written whole or not at all (temp file in
//! the same folder, then rename), so an interrupted run never leaves a file that looks finished.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::Serialize;

/// Sizes input formats may take, for [`open_input`]'s `limit`: what a reader holds in memory is
/// bounded by these, whatever lies at the path.
pub mod limits {
    /// A small JSON or TOML file: a configuration, a sidecar, a manifest.
    pub const SMALL_TEXT: u64 = 64 << 20;
    /// A data file read whole (a CSV, a label file, a class-name file, an archive of labels).
    pub const DATA_FILE: u64 = 4 << 30;
    /// A tokenizer's `tokenizer.json`.
    pub const TOKENIZER: u64 = 256 << 20;
    /// Safetensors: backbone weights, checkpoints, cache shards (mapped or read).
    pub const TENSORS: u64 = 64 << 30;
}

/// What a path that is not a regular file is, in words ("a FIFO", "a character device", …).
fn not_a_file(kind: &std::fs::FileType) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    Some(if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_file() {
        return None;
    } else {
        "not a regular file"
    })
}

/// The one way this crate opens an input: `path` must be a regular file (after following links)
/// of at most `limit` bytes. It is opened without blocking, so that a FIFO put in its place
/// cannot hang the open (a signal could not end it), and checked again once open. The error
/// names the file and what it is instead. Returns the file and its length.
pub fn open_input(path: &Path, limit: u64) -> Result<(std::fs::File, u64)> {
    use std::os::unix::fs::OpenOptionsExt;
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            bail!(
                "{}: is a loop of symbolic links, not a file",
                path.display()
            )
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            match std::fs::symlink_metadata(path) {
                Ok(_) => bail!(
                    "{}: is a symbolic link to nothing (its target does not exist)",
                    path.display()
                ),
                Err(_) => bail!("{}: does not exist", path.display()),
            }
        }
        Err(e) => return Err(e).with_context(|| format!("{}: cannot read", path.display())),
    };
    check_input(path, &meta, limit)?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .with_context(|| format!("{}: cannot open", path.display()))?;
    // What was opened is what was checked (the path may have been replaced in between).
    let meta = file
        .metadata()
        .with_context(|| format!("{}: cannot read", path.display()))?;
    check_input(path, &meta, limit)?;
    Ok((file, meta.len()))
}

/// Opens `path` for writing with `options`, without blocking (a FIFO in its place would block
/// an `open(2)` for writing until a reader came, and no signal could end the wait), and only if
/// what was opened is a regular file.
pub fn open_writable(options: &mut std::fs::OpenOptions, path: &Path) -> Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    // Named for what it is, where the open itself would only say ENXIO (a FIFO without reader).
    if let Ok(meta) = std::fs::metadata(path)
        && let Some(what) = not_a_file(&meta.file_type())
    {
        bail!("{}: is {what}, not a regular file", path.display());
    }
    let file = options
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .with_context(|| format!("{}: cannot open", path.display()))?;
    let meta = file
        .metadata()
        .with_context(|| format!("{}: cannot read", path.display()))?;
    if let Some(what) = not_a_file(&meta.file_type()) {
        bail!("{}: is {what}, not a regular file", path.display());
    }
    Ok(file)
}

fn check_input(path: &Path, meta: &std::fs::Metadata, limit: u64) -> Result<()> {
    if let Some(what) = not_a_file(&meta.file_type()) {
        bail!("{}: is {what}, not a regular file", path.display());
    }
    if meta.len() > limit {
        bail!(
            "{}: {} bytes, more than the {} a file of its kind may hold",
            path.display(),
            meta.len(),
            limit
        );
    }
    Ok(())
}

/// Whether anything is at `path` (a file, a FIFO, a dangling link…): an optional input that is
/// present is read, and refused if it cannot be, rather than taken for absent.
pub fn is_present(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok()
}

/// The whole of input file `path` ([`open_input`]), at most `limit` bytes.
pub fn read_input(path: &Path, limit: u64) -> Result<Vec<u8>> {
    let (file, len) = open_input(path, limit)?;
    let mut bytes = Vec::with_capacity(len as usize);
    // A file that grows while it is read stops at the limit, not at the machine's memory.
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("{}: cannot read", path.display()))?;
    if bytes.len() as u64 > limit {
        bail!(
            "{}: grew past the {limit} bytes a file of its kind may hold while it was read",
            path.display()
        );
    }
    Ok(bytes)
}

/// [`read_input`] as UTF-8 text.
pub fn read_input_text(path: &Path, limit: u64) -> Result<String> {
    String::from_utf8(read_input(path, limit)?)
        .with_context(|| format!("{}: not UTF-8 text", path.display()))
}

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
        open_writable(
            std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true),
            path,
        )
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
    // A library that writes its own new file in the temporary's place (safetensors does, 0600)
    // would leave a cache or a checkpoint that a cluster's other users cannot read.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = 0o644 & !process_umask();
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(mode))
            .with_context(|| format!("{}: cannot set its permissions", path.display()))?;
    }
    tmp.persist(path)
        .with_context(|| format!("{}: cannot move into place", path.display()))?;
    Ok(())
}

/// The process's umask, read where it does not change it (`/proc/self/status`); 022 where that
/// is not readable.
fn process_umask() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|l| l.starts_with("Umask:"))?;
            u32::from_str_radix(line.trim_start_matches("Umask:").trim(), 8).ok()
        })
        .unwrap_or(0o022)
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

/// [`as_string`] for an optional value: absent or null is `None`.
pub mod as_string_opt {
    use std::fmt::Display;
    use std::str::FromStr;

    pub fn deserialize<'de, T, D>(d: D) -> Result<Option<T>, D::Error>
    where
        T: FromStr,
        T::Err: Display,
        D: serde::Deserializer<'de>,
    {
        let text = <Option<String> as serde::Deserialize>::deserialize(d)?;
        text.map(|t| t.parse().map_err(serde::de::Error::custom))
            .transpose()
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

    /// A FIFO where a lock file or a download's part file goes is refused at once: an `open(2)`
    /// for writing would wait for a reader for ever.
    #[test]
    fn a_fifo_to_write_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join(".lock");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if !made.is_ok_and(|s| s.success()) {
            eprintln!("skipped: no mkfifo");
            return;
        }
        let error = match FileLock::try_take(&fifo) {
            Err(e) => format!("{e:#}"),
            Ok(_) => panic!("a FIFO was taken for a lock file"),
        };
        assert!(error.contains("is a FIFO"), "{error}");
    }

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
        // The safetensors writer replaces the temporary file with one of its own (0600).
        let tensors = dir.path().join("c.safetensors");
        produce_atomic(&tensors, |tmp| {
            let zeros =
                candle_core::Tensor::zeros(1, candle_core::DType::F32, &candle_core::Device::Cpu)?;
            Ok(candle_core::safetensors::save(
                &std::collections::HashMap::from([("x".to_string(), zeros)]),
                tmp,
            )?)
        })
        .unwrap();
        for path in [json, png, tensors] {
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
