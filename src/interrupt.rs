//! SIGTERM (what Slurm sends at a job's time limit, and `kill`'s default) and SIGINT (Ctrl-C) end
//! a run cleanly instead of killing it mid-write: the handler only records the signal; the long
//! loops ask [`check`] between steps (an extraction batch, a phase-1 epoch, a phase-2 epoch),
//! and phase 2 writes its checkpoint before it stops. The error then unwinds through the usual
//! drops, so every temporary file is removed (atomic writes' `.tmp-*` files, the cache's shard
//! being written), and the process exits with 128 + the signal's number, as a shell reports a
//! process killed by it. A second signal ends the process at once, for a step that takes too
//! long to reach a check.
//!
//! Only the binary installs the handlers ([`install`]); a library caller keeps its own.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use signal_hook::consts::{SIGINT, SIGTERM};

/// The signal that asked the process to stop, 0 while none has.
static REQUESTED: AtomicUsize = AtomicUsize::new(0);

/// A run stopped because the process was asked to (see the module's documentation).
#[derive(Debug, thiserror::Error)]
#[error("stopped by {}", signal_name(*.signal))]
pub struct Interrupted {
    pub signal: i32,
}

impl Interrupted {
    /// 128 + the signal's number: what a shell (and Slurm) reports for a process it ended.
    pub fn exit_code(&self) -> u8 {
        u8::try_from(128 + self.signal).unwrap_or(u8::MAX)
    }
}

fn signal_name(signal: i32) -> &'static str {
    match signal {
        SIGTERM => "SIGTERM",
        SIGINT => "SIGINT",
        _ => "a signal",
    }
}

/// Installs the handlers of SIGTERM and SIGINT: the first records the signal, the second exits.
pub fn install() -> anyhow::Result<()> {
    let armed = Arc::new(AtomicBool::new(false));
    for signal in [SIGTERM, SIGINT] {
        // The exit must be registered first: it acts on the flag as the earlier signal left it.
        signal_hook::flag::register_conditional_shutdown(signal, 128 + signal, Arc::clone(&armed))?;
        signal_hook::flag::register(signal, Arc::clone(&armed))?;
        // SAFETY: the action stores to an atomic, which is async-signal-safe.
        unsafe {
            signal_hook::low_level::register(signal, move || {
                REQUESTED.store(signal as usize, Ordering::SeqCst)
            })?;
        }
    }
    Ok(())
}

/// The signal that asked the process to stop, if one has.
pub fn requested() -> Option<Interrupted> {
    match REQUESTED.load(Ordering::SeqCst) {
        0 => None,
        signal => Some(Interrupted {
            signal: signal as i32,
        }),
    }
}

/// An [`Interrupted`] error once a signal asked the process to stop.
pub fn check() -> Result<(), Interrupted> {
    requested().map_or(Ok(()), Err)
}
