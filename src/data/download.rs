//! One file over HTTP, as a flaky network delivers it: into `<name>.part` beside the target,
//! resumed with a Range request after a dropped connection or a killed process, retried with
//! back-off on transient failures (connection errors, 5xx, stalls), and checked in full against
//! the manifest before it takes the target's name. Each URL's outcome is kept, so that a failure
//! says what happened where.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};

use super::manifest::{FileStatus, ManifestFile, check_file};

/// Seconds without a byte after which a request is given up: before the first byte (the URL is
/// then abandoned) or between two (the transfer is resumed by another try) [default: 30].
pub const STALL_SECS_ENV: &str = "BENIGN_DOWNLOAD_STALL_SECS";

/// Tries per URL; a try resumes where the last one stopped.
const TRIES: u32 = 3;

/// The pause before try k (k ≥ 1): 1 s, 2 s, ...
fn back_off(k: u32) -> Duration {
    Duration::from_secs(u64::from(k))
}

fn stall() -> Duration {
    std::env::var(STALL_SECS_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .map_or(Duration::from_secs(30), Duration::from_secs_f64)
}

pub fn agent() -> ureq::Agent {
    builder().build()
}

/// [`agent`] without following redirects (to read a redirect's own headers).
pub fn agent_without_redirects() -> ureq::Agent {
    builder().redirects(0).build()
}

fn builder() -> ureq::AgentBuilder {
    ureq::AgentBuilder::new()
        // Offline, name resolution or connection fails at once; a dead route times out quickly.
        .timeout_connect(Duration::from_secs(10))
        // Each read, the response head included: the first-byte and the stall timeout.
        .timeout_read(stall())
}

/// The partial download of `target`: `<dir>/.<name>.part`.
pub fn part_path(target: &Path) -> PathBuf {
    let name = target
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    target.with_file_name(format!(".{name}.part"))
}

/// Why one try at one URL failed.
enum Failure {
    /// Worth another try at the same URL (the connection dropped, 5xx, a stall).
    Transient(String),
    /// Not at this URL (404 and other 4xx, a corrupt file): the next URL.
    Final(String),
}

/// Downloads `file` into `target` from the first of `urls` that delivers it intact. The
/// partial file is locked while written, so two processes never write one file. On failure
/// returns one line per URL; a `.part` kept for a resumable failure is resumed next time.
pub fn download(
    agent: &ureq::Agent,
    urls: &[String],
    file: &ManifestFile,
    target: &Path,
) -> Result<(), Vec<String>> {
    let part_path = part_path(target);
    let part = crate::io::open_writable(
        OpenOptions::new().create(true).append(true).read(true),
        &part_path,
    )
    .map_err(|e| vec![format!("{e:#}")])?;
    part.lock()
        .map_err(|e| vec![format!("{}: cannot lock: {e}", part_path.display())])?;
    // Another process may have finished it while this one waited for the lock.
    if check_file(target, file).is_ok_and(|s| s.is_ok()) {
        let _ = std::fs::remove_file(&part_path);
        return Ok(());
    }
    let mut outcomes = Vec::new();
    for url in urls {
        match from_url(agent, url, file, &part, &part_path) {
            Ok(()) => {
                return std::fs::rename(&part_path, target).map_err(|e| {
                    vec![format!("{}: cannot move into place: {e}", target.display())]
                });
            }
            Err(why) => outcomes.push(format!("{url}: {why}")),
        }
        if crate::interrupt::requested().is_some() {
            break;
        }
    }
    // Nothing of an unreachable server is worth keeping; a partial body is kept for a resume.
    if part.metadata().is_ok_and(|m| m.len() == 0) {
        let _ = std::fs::remove_file(&part_path);
    }
    Err(outcomes)
}

/// Up to [`TRIES`] tries at `url`, each resuming the partial file; then the whole file checked.
fn from_url(
    agent: &ureq::Agent,
    url: &str,
    file: &ManifestFile,
    part: &File,
    part_path: &Path,
) -> Result<(), String> {
    let mut last = String::new();
    for k in 0..TRIES {
        if k > 0 {
            std::thread::sleep(back_off(k));
        }
        match one_try(agent, url, file, part) {
            Ok(()) => {}
            Err(Failure::Final(why)) => return Err(why),
            Err(Failure::Transient(why)) => {
                last = why;
                continue;
            }
        }
        return match check_file(part_path, file).map_err(|e| format!("{e:#}"))? {
            FileStatus::Ok => Ok(()),
            status => {
                // Corrupt: start again from nothing at the next URL.
                part.set_len(0).map_err(|e| e.to_string())?;
                Err(format!("corrupt download ({status})"))
            }
        };
    }
    Err(format!("{last} (after {TRIES} tries)"))
}

/// One request: the rest of the file after the bytes already in `part`.
fn one_try(
    agent: &ureq::Agent,
    url: &str,
    file: &ManifestFile,
    part: &File,
) -> Result<(), Failure> {
    let io = |e: std::io::Error| Failure::Final(format!("writing the partial file: {e}"));
    let have = part.metadata().map_err(io)?.len();
    if file.bytes.is_some_and(|b| have >= b) {
        return Ok(()); // complete: the caller checks it
    }
    match request_rest(agent, url, have)? {
        Some(response) => copy_body(response, file, part, have),
        // The server has nothing after `have`: what is there is checked as it is.
        None => Ok(()),
    }
}

/// The server's answer to a request for the bytes after `have`; `None` where it has none.
fn request_rest(
    agent: &ureq::Agent,
    url: &str,
    have: u64,
) -> Result<Option<ureq::Response>, Failure> {
    let mut request = agent.get(url);
    if have > 0 {
        request = request.set("Range", &format!("bytes={have}-"));
    }
    match request.call() {
        Ok(r) => Ok(Some(r)),
        Err(ureq::Error::Status(code, r)) if code >= 500 || code == 429 => Err(Failure::Transient(
            format!("HTTP {code} {}", r.status_text()),
        )),
        Err(ureq::Error::Status(416, _)) if have > 0 => Ok(None),
        Err(ureq::Error::Status(code, r)) => {
            Err(Failure::Final(format!("HTTP {code} {}", r.status_text())))
        }
        Err(ureq::Error::Transport(t)) => {
            use ureq::ErrorKind::{ConnectionFailed, Dns, Io};
            let why = t.to_string();
            Err(match t.kind() {
                // Offline or no server: another try would fail alike.
                Dns | ConnectionFailed => Failure::Final(format!("unreachable: {why}")),
                // A server that accepted the connection and says nothing: not worth the wait
                // again.
                Io if why.contains("timed out") => Failure::Final(format!(
                    "no answer within {:.0} s ({STALL_SECS_ENV})",
                    stall().as_secs_f64()
                )),
                _ => Failure::Transient(format!("failed: {why}")),
            })
        }
    }
}

/// The response's body appended to `part` (or written over it where the server sends the whole
/// file), with a progress bar; a stop or a cut transfer keeps what came.
fn copy_body(
    response: ureq::Response,
    file: &ManifestFile,
    part: &File,
    have: u64,
) -> Result<(), Failure> {
    let io = |e: std::io::Error| Failure::Final(format!("writing the partial file: {e}"));
    let resumed = response.status() == 206;
    if !resumed {
        // The server sends the whole file: start over.
        part.set_len(0).map_err(io)?;
    }
    let start = if resumed { have } else { 0 };
    let expected = response
        .header("Content-Length")
        .and_then(|l| l.parse::<u64>().ok())
        .map(|l| start + l)
        .or(file.bytes);
    let mut body = response.into_reader();
    let mut writer = part;
    writer.seek(std::io::SeekFrom::End(0)).map_err(io)?;
    let name = Path::new(&file.path)
        .file_name()
        .map_or(file.path.clone(), |n| n.to_string_lossy().into_owned());
    let bar = crate::progress_bar::byte_bar(expected.unwrap_or(0), &name);
    bar.inc(start);
    let mut got = start;
    let mut buf = vec![0u8; 1 << 16];
    let started = Instant::now();
    loop {
        if let Some(stop) = crate::interrupt::requested() {
            bar.abandon();
            writer.flush().map_err(io)?;
            return Err(Failure::Final(format!(
                "{stop} after {got} bytes; the partial file is kept and the next fetch resumes it"
            )));
        }
        let read = match body.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) => {
                bar.abandon();
                let at = format!("after {got} of {} bytes", expected.unwrap_or(0));
                return Err(Failure::Transient(format!("transfer cut {at}: {e}")));
            }
        };
        writer.write_all(&buf[..read]).map_err(io)?;
        got += read as u64;
        bar.inc(read as u64);
    }
    writer.flush().map_err(io)?;
    bar.finish_and_clear();
    if let Some(expected) = expected.filter(|&e| got < e) {
        return Err(Failure::Transient(format!(
            "connection closed after {got} of {expected} bytes ({:.0} s)",
            started.elapsed().as_secs_f64()
        )));
    }
    Ok(())
}

/// Removes what a killed fetch left in `dir` that nothing resumes: unpacking folders, and the
/// temporary downloads of earlier versions. Called while the folder's lock is held.
pub fn sweep(dir: &Path) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if name.starts_with(".unpack-") && path.is_dir() {
            std::fs::remove_dir_all(&path)
                .with_context(|| format!("{}: cannot remove", path.display()))?;
        } else if name.starts_with(".download-") && path.is_file() {
            std::fs::remove_file(&path)
                .with_context(|| format!("{}: cannot remove", path.display()))?;
        }
    }
    Ok(())
}

/// The dataset folder locked for the whole fetch: fetches of one folder run one at a time (the
/// lock is the folder's own, so nothing is left behind to clean).
pub fn lock_dir(dir: &Path) -> Result<File> {
    let handle = File::open(dir).with_context(|| format!("{}: cannot open", dir.display()))?;
    handle
        .lock()
        .map_err(|e| anyhow!("{}: cannot lock: {e}", dir.display()))?;
    Ok(handle)
}
