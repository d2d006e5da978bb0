//! What this process may still take from the machine: memory (the tightest of the machine's
//! `MemAvailable`, the cgroup's `memory.max` and the process's `RLIMIT_AS` / `RLIMIT_DATA`), and
//! open files (`RLIMIT_NOFILE` less what is open). Commands size their work by these before they
//! start it, so that a big request is refused or split in one line rather than aborted midway.

use std::path::Path;

/// Memory a run may use, and where that number comes from.
#[derive(Clone, Debug, PartialEq)]
pub struct Available {
    pub bytes: f64,
    pub source: String,
}

/// Used when none of the limits can be read (not Linux).
const FALLBACK_CAP_GIB: u64 = 256;

impl Available {
    /// The tightest of `MemAvailable` in /proc/meminfo, this process's cgroup (v2) `memory.max`
    /// (Slurm and containers) and the room left under `RLIMIT_AS` and `RLIMIT_DATA` (`ulimit -v`,
    /// `ulimit -d`); a fixed cap where none can be read.
    pub fn now() -> Self {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let candidates = [
            std::fs::read_to_string("/proc/meminfo")
                .ok()
                .and_then(|text| kib_field(&text, "MemAvailable:"))
                .map(|bytes| (bytes, "MemAvailable in /proc/meminfo".to_string())),
            cgroup_limit().map(|bytes| (bytes, "the cgroup's memory.max".to_string())),
            rlimit_room(libc::RLIMIT_AS, kib_field(&status, "VmSize:")).map(|bytes| {
                (
                    bytes,
                    "the room left under RLIMIT_AS (ulimit -v)".to_string(),
                )
            }),
            rlimit_room(libc::RLIMIT_DATA, kib_field(&status, "VmData:")).map(|bytes| {
                (
                    bytes,
                    "the room left under RLIMIT_DATA (ulimit -d)".to_string(),
                )
            }),
        ];
        candidates
            .into_iter()
            .flatten()
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .map_or_else(
                || Available {
                    bytes: (FALLBACK_CAP_GIB << 30) as f64,
                    source: format!(
                        "a fixed cap of {FALLBACK_CAP_GIB} GiB: no memory limit could be read"
                    ),
                },
                |(bytes, source)| Available { bytes, source },
            )
    }
}

/// `<name>   123456 kB` in a /proc file → bytes.
fn kib_field(text: &str, name: &str) -> Option<f64> {
    let line = text.lines().find_map(|l| l.strip_prefix(name))?;
    let kb: f64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    Some(kb * 1024.0)
}

/// `memory.max` of this process's cgroup v2, when it is a number (not "max").
fn cgroup_limit() -> Option<f64> {
    let membership = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = membership.lines().find_map(|l| l.strip_prefix("0::"))?;
    let limit = Path::new("/sys/fs/cgroup")
        .join(path.trim().trim_start_matches('/'))
        .join("memory.max");
    std::fs::read_to_string(limit).ok()?.trim().parse().ok()
}

/// The soft limit `resource`, when finite.
fn soft_limit(resource: libc::__rlimit_resource_t) -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given, which lives for the call.
    let read = unsafe { libc::getrlimit(resource, &mut limit) } == 0;
    (read && limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur)
}

/// What is left under the address-space limit `resource` beyond `used` bytes.
fn rlimit_room(resource: libc::__rlimit_resource_t, used: Option<f64>) -> Option<f64> {
    let limit = soft_limit(resource)? as f64;
    Some((limit - used.unwrap_or(0.0)).max(0.0))
}

/// Files this process may still open: `RLIMIT_NOFILE`'s soft limit less the descriptors open
/// now; `None` where either cannot be read.
pub fn open_files_room() -> Option<usize> {
    let limit = soft_limit(libc::RLIMIT_NOFILE)?;
    let open = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
    Some(limit.saturating_sub(open) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_fields_are_read_in_bytes() {
        let text = "MemTotal:       24000000 kB\nMemFree:  1 kB\nMemAvailable:   2048 kB\n";
        assert_eq!(kib_field(text, "MemAvailable:"), Some(2048.0 * 1024.0));
        assert_eq!(kib_field("MemTotal: 1 kB\n", "MemAvailable:"), None);
        assert!(Available::now().bytes > 0.0);
        assert!(open_files_room().is_some_and(|room| room > 0));
    }
}
