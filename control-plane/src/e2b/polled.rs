//! The buffers of envd's polled watchers (`CreateWatcher` / `GetWatcherEvents` /
//! `RemoveWatcher`, what the SDK's synchronous `watch_dir` uses), kept in this process (a replica
//! answers for the watchers it made). A buffer that fills between two polls fails the next poll
//! rather than losing events silently; a watch that ended (the sandbox gone, the directory
//! removed) fails it with the reason. `envd/watchers.rs` fills them.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use serde_json::Value;

use super::connect::{Code, RpcError};

/// Watchers kept at once (ended ones are dropped first to make room).
const MAX_WATCHERS: usize = 1024;
/// Events kept between two polls of one watcher.
pub const MAX_EVENTS: usize = 4096;

/// What a watcher's task has read and not yet been polled.
#[derive(Default)]
pub struct Buffer {
    pub events: VecDeque<Value>,
    pub overflowed: bool,
    pub ended: Option<RpcError>,
}

struct Watcher {
    sandbox: String,
    buffer: Arc<Mutex<Buffer>>,
    task: tokio::task::AbortHandle,
}

#[derive(Default)]
pub struct Watchers {
    inner: Mutex<HashMap<String, Watcher>>,
}

impl Drop for Watchers {
    fn drop(&mut self) {
        if let Ok(map) = self.inner.get_mut() {
            for w in map.values() {
                w.task.abort();
            }
        }
    }
}

pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Watchers {
    /// Keeps a new watcher of `sandbox` (its buffer, filled by `task`); its id.
    pub fn insert(
        &self,
        sandbox: &str,
        buffer: Arc<Mutex<Buffer>>,
        task: tokio::task::AbortHandle,
    ) -> Result<String, RpcError> {
        let watcher_id = {
            use rand::Rng;
            let bytes: [u8; 16] = rand::rng().random();
            bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
        };
        let mut map = lock(&self.inner);
        if map.len() >= MAX_WATCHERS {
            let ended: Vec<String> = map
                .iter()
                .filter(|(_, w)| lock(&w.buffer).ended.is_some())
                .map(|(k, _)| k.clone())
                .collect();
            for k in ended {
                map.remove(&k);
            }
        }
        if map.len() >= MAX_WATCHERS {
            return Err(RpcError::new(
                Code::ResourceExhausted,
                format!("{MAX_WATCHERS} watchers are open: remove some first"),
            ));
        }
        map.insert(
            watcher_id.clone(),
            Watcher {
                sandbox: sandbox.to_string(),
                buffer,
                task,
            },
        );
        Ok(watcher_id)
    }

    fn with<R>(
        &self,
        sandbox: &str,
        watcher: &str,
        f: impl FnOnce(&Watcher) -> R,
    ) -> Result<R, RpcError> {
        let map = lock(&self.inner);
        match map.get(watcher) {
            Some(w) if w.sandbox == sandbox => Ok(f(w)),
            _ => Err(RpcError::new(
                Code::NotFound,
                format!("watcher {watcher:?} not found"),
            )),
        }
    }

    /// The events since the last poll.
    pub fn drain(&self, sandbox: &str, watcher: &str) -> Result<Vec<Value>, RpcError> {
        self.with(sandbox, watcher, |w| {
            let mut b = lock(&w.buffer);
            if b.overflowed {
                b.overflowed = false;
                b.events.clear();
                return Err(RpcError::new(
                    Code::ResourceExhausted,
                    "more events than the watcher keeps between two polls: some were lost",
                ));
            }
            if b.events.is_empty()
                && let Some(err) = &b.ended
            {
                return Err(err.clone());
            }
            Ok(b.events.drain(..).collect())
        })?
    }

    pub fn remove(&self, sandbox: &str, watcher: &str) -> Result<(), RpcError> {
        self.with(sandbox, watcher, |w| w.task.abort())?;
        lock(&self.inner).remove(watcher);
        Ok(())
    }
}
