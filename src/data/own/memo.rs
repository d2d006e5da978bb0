//! Values computed at most once per key within a process: an `hf:` source's resolved files and
//! a source's content digest.

use crate::data::files::Result;

/// Values computed at most once per key within a process. A lock a panicking holder poisoned is
/// taken over: the map only ever holds whole entries.
pub(super) struct Memo<K, V>(
    std::sync::OnceLock<std::sync::Mutex<std::collections::HashMap<K, V>>>,
);

impl<K: Eq + std::hash::Hash, V: Clone> Memo<K, V> {
    pub(super) const fn new() -> Self {
        Self(std::sync::OnceLock::new())
    }

    pub(super) fn get_or_try(&self, key: K, compute: impl FnOnce() -> Result<V>) -> Result<V> {
        let map = self.0.get_or_init(Default::default);
        let lock = || {
            map.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        };
        if let Some(value) = lock().get(&key) {
            return Ok(value.clone());
        }
        let value = compute()?;
        lock().insert(key, value.clone());
        Ok(value)
    }
}
